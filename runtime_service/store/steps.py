"""The step path's storage, in plain SQL (``agentrt_base.raw``): what BeginStep and EndStep
read (one statement each, per engine) and how every decision of ``step_rules`` is applied.

There is one way to write a step: :func:`apply_record` (a new step of any kind: started,
denied, failed, an approval request, with the steers it consumes), :func:`apply_end`,
:func:`load_reused`. The server's in-process path and the step writer process both call
these, through ``step_engine``. Run totals and the event-chain head are computed once, in
Python, from the view that was read under the run's lock, and written as values; the view is
updated with them, so it stays what a read would return now (``store/step_states.py`` keeps
it between calls in the step writer).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa

from agentrt.runtime.v1 import event_pb2
from agentrt_base.db import UTCDateTime
from agentrt_base.raw import RawTx, Statement
from agentrt_core.usage_rows import reported_usage_rows, usage_rows
from runtime_service import events, notify, step_events
from runtime_service.records import INPUT_FIELDS, STEP_FIELDS, Input, Step, new_step
from runtime_service.step_decide import counts
from runtime_service.step_rules import (
    END_FIELDS,
    BeginView,
    End,
    EndView,
    PriorModelCall,
    Record,
    RunView,
    StepRequest,
    dumps,
    failed_in_a_row,
)
from runtime_service.store import inputs
from runtime_service.store.ledger import MODEL_CALLS, InputRow, StepRow, StepUsageRow

_STEPS = cast(sa.Table, StepRow.__table__)
STEP_COLUMNS: tuple[str, ...] = tuple(c.key for c in _STEPS.columns)
if set(STEP_COLUMNS) != set(STEP_FIELDS):
    # One list of a step's fields: the table's and the record's must be the same.
    raise RuntimeError(
        f"runtime_steps and records.Step disagree: {sorted(set(STEP_COLUMNS) ^ set(STEP_FIELDS))}"
    )
_STEP_TIMES = tuple(c.key for c in _STEPS.columns if isinstance(c.type, UTCDateTime))
_STEP_BOOLS = tuple(c.key for c in _STEPS.columns if isinstance(c.type, sa.Boolean))
_USAGE_COLUMNS = tuple(c.key for c in cast(sa.Table, StepUsageRow.__table__).columns)
_INPUT_TABLE = cast(sa.Table, InputRow.__table__)
if not set(INPUT_FIELDS) <= {c.key for c in _INPUT_TABLE.columns}:
    raise RuntimeError("records.Input names a field runtime_inputs does not have")


class NeedsRead(Exception):
    """The call cannot be applied on a transaction that defers its writes (its state was not
    read ahead, or applying it reads): run it on one that reads (``step_process``)."""


def _insert(table: str, columns: tuple[str, ...]) -> Statement:
    return Statement(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
    )


_INSERT_STEP = _insert("runtime_steps", STEP_COLUMNS)
_INSERT_USAGE = _insert("runtime_step_usages", _USAGE_COLUMNS)

# -- reading ---------------------------------------------------------------------------

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


#: RunView's columns (``{steers}``: how its pending steers are counted).
_RUN_VIEW = (
    "r.id, r.thread_id, r.status, r.current_attempt_id, r.lease_epoch, r.agent_digest,"
    " r.permission_ceiling, r.max_steps, r.max_model_tokens, r.max_cost_usd, r.input_tokens,"
    " r.output_tokens, r.cost_usd, r.step_count, r.last_step_sequence, r.input_revision,"
    " r.last_event_sequence, r.last_event_hash, {steers}, a.status, a.lease_expire_time,"
    " a.lease_token_hash, a.input_tokens, a.output_tokens, a.cost_usd, a.failed_in_a_row,"
    " a.traceparent"
)
_RUN_VIEW_SIZE = 27
_LEASE_EXPIRE = 20
_PENDING_STEERS = (
    "(SELECT count(*) FROM runtime_inputs i"
    " WHERE i.run_id = r.id AND i.status = 'PENDING' AND i.kind = 'STEER')"
)
_FROM_ATTEMPT = " FROM runtime_attempts a JOIN runtime_runs r ON r.id = a.run_id"
#: Whether the run's namespace holds the blob a step names (``store.blobs.held``): a blob
#: only another namespace uploaded is missing here, as for ``store.blobs.require`` (else a
#: worker could learn that another tenant stores some content, and reference it).
_HELD = (
    "(SELECT count(*) FROM runtime_blob_namespaces bn"
    " WHERE bn.namespace = r.namespace AND bn.digest = :{ref})"
)
_BEGIN_COLUMNS = (
    "SELECT "
    + _RUN_VIEW.format(steers=_PENDING_STEERS)
    + ", t.attempt_id, t.status, "
    + _HELD.format(ref="input_ref")
    + ", (SELECT s.run_id FROM runtime_steps s WHERE s.id = :retry_of)"
)
_BEGIN_TURN = " LEFT JOIN runtime_turns t ON t.id = :turn_id"
#: A MODEL_CALL's view adds the attempt's latest MODEL_CALL step (``PriorModelCall``): the
#: one a fallback follows if it failed. max(sequence) is one probe of the partial index
#: holding only model calls (its condition repeated word for word, so both engines can prove
#: it applies); the step itself is then found by the run's (run_id, sequence) key.
_PRIOR_COLUMNS = ", m.id, m.status, m.error_class, m.candidate_name"
_PRIOR_SIZE = 4
_PRIOR_JOIN = (
    " LEFT JOIN runtime_steps m ON m.run_id = r.id AND m.sequence = (SELECT max(p.sequence)"
    " FROM runtime_steps p{indexed}"
    f" WHERE p.attempt_id = a.id AND p.{MODEL_CALLS})"
)
#: PostgreSQL: the latest row straight from the partial index (a backward scan, one row). The
#: join above, planned generically for a prepared statement on a table whose statistics lag
#: its growth, walked every step of the run and ran the max() for each: BeginStep's read
#: grew with the run (10 ms at 1,500 steps; the bench's pairs/s fell to half).
_PRIOR_JOIN_PG = (
    " LEFT JOIN LATERAL (SELECT p.id, p.status, p.error_class, p.candidate_name"
    f" FROM runtime_steps p WHERE p.attempt_id = a.id AND p.{MODEL_CALLS}"
    " ORDER BY p.sequence DESC LIMIT 1) m ON true"
)
#: With the step the idempotency key names (the run's latest with that key) and, for an
#: approval request, the tool call that followed its decision.
_KEYED_COLUMNS = (
    ", CASE WHEN k.type = 'APPROVAL_REQUEST' THEN (SELECT f.id FROM runtime_steps f"
    " WHERE f.run_id = r.id AND f.approval_step_id = k.id AND f.type = 'TOOL_CALL' LIMIT 1)"
    " END, " + ", ".join("k." + c for c in STEP_COLUMNS)
)
# The latest by max() over the key's partial index: ORDER BY sequence DESC LIMIT 1 had both
# engines walk the run's steps backwards through (run_id, sequence), and SQLite still prefers
# that index for max(sequence) unless told (INDEXED BY, SQLite only).
_KEYED_JOIN = (
    " LEFT JOIN runtime_steps k ON k.run_id = r.id AND k.sequence = (SELECT max(s.sequence)"
    " FROM runtime_steps s{keyed_index}"
    " WHERE s.run_id = r.id AND s.idempotency_key = :key AND s.idempotency_key != '')"
)


def _begin_statement(*, keyed: bool, model_call: bool) -> Statement:
    """The BeginStep read: the run view, the turn, the blob, the retry link; the attempt's
    latest model call (``model_call``); the keyed step (``keyed``)."""

    def sql(prior_join: str) -> str:
        return (
            _BEGIN_COLUMNS
            + (_PRIOR_COLUMNS if model_call else "")
            + (_KEYED_COLUMNS if keyed else "")
            + _FROM_ATTEMPT
            + _BEGIN_TURN
            + (prior_join if model_call else "")
            + (_KEYED_JOIN if keyed else "")
            + " WHERE a.id = :attempt_id"
        )

    return Statement(
        sql(_PRIOR_JOIN).format(
            indexed=" INDEXED BY ix_runtime_steps_attempt_id_model_calls",
            keyed_index=" INDEXED BY ix_runtime_steps_run_id_idempotency_key",
        ),
        postgresql=sql(_PRIOR_JOIN_PG).format(keyed_index=""),
    )


#: By (keyed, model call).
_BEGIN = {
    (keyed, model_call): _begin_statement(keyed=keyed, model_call=model_call)
    for keyed in (False, True)
    for model_call in (False, True)
}


def read_begin(tx: RawTx, req: StepRequest) -> BeginView:
    """What BeginStep decides on, the run locked first: one statement (and, on PostgreSQL,
    the lock in the same round trip)."""
    with tx.pipeline():
        cursor = send_begin_read(tx, req)
    return begin_view(tx, cursor.fetchone(), model_call=req.type == "MODEL_CALL")


def send_begin_read(tx: RawTx, req: StepRequest) -> Any:
    """Send :func:`read_begin`'s lock and read; returns the read's driver cursor (in a
    pipeline, its row arrives when the pipeline syncs): :func:`begin_view` reads it."""
    _lock_run(tx, req.attempt_id)
    params = {
        "attempt_id": req.attempt_id,
        "turn_id": req.turn_id,
        "input_ref": req.input_ref,
        "retry_of": req.retry_of_step_id,
    }
    statement = _BEGIN[bool(req.idempotency_key), req.type == "MODEL_CALL"]
    if req.idempotency_key:
        params["key"] = req.idempotency_key
    return tx.execute(statement, params)


def begin_view(tx: RawTx, row: Sequence[Any] | None, *, model_call: bool) -> BeginView:
    """The view in a row of :func:`send_begin_read`'s statement (``model_call``: it was read
    for a MODEL_CALL request, so it holds the attempt's latest model call)."""
    if row is None:
        return BeginView(None)
    n = _RUN_VIEW_SIZE
    view = BeginView(
        _run_view(tx, row),
        turn_attempt_id=row[n],
        turn_status=row[n + 1],
        input_blob=bool(row[n + 2]),
        retry_of_run_id=row[n + 3],
    )
    n += 4
    if model_call:
        if row[n] is not None:
            view.last_model_call = PriorModelCall(*row[n : n + _PRIOR_SIZE])
        n += _PRIOR_SIZE
    if len(row) > n:
        view.keyed_follower_id = row[n]
        view.keyed = _step_of_row(tx, row[n + 1 :])
    return view


