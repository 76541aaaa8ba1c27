"""Where the step engine gets the views it decides on (``store/steps.py`` reads them).

:class:`StepStates` reads them with one statement per call: the server's in-process path, on
either engine, and the step writer process for anything the others below do not hold.

:class:`CachedStepStates` is for the step writer process on SQLite: there, most calls follow
the writer's own last write to the same run (a BeginStep, then its EndStep, then the next
BeginStep), so what the read would return is already known: the run's view as the last
decision applied left it (``store/steps.py`` writes counters, totals and chain head back into
the view it wrote from), the turn it saw open, the step it began. It keeps that, and answers
from it while nothing else has written to the database: SQLite's ``PRAGMA data_version``
changes when another connection commits (the server's leases, heartbeats, inputs, cancels,
its own step path) and not when this one does (https://sqlite.org/pragma.html#pragma_data_version).
:meth:`CachedStepStates.validate`, called first in each write transaction (which holds the
write lock, so nothing else commits until it ends), drops everything when the version moved;
a batch that fails drops everything too (its writes were rolled back). A request with an
idempotency key, a blob reference or a retry link, or one for a run, turn or step it does not
hold, is read from the database.

:class:`PrefetchedStepStates` is for the step writer process on PostgreSQL, where every round
trip counts: it reads the state of every call of a batch in one pipelined round trip before
any of them runs, and answers each call from what was read. A call on a run that an earlier
call of the same batch wrote to would see the run as it was: for such a call it has no view
(None), and the step writer runs it in a transaction of its own after the batch.
"""

from __future__ import annotations

from typing import Any

from agentrt_base.raw import RawTx, Statement
from runtime_service.records import Step
from runtime_service.step_rules import BeginView, EndView, PriorModelCall, RunView, StepRequest
from runtime_service.store.steps import (
    begin_view,
    end_view,
    read_begin,
    read_end,
    send_begin_read,
    send_end_read,
)

_DATA_VERSION = Statement("PRAGMA data_version")


class StepStates:
    """The views behind a BeginStep or EndStep, read from the database every time."""

    def begin(self, tx: RawTx, req: StepRequest) -> BeginView | None:
        """The view for ``req`` (None: not at hand on this transaction; see the module doc)."""
        return read_begin(tx, req)

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndView | None:
        return read_end(tx, attempt_id, step_id, output_ref)

    def wrote(self, run: RunView, step: Step) -> None:
        """A decision was applied to ``run``, leaving ``step`` as it now is."""


