"""Where the step path's common case reads the state it checks before it writes a step.

:class:`StepStates` reads it with one statement per call (``step_sql.begin_state`` and
``end_state``): the server's in-process path, on either engine.

:class:`CachedStepStates` is for the step writer process (``runtime_service.step_process``,
SQLite): there, most calls follow the writer's own last write to the same run (a BeginStep,
then its EndStep, then the next BeginStep), so what the read would return is already known:
the run's counters, chain head and usage as this writer left them, the turn it saw open, the
step it began. It keeps that, and answers from it while nothing else has written to the
database: SQLite's ``PRAGMA data_version`` changes when another connection commits (the
server's leases, heartbeats, inputs, cancels, its own step path) and not when this one does
(https://sqlite.org/pragma.html#pragma_data_version). :meth:`CachedStepStates.validate`,
called first in each write transaction (which holds the write lock, so nothing else commits
until it ends), drops everything when the version moved; a batch that fails drops
everything too (its writes were rolled back). What it keeps is what the read would return,
so the checks (fence, turn, budgets, steers) run exactly as they do on a read; a request with
an idempotency key or a blob reference, or one for a run, turn or step it does not hold,
is read from the database as before.

:class:`PrefetchedStepStates` is for the step writer process on PostgreSQL, where every round
trip counts: it reads the state of every call of a batch in one pipelined round trip before
any of them runs (``runtime_service.step_process``), and answers each call from what was
read. Those reads all happen before the batch's writes, so a call on a run that an earlier
call of the same batch wrote to would see the run as it was: such a call is given no state,
and the server takes it once the batch has committed.
"""

from __future__ import annotations

from typing import Any

from agentrt_base.raw import RawTx, Statement
from runtime_service.store.ledger import StepRow
from runtime_service.store.step_sql import (
    BeginState,
    EndState,
    begin_state,
    begin_state_of,
    end_state,
    end_state_of,
    read_begin_state,
    read_end_state,
)

_DATA_VERSION = Statement("PRAGMA data_version")


