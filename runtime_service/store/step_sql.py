"""The step path in plain SQL (``agentrt_base.raw``): what BeginStep and EndStep read and
write in their common case, a handful of statements each.

Only the storage side lives here. ``services/steps.py`` decides; when anything is out of the
ordinary (a lost fence, a budget reached, a denial to record, a steer to deliver, a repeated
key) it takes the ORM path instead, which stays the one place those cases are handled.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import attributes

from agentrt_base.db import UTCDateTime
from agentrt_base.raw import RawTx, Statement
from runtime_service.store.ledger import StepRow, StepUsageRow

_STEPS = cast(sa.Table, StepRow.__table__)
STEP_COLUMNS: tuple[str, ...] = tuple(c.key for c in _STEPS.columns)
_STEP_TIMES = tuple(c.key for c in _STEPS.columns if isinstance(c.type, UTCDateTime))
_STEP_BOOLS = tuple(c.key for c in _STEPS.columns if isinstance(c.type, sa.Boolean))
_STEP_COLUMNS_OF = operator.itemgetter(*STEP_COLUMNS)
_USAGE_COLUMNS = tuple(c.key for c in cast(sa.Table, StepUsageRow.__table__).columns)


def _insert(table: str, columns: tuple[str, ...]) -> Statement:
    return Statement(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
    )


_LOCK_RUN = Statement(
    "SELECT r.id FROM runtime_attempts a JOIN runtime_runs r ON r.id = a.run_id"
    " WHERE a.id = :attempt_id FOR UPDATE OF r"
)


def _lock_run(tx: RawTx, attempt_id: str) -> None:
    """Lock the run behind an attempt before reading its state.

    On PostgreSQL this is a statement of its own: under READ COMMITTED a statement that waited
    for a row lock re-reads the locked row but not its subqueries and joins, so reading the
    step, the idempotency key or the inputs in the locking statement could miss what the
    transaction it waited for committed. On SQLite the one writer already holds the database
    lock (``BEGIN IMMEDIATE``).
    """
    if tx.dialect_name == "postgresql":
        tx.execute(_LOCK_RUN, {"attempt_id": attempt_id})


INSERT_STEP = _insert("runtime_steps", STEP_COLUMNS)
INSERT_USAGE = _insert("runtime_step_usages", _USAGE_COLUMNS)


@dataclass(slots=True)
class BeginState:
    """What BeginStep needs to know before it records a step: the fence, the turn, the
    budgets and counters of the run, and whether anything calls for the ORM path."""

    run_id: str
    thread_id: str
    current_attempt_id: str
    lease_epoch: int
    agent_digest: str
    permission_ceiling: str
    max_steps: int
    max_model_tokens: int
    max_cost_usd: float
    input_tokens: int
    output_tokens: int
    cost_usd: float
    step_count: int
    last_step_sequence: int
    input_revision: int
    last_event_sequence: int
    last_event_hash: str
    lease_expire_time: dt.datetime
    turn_attempt_id: str | None
    turn_status: str | None
    pending_steers: int
    #: A step of the run already begun with the request's idempotency key (or None).
    keyed_step_id: str | None
    #: The request's input_ref names a stored blob.
    input_blob: bool


BEGIN_STATE = Statement(
    "SELECT r.id, r.thread_id, r.current_attempt_id, r.lease_epoch, r.agent_digest,"
    " r.permission_ceiling, r.max_steps, r.max_model_tokens, r.max_cost_usd, r.input_tokens,"
    " r.output_tokens, r.cost_usd, r.step_count, r.last_step_sequence, r.input_revision,"
    " r.last_event_sequence, r.last_event_hash, a.lease_expire_time, t.attempt_id, t.status,"
    " (SELECT count(*) FROM runtime_inputs i"
    "   WHERE i.run_id = r.id AND i.status = 'PENDING' AND i.kind = 'STEER'),"
    " (SELECT s.id FROM runtime_steps s"
    "   WHERE s.run_id = r.id AND s.idempotency_key = :key AND s.idempotency_key != ''"
    "   LIMIT 1),"
    " (SELECT count(*) FROM runtime_blobs b WHERE b.digest = :input_ref)"
    " FROM runtime_attempts a JOIN runtime_runs r ON r.id = a.run_id"
    " LEFT JOIN runtime_turns t ON t.id = :turn_id"
    " WHERE a.id = :attempt_id"
)


def begin_state(
    tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
) -> BeginState | None:
    """The run (locked) behind the attempt, and the rest of BeginState, in one read."""
    with tx.pipeline():  # the lock and the read: one round trip on PostgreSQL
        row = read_begin_state(tx, attempt_id, turn_id, idempotency_key, input_ref).fetchone()
    return begin_state_of(tx, row)


def read_begin_state(
    tx: RawTx, attempt_id: str, turn_id: str, idempotency_key: str, input_ref: str
) -> Any:
    """Send :func:`begin_state`'s lock and read; returns the read's driver cursor (in a
    pipeline, its row arrives when the pipeline syncs): :func:`begin_state_of` reads it."""
    _lock_run(tx, attempt_id)
    return tx.execute(
        BEGIN_STATE,
        {
            "attempt_id": attempt_id,
            "turn_id": turn_id,
            "key": idempotency_key,
            "input_ref": input_ref,
        },
    )


def begin_state_of(tx: RawTx, row: Sequence[Any] | None) -> BeginState | None:
    """The BeginState in a row of :data:`BEGIN_STATE` (None: no such attempt)."""
    if row is None:
        return None
    values = list(row)
    values[17] = tx.read_time(values[17])
    values[22] = bool(values[22])
    return BeginState(*values)


def step_values(tx: RawTx, step: StepRow) -> dict[str, Any]:
    """A step's columns in the form the driver stores them."""
    state = attributes.instance_dict(step)
    values = {key: state[key] for key in STEP_COLUMNS}
    for key in _STEP_TIMES:
        values[key] = tx.time(values[key])
    return values