class CachedStepStates(StepStates):
    """:class:`StepStates` answering from what this writer last wrote, while the database's
    ``data_version`` says no other connection has committed since (see the module doc).

    Only for a connection that is the sole user of this object, on SQLite.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._version: int | None = None
        #: Each run's view as a read would return it now (kept current by the apply
        #: functions, which write into the view they apply to).
        self._runs: dict[str, RunView] = {}
        self._run_of_attempt: dict[str, str] = {}
        #: Turns seen, by id: (attempt id, status).
        self._turns: dict[str, tuple[str, str]] = {}
        #: Steps this writer began and has not seen end, by id.
        self._started: dict[str, Step] = {}
        #: Each attempt's latest MODEL_CALL step (None: it has none), where known: read with
        #: a MODEL_CALL's view, then kept by what this writer records and ends.
        self._model_calls: dict[str, PriorModelCall | None] = {}

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
        self._model_calls.clear()

    def begin(self, tx: RawTx, req: StepRequest) -> BeginView | None:
        run_id = self._run_of_attempt.get(req.attempt_id)
        run = self._runs.get(run_id) if run_id is not None else None
        turn = self._turns.get(req.turn_id)
        model_call = req.type == "MODEL_CALL"
        if (
            run is None
            or turn is None
            or req.idempotency_key
            or req.input_ref
            or req.retry_of_step_id
            or (model_call and req.attempt_id not in self._model_calls)
        ):
            view = read_begin(tx, req)
            # Kept by run, so only as read for its current attempt: a stale attempt's lease
            # and usage columns would otherwise stand in for the current one's.
            if view.run is not None and view.run.current_attempt_id == req.attempt_id:
                self._remember(req.attempt_id, view.run)
                if view.turn_attempt_id is not None and view.turn_status is not None:
                    self._turns[req.turn_id] = (view.turn_attempt_id, view.turn_status)
                if model_call:
                    self._model_calls[req.attempt_id] = view.last_model_call
            return view
        return BeginView(
            run,
            turn_attempt_id=turn[0],
            turn_status=turn[1],
            last_model_call=self._model_calls.get(req.attempt_id),
        )

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndView | None:
        run_id = self._run_of_attempt.get(attempt_id)
        run = self._runs.get(run_id) if run_id is not None else None
        step = self._started.get(step_id)
        if run is None or step is None or output_ref:
            return read_end(tx, attempt_id, step_id, output_ref)
        return EndView(run, step=step)

    def wrote(self, run: RunView, step: Step) -> None:
        if step.type == "MODEL_CALL":
            known = self._model_calls.get(step.attempt_id)
            # The run's latest step (one just recorded, or ended with nothing begun since) is
            # its attempt's latest model call; so is one ended that was known to be.
            if step.sequence == run.last_step_sequence or (
                known is not None and known.step_id == step.id
            ):
                self._model_calls[step.attempt_id] = PriorModelCall.of(step)
        if step.status != "STARTED":
            self._started.pop(step.id, None)
        elif len(self._started) >= self._limit:
            self.clear()  # steps begun and never ended: start over rather than grow
            return
        else:
            self._started[step.id] = step
        if self._runs.get(run.run_id) is not run:
            # Written through a view read for this call, not the one kept: the kept one is
            # behind now (an EndStep's view does not count steers, so it cannot replace it).
            self._runs.pop(run.run_id, None)

    def _remember(self, attempt_id: str, run: RunView) -> None:
        if (
            len(self._runs) >= self._limit
            or len(self._turns) >= self._limit
            or len(self._model_calls) >= self._limit
        ):
            self.clear()
        self._runs[run.run_id] = run
        self._run_of_attempt[attempt_id] = run.run_id


#: A BeginStep's view depends on (attempt, turn, idempotency key, input ref, retry link,
#: whether it is a model call); an EndStep's on (attempt, step, output ref).
_BeginKey = tuple[str, str, str, str, str, bool]
_EndKey = tuple[str, str, str]


def _begin_key(req: StepRequest) -> _BeginKey:
    return (
        req.attempt_id,
        req.turn_id,
        req.idempotency_key,
        req.input_ref,
        req.retry_of_step_id,
        req.type == "MODEL_CALL",
    )


class PrefetchedStepStates(StepStates):
    """:class:`StepStates` answering from rows read ahead for a batch (see the module doc).

    Per batch: :meth:`reset`; in one pipeline, :meth:`read_begin` or :meth:`read_end` for each
    call; :meth:`collect`; then run the calls.
    """

    def __init__(self) -> None:
        self._begins: dict[_BeginKey, BeginView] = {}
        self._ends: dict[_EndKey, EndView] = {}
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

    def read_begin(self, tx: RawTx, req: StepRequest) -> None:
        """Send the view read of a BeginStep (its row is taken by :meth:`collect`)."""
        self._sent.append((_begin_key(req), None, send_begin_read(tx, req)))

    def read_end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> None:
        """Send the view read of an EndStep (its row is taken by :meth:`collect`)."""
        key = (attempt_id, step_id, output_ref)
        self._sent.append((None, key, send_end_read(tx, *key)))

    def collect(self, tx: RawTx) -> None:
        """Take the rows of the reads sent (after the pipeline they were sent in)."""
        for begin_key, end_key, cursor in self._sent:
            if begin_key is not None:
                self._begins[begin_key] = begin_view(
                    tx, cursor.fetchone(), model_call=begin_key[-1]
                )
            elif end_key is not None:
                self._ends[end_key] = end_view(tx, cursor.fetchone())
        self._sent.clear()

    def begin(self, tx: RawTx, req: StepRequest) -> BeginView | None:
        view = self._begins.get(_begin_key(req))
        return None if view is None or self._stale(view.run) else view

    def end(self, tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndView | None:
        view = self._ends.get((attempt_id, step_id, output_ref))
        return None if view is None or self._stale(view.run) else view

    def _stale(self, run: RunView | None) -> bool:
        return run is not None and run.run_id in self._written

    def wrote(self, run: RunView, step: Step) -> None:
        self._written.add(run.run_id)