class StepStates:
    """The state behind a BeginStep or EndStep, read from the database every time."""

    def begin(
        self, tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
    ) -> BeginState | None:
        return begin_state(tx, attempt_id, turn_id, idempotency_key, input_ref)

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndState | None:
        return end_state(tx, attempt_id, step_id, output_ref)

    def began(self, state: BeginState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        """The common path recorded ``step`` on the run of ``state`` (counters and chain head
        written back as ``event_sequence`` / ``event_hash``)."""

    def ended(self, state: EndState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        """The common path ended ``step`` (its usage added to the run, chain head written)."""


class CachedStepStates(StepStates):
    """:class:`StepStates` that answers from what this writer last wrote, while the database's
    ``data_version`` says no other connection has committed since (see the module doc).

    Only for a connection that is the sole user of this object, on SQLite.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._version: int | None = None
        #: Each run's state as a read would return it now (request-specific members aside).
        self._runs: dict[str, BeginState] = {}
        self._run_of_attempt: dict[str, str] = {}
        #: Turns seen, by id: (attempt id, status).
        self._turns: dict[str, tuple[str, str]] = {}
        #: Steps this writer began and has not seen end, by id (the rows as stored).
        self._started: dict[str, StepRow] = {}
        #: Calls answered from memory, and calls read from the database (for tests and stats).
        self.hits = 0
        self.misses = 0

    def validate(self, tx: RawTx) -> None:
        """Call first in each write transaction: forget everything if another connection
        committed since the last call."""
        row = tx.one(_DATA_VERSION, {})
        version = int(row[0]) if row is not None else None
        if version != self._version or version is None:
            self.clear()
            self._version = version

    def clear(self) -> None:
        """Forget everything (another connection wrote, or a batch was rolled back)."""
        self._runs.clear()
        self._run_of_attempt.clear()
        self._turns.clear()
        self._started.clear()

    def begin(
        self, tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
    ) -> BeginState | None:
        run_id = self._run_of_attempt.get(attempt_id)
        run = self._runs.get(run_id) if run_id is not None else None
        turn = self._turns.get(turn_id)
        if run is None or turn is None or idempotency_key or input_ref:
            self.misses += 1
            state = begin_state(tx, attempt_id, turn_id, idempotency_key, input_ref)
            if state is not None:
                self._remember(attempt_id, state)
                if state.turn_attempt_id is not None and state.turn_status is not None:
                    self._turns[turn_id] = (state.turn_attempt_id, state.turn_status)
            return state
        self.hits += 1
        # The same object each time: the caller reads it before the next call.
        run.turn_attempt_id, run.turn_status = turn
        run.keyed_step_id, run.input_blob = None, False
        return run

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndState | None:
        run_id = self._run_of_attempt.get(attempt_id)
        run = self._runs.get(run_id) if run_id is not None else None
        step = self._started.get(step_id)
        if run is None or step is None or output_ref:
            self.misses += 1
            return end_state(tx, attempt_id, step_id, output_ref)
        self.hits += 1
        return EndState(
            run_id=run.run_id,
            thread_id=run.thread_id,
            current_attempt_id=run.current_attempt_id,
            lease_epoch=run.lease_epoch,
            last_event_sequence=run.last_event_sequence,
            last_event_hash=run.last_event_hash,
            lease_expire_time=run.lease_expire_time,
            output_blob=False,
            step=step,
        )

    def began(self, state: BeginState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        # What step_sql.advance_run wrote.
        state.last_step_sequence = step.sequence
        state.step_count += 1
        state.last_event_sequence, state.last_event_hash = event_sequence, event_hash
        if len(self._started) >= self._limit:
            self.clear()  # steps begun and never ended: start over rather than grow
            return
        self._started[step.id] = step

    def ended(self, state: EndState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        self._started.pop(step.id, None)
        run = self._runs.get(state.run_id)
        if run is not None:
            # What step_sql.add_usage wrote (the same additions, in the same order).
            run.input_tokens += step.input_tokens
            run.output_tokens += step.output_tokens
            run.cost_usd += step.cost_usd
            run.last_event_sequence, run.last_event_hash = event_sequence, event_hash

    def _remember(self, attempt_id: str, state: BeginState) -> None:
        if len(self._runs) >= self._limit or len(self._turns) >= self._limit:
            self.clear()
        self._runs[state.run_id] = state
        self._run_of_attempt[attempt_id] = state.run_id


#: A BeginStep's state depends on (attempt, turn, idempotency key, input ref); an EndStep's
#: on (attempt, step, output ref).
_BeginKey = tuple[str, str, str, str]
_EndKey = tuple[str, str, str]


class PrefetchedStepStates(StepStates):
    """:class:`StepStates` answering from rows read ahead for a batch (see the module doc).

    Per batch: :meth:`reset`; in one pipeline, :meth:`read_begin` or :meth:`read_end` for each
    call; :meth:`collect`; then run the calls.
    """

    def __init__(self) -> None:
        self._begins: dict[_BeginKey, BeginState | None] = {}
        self._ends: dict[_EndKey, EndState | None] = {}
        #: Reads sent and not yet collected: (the BeginStep key or None, the EndStep key or
        #: None, the read's driver cursor).
        self._sent: list[tuple[_BeginKey | None, _EndKey | None, Any]] = []
        #: Runs a call of this batch wrote to.
        self._written: set[str] = set()

    def reset(self) -> None:
        self._begins.clear()
        self._ends.clear()
        self._sent.clear()
        self._written.clear()

    def read_begin(
        self, tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
    ) -> None:
        """Send the state read of a BeginStep (its row is taken by :meth:`collect`)."""
        key = (attempt_id, turn_id, idempotency_key, input_ref)
        self._sent.append((key, None, read_begin_state(tx, *key)))

    def read_end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> None:
        """Send the state read of an EndStep (its row is taken by :meth:`collect`)."""
        key = (attempt_id, step_id, output_ref)
        self._sent.append((None, key, read_end_state(tx, *key)))

    def collect(self, tx: RawTx) -> None:
        """Take the rows of the reads sent (after the pipeline they were sent in)."""
        for begin_key, end_key, cursor in self._sent:
            if begin_key is not None:
                self._begins[begin_key] = begin_state_of(tx, cursor.fetchone())
            elif end_key is not None:
                self._ends[end_key] = end_state_of(tx, cursor.fetchone())
        self._sent.clear()

    def begin(
        self, tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
    ) -> BeginState | None:
        state = self._begins[(attempt_id, turn_id, idempotency_key, input_ref)]
        return None if state is None or state.run_id in self._written else state

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndState | None:
        state = self._ends[(attempt_id, step_id, output_ref)]
        return None if state is None or state.run_id in self._written else state

    def began(self, state: BeginState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        self._written.add(state.run_id)

    def ended(self, state: EndState, step: StepRow, event_sequence: int, event_hash: str) -> None:
        self._written.add(state.run_id)