if TYPE_CHECKING:
    # For the type checker a record is a StepRow: it has exactly StepRow's columns as
    # attributes, of the same types, read and set the same way, and the mapped class has
    # nothing else (no relationships, no methods). What it is not is mapped: a session would
    # refuse it, and none is ever given one (the step path inserts and updates steps with
    # plain statements built from their columns).
    StepRecord = StepRow
else:

    class StepRecord:
        """A step's columns as plain instance attributes: what the step path builds, and
        what the step writer process keeps and reads back, never given to a session.

        StepRow's instrumented attributes cost ~0.5 us a read (a step's events, usage rows,
        statements and answer read 30-odd); these cost what a dict lookup does.
        """


def detached_step(values: dict[str, Any]) -> StepRow:
    """A step holding ``values``, which must be every column (``STEP_COLUMNS``): a
    :class:`StepRecord`, to read and fill in; never added to a session."""
    step = StepRecord()
    step.__dict__.update(values)
    return step


def step_tuple(step: StepRow) -> tuple[Any, ...]:
    """A step's columns, in ``STEP_COLUMNS`` order, as Python values (to pass it to another
    process: :func:`step_from_tuple` builds it again)."""
    columns: tuple[Any, ...] = _STEP_COLUMNS_OF(attributes.instance_dict(step))
    return columns


def step_from_tuple(values: tuple[Any, ...]) -> StepRow:
    return detached_step(dict(zip(STEP_COLUMNS, values, strict=True)))


def fill(step: StepRow, **values: Any) -> None:
    """Set columns of a step built by :func:`detached_step`."""
    attributes.instance_dict(step).update(values)


_ADVANCE_RUN = Statement(
    "UPDATE runtime_runs SET last_step_sequence = :sequence, step_count = :step_count,"
    " last_event_sequence = :event_sequence, last_event_hash = :event_hash WHERE id = :id"
)


def advance_run(
    tx: RawTx, run_id: str, sequence: int, step_count: int, event_sequence: int, event_hash: str
) -> None:
    """Write back a run's step counters and event-chain head after a step began."""
    tx.execute(
        _ADVANCE_RUN,
        {
            "id": run_id,
            "sequence": sequence,
            "step_count": step_count,
            "event_sequence": event_sequence,
            "event_hash": event_hash,
        },
    )


def insert_step(tx: RawTx, step: StepRow) -> None:
    tx.execute(INSERT_STEP, step_values(tx, step))


def insert_usages(tx: RawTx, rows: list[dict[str, Any]]) -> None:
    if rows:
        tx.execute_many(INSERT_USAGE, [{**r, "start_time": tx.time(r["start_time"])} for r in rows])


@dataclass(slots=True)
class EndState:
    """What EndStep needs: the fence, the run's event-chain head, and the step (or None)."""

    run_id: str
    thread_id: str
    current_attempt_id: str
    lease_epoch: int
    last_event_sequence: int
    last_event_hash: str
    lease_expire_time: dt.datetime
    output_blob: bool
    step: StepRow | None