def _run_view(tx: RawTx, row: Sequence[Any]) -> RunView:
    values = list(row[:_RUN_VIEW_SIZE])
    values[_LEASE_EXPIRE] = tx.read_time(values[_LEASE_EXPIRE])
    return RunView(*values)


def _step_of_row(tx: RawTx, columns: Sequence[Any]) -> Step | None:
    """The step in ``columns`` (``STEP_COLUMNS`` order, as the driver returns them)."""
    if columns[0] is None:
        return None
    values = dict(zip(STEP_COLUMNS, columns, strict=True))
    for key in _STEP_TIMES:
        values[key] = tx.read_time(values[key])
    for key in _STEP_BOOLS:
        values[key] = bool(values[key])
    return new_step(values)


_END = Statement(
    "SELECT "
    + _RUN_VIEW.format(steers="0")
    + ", "
    + _HELD.format(ref="output_ref")
    + ", "
    + ", ".join("s." + c for c in STEP_COLUMNS)
    + _FROM_ATTEMPT
    + " LEFT JOIN runtime_steps s ON s.id = :step_id"
    " WHERE a.id = :attempt_id"
)


def read_end(tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> EndView:
    """What EndStep decides on, the run locked first, in one statement."""
    with tx.pipeline():
        cursor = send_end_read(tx, attempt_id, step_id, output_ref)
    return end_view(tx, cursor.fetchone())


def send_end_read(tx: RawTx, attempt_id: str, step_id: str, output_ref: str) -> Any:
    """Send :func:`read_end`'s lock and read (as :func:`send_begin_read`)."""
    _lock_run(tx, attempt_id)
    return tx.execute(
        _END, {"attempt_id": attempt_id, "step_id": step_id, "output_ref": output_ref}
    )


def end_view(tx: RawTx, row: Sequence[Any] | None) -> EndView:
    if row is None:
        return EndView(None)
    n = _RUN_VIEW_SIZE
    return EndView(
        _run_view(tx, row), step=_step_of_row(tx, row[n + 1 :]), output_blob=bool(row[n])
    )


_STEP_BY_ID = Statement(f"SELECT {', '.join(STEP_COLUMNS)} FROM runtime_steps WHERE id = :id")
_INPUTS = ", ".join(INPUT_FIELDS)
_DELIVERED_TO = Statement(
    f"SELECT {_INPUTS} FROM runtime_inputs WHERE run_id = :run_id"
    " AND delivered_step_id = :step_id ORDER BY create_time, id"
)
_PENDING_STEER_ROWS = Statement(
    f"SELECT {_INPUTS} FROM runtime_inputs"
    " WHERE run_id = :run_id AND status = 'PENDING' AND kind = 'STEER' ORDER BY create_time, id"
)


def _inputs(tx: RawTx, statement: Statement, params: dict[str, Any]) -> list[Input]:
    rows = tx.execute(statement, params).fetchall()
    out = []
    for row in rows:
        values = dict(zip(INPUT_FIELDS, row, strict=True))
        values["create_time"] = tx.read_time(values["create_time"])
        values["deliver_time"] = tx.read_time(values["deliver_time"])
        out.append(Input(**values))
    return out


def load_reused(
    tx: RawTx, step_id: str, with_steers: bool, known: Step | None = None
) -> tuple[Step, list[Input]]:
    """A step a repeated idempotency key answers, and (``with_steers``) the steers it
    consumed; ``known``: the step if the view already holds it (then only its steers, if it
    consumed any, are read)."""
    step = known if known is not None and known.id == step_id else None
    needs_steers = with_steers and (step is None or step.consumed_input_ids_json != "[]")
    if (step is None or needs_steers) and not tx.can_read:
        raise NeedsRead(step_id)
    if step is None:
        step = _step_of_row(tx, cast(Sequence[Any], tx.one(_STEP_BY_ID, {"id": step_id})))
        assert step is not None  # (named by a row read under the run's lock)
    steers: list[Input] = []
    if with_steers and step.consumed_input_ids_json != "[]":
        steers = _inputs(tx, _DELIVERED_TO, {"run_id": step.run_id, "step_id": step_id})
    return step, steers


# -- writing ---------------------------------------------------------------------------

_DELIVER = Statement(
    "UPDATE runtime_inputs SET status = 'DELIVERED', delivered_turn_id = :turn_id,"
    " delivered_step_id = :step_id, deliver_time = :now WHERE id = :id"
)
_ADVANCE_RUN = Statement(
    "UPDATE runtime_runs SET last_step_sequence = :sequence, step_count = :step_count,"
    " last_event_sequence = :event_sequence, last_event_hash = :event_hash WHERE id = :id"
)
_END_STEP = Statement(
    "UPDATE runtime_steps SET "
    + ", ".join(f"{name} = :{name}" for name in END_FIELDS)
    + " WHERE id = :id"
)
_ATTEMPT_USAGE = Statement(
    "UPDATE runtime_attempts SET input_tokens = :input_tokens, output_tokens = :output_tokens,"
    " cost_usd = :cost_usd, failed_in_a_row = :failed_in_a_row WHERE id = :id"
)
_ATTEMPT_FAILED_IN_A_ROW = Statement(
    "UPDATE runtime_attempts SET failed_in_a_row = :failed_in_a_row WHERE id = :id"
)
_RUN_USAGE = Statement(
    "UPDATE runtime_runs SET input_tokens = :input_tokens, output_tokens = :output_tokens,"
    " cost_usd = :cost_usd, last_event_sequence = :event_sequence,"
    " last_event_hash = :event_hash WHERE id = :id"
)


def apply_record(tx: RawTx, run: RunView, decision: Record) -> list[Input]:
    """Record a new step as decided; return the steers it consumed. ``run`` is updated to
    what the run now is."""
    step = decision.step
    steers: list[Input] = []
    if decision.deliver_steers:
        if not tx.can_read:
            raise NeedsRead(step.id)
        steers = _inputs(tx, _PENDING_STEER_ROWS, {"run_id": run.run_id})
        step.consumed_input_ids_json = dumps([i.id for i in steers])
    now = step.start_time
    chain = events.Chain(run.thread_id, run.run_id, run.last_event_sequence, run.last_event_hash)
    step_count = run.step_count + 1 if counts(step) else run.step_count
    # A step recorded ended (a FAILED schema check) counts as one that ends later does.
    failed = failed_in_a_row(run.attempt_failed_in_a_row, step.status)
    with tx.pipeline():  # the writes: one round trip on PostgreSQL
        tx.execute(_INSERT_STEP, _stored(tx, step))
        events.append_raw(tx, chain, step_events.started(step), now)
        if step.status not in ("STARTED", "WAITING_APPROVAL"):
            events.append_raw(tx, chain, step_events.ended(step), now)
        if decision.approval_requested:
            events.append_raw(
                tx,
                chain,
                event_pb2.ApprovalRequestedAttributes(step_id=step.id, tool_name=step.tool_name),
                now,
            )
        for steer in steers:
            # Handed over exactly once: marked DELIVERED in the transaction that records the
            # step consuming it, so a retried call cannot deliver it twice.
            tx.execute(
                _DELIVER,
                {"id": steer.id, "turn_id": step.turn_id, "step_id": step.id, "now": tx.time(now)},
            )
            consumed = inputs.consumed_event(
                steer.id, steer.kind, turn_id=step.turn_id, step_id=step.id
            )
            events.append_raw(tx, chain, consumed, now)
        _insert_usages(tx, usage_rows(step))
        if failed != run.attempt_failed_in_a_row:
            tx.execute(_ATTEMPT_FAILED_IN_A_ROW, {"id": step.attempt_id, "failed_in_a_row": failed})
        tx.execute(
            _ADVANCE_RUN,
            {
                "id": run.run_id,
                "sequence": step.sequence,
                "step_count": step_count,
                "event_sequence": chain.last_sequence,
                "event_hash": chain.last_hash,
            },
        )
    run.last_step_sequence, run.step_count = step.sequence, step_count
    run.attempt_failed_in_a_row = failed
    run.last_event_sequence, run.last_event_hash = chain.last_sequence, chain.last_hash
    if steers:
        run.pending_steers = 0
    _wake(tx, run)
    return [_delivered(s, step, now) for s in steers]


def apply_end(tx: RawTx, run: RunView, decision: End) -> None:
    """End a step as decided: its outcome, its event, its usage added to the attempt's and
    the run's totals (computed here, once), its reported model in the usage index."""
    step = decision.step
    chain = events.Chain(run.thread_id, run.run_id, run.last_event_sequence, run.last_event_hash)
    attempt_usage: dict[str, Any] = {
        "id": step.attempt_id,
        "input_tokens": run.attempt_input_tokens + step.input_tokens,
        "output_tokens": run.attempt_output_tokens + step.output_tokens,
        "cost_usd": run.attempt_cost_usd + step.cost_usd,
        "failed_in_a_row": failed_in_a_row(run.attempt_failed_in_a_row, step.status),
    }
    run_usage: dict[str, Any] = {
        "id": run.run_id,
        "input_tokens": run.input_tokens + step.input_tokens,
        "output_tokens": run.output_tokens + step.output_tokens,
        "cost_usd": run.cost_usd + step.cost_usd,
    }
    values = step.values()
    ended = {key: values[key] for key in END_FIELDS}
    ended["id"] = step.id
    ended["end_time"] = tx.time(step.end_time)
    with tx.pipeline():  # the writes: one round trip on PostgreSQL
        tx.execute(_END_STEP, ended)
        events.append_raw(tx, chain, step_events.ended(step), cast(dt.datetime, step.end_time))
        tx.execute(_ATTEMPT_USAGE, attempt_usage)
        tx.execute(
            _RUN_USAGE,
            {**run_usage, "event_sequence": chain.last_sequence, "event_hash": chain.last_hash},
        )
        _insert_usages(tx, reported_usage_rows(step))
    run.attempt_input_tokens = attempt_usage["input_tokens"]
    run.attempt_output_tokens = attempt_usage["output_tokens"]
    run.attempt_cost_usd = attempt_usage["cost_usd"]
    run.attempt_failed_in_a_row = attempt_usage["failed_in_a_row"]
    run.input_tokens, run.output_tokens = run_usage["input_tokens"], run_usage["output_tokens"]
    run.cost_usd = run_usage["cost_usd"]
    run.last_event_sequence, run.last_event_hash = chain.last_sequence, chain.last_hash
    _wake(tx, run)


def _wake(tx: RawTx, run: RunView) -> None:
    tx.wake += [notify.run_key(run.run_id), notify.thread_key(run.thread_id)]


def _delivered(steer: Input, step: Step, now: dt.datetime) -> Input:
    return dataclasses.replace(
        steer,
        status="DELIVERED",
        delivered_step_id=step.id,
        delivered_turn_id=step.turn_id,
        deliver_time=now,
    )


def _stored(tx: RawTx, step: Step) -> dict[str, Any]:
    """A step's fields in the form the driver stores them."""
    values = dict(step.values())
    for key in _STEP_TIMES:
        values[key] = tx.time(values[key])
    return values


def _insert_usages(tx: RawTx, rows: list[dict[str, Any]]) -> None:
    if rows:
        tx.execute_many(
            _INSERT_USAGE, [{**r, "start_time": tx.time(r["start_time"])} for r in rows]
        )