_END_STATE = Statement(
    "SELECT r.id, r.thread_id, r.current_attempt_id, r.lease_epoch, r.last_event_sequence,"
    " r.last_event_hash, a.lease_expire_time,"
    " (SELECT count(*) FROM runtime_blobs b WHERE b.digest = :output_ref), "
    + ", ".join("s." + c for c in STEP_COLUMNS)
    + " FROM runtime_attempts a JOIN runtime_runs r ON r.id = a.run_id"
    " LEFT JOIN runtime_steps s ON s.id = :step_id"
    " WHERE a.id = :attempt_id"
)


def end_state(tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndState | None:
    """The run (locked) behind the attempt, and the step, in one read."""
    with tx.pipeline():  # the lock and the read: one round trip on PostgreSQL
        row = read_end_state(tx, attempt_id, step_id, output_ref).fetchone()
    return end_state_of(tx, row)


def read_end_state(tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> Any:
    """Send :func:`end_state`'s lock and read (as :func:`read_begin_state`)."""
    _lock_run(tx, attempt_id)
    return tx.execute(
        _END_STATE, {"attempt_id": attempt_id, "step_id": step_id, "output_ref": output_ref}
    )


def end_state_of(tx: RawTx, row: Sequence[Any] | None) -> EndState | None:
    """The EndState in a row of the end-state read (None: no such attempt)."""
    if row is None:
        return None
    step = None
    if row[8] is not None:
        values = dict(zip(STEP_COLUMNS, row[8:], strict=True))
        for key in _STEP_TIMES:
            values[key] = tx.read_time(values[key])
        for key in _STEP_BOOLS:
            values[key] = bool(values[key])
        step = detached_step(values)
    return EndState(
        run_id=row[0],
        thread_id=row[1],
        current_attempt_id=row[2],
        lease_epoch=row[3],
        last_event_sequence=row[4],
        last_event_hash=row[5],
        lease_expire_time=cast(dt.datetime, tx.read_time(row[6])),
        output_blob=bool(row[7]),
        step=step,
    )


_END_STEP = Statement(
    "UPDATE runtime_steps SET status = :status, end_time = :end_time, output_ref = :output_ref,"
    " summary = :summary, input_tokens = :input_tokens, output_tokens = :output_tokens,"
    " cost_usd = :cost_usd, reported_model_id = :reported_model_id,"
    " error_class = :error_class, error_message = :error_message, retryable = :retryable,"
    " side_effect = :side_effect WHERE id = :id"
)
_ADD_ATTEMPT_USAGE = Statement(
    "UPDATE runtime_attempts SET input_tokens = input_tokens + :input_tokens,"
    " output_tokens = output_tokens + :output_tokens, cost_usd = cost_usd + :cost_usd"
    " WHERE id = :id"
)
_ADD_RUN_USAGE = Statement(
    "UPDATE runtime_runs SET input_tokens = input_tokens + :input_tokens,"
    " output_tokens = output_tokens + :output_tokens, cost_usd = cost_usd + :cost_usd,"
    " last_event_sequence = :event_sequence, last_event_hash = :event_hash WHERE id = :id"
)


_END_COLUMNS = (
    "id",
    "status",
    "output_ref",
    "summary",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "reported_model_id",
    "error_class",
    "error_message",
    "retryable",
    "side_effect",
)


def end_step(tx: RawTx, step: StepRow) -> None:
    """Store an ended step's outcome (the columns EndStep sets)."""
    state = attributes.instance_dict(step)
    values = {key: state[key] for key in _END_COLUMNS}
    values["end_time"] = tx.time(state["end_time"])
    tx.execute(_END_STEP, values)


def add_usage(
    tx: RawTx,
    step: StepRow,
    run_id: str,
    event_sequence: int,
    event_hash: str,
) -> None:
    """Add a step's usage to its attempt and run; write back the run's event-chain head."""
    usage = {
        "input_tokens": step.input_tokens,
        "output_tokens": step.output_tokens,
        "cost_usd": step.cost_usd,
    }
    tx.execute(_ADD_ATTEMPT_USAGE, {**usage, "id": step.attempt_id})
    tx.execute(
        _ADD_RUN_USAGE,
        {**usage, "id": run_id, "event_sequence": event_sequence, "event_hash": event_hash},
    )
