"""Attempts as stored: one started under a lease (its row, its ``attempt.started`` event),
its result, and what it left open or unmet when its worker finishes it."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core.ids import new_id
from agentrt_core.proto_json import enum_value
from agentrt_core.trace_context import attempt_context
from runtime_service.observations import AttemptStarted, observe
from runtime_service.store import transitions
from runtime_service.store.ledger import CheckpointRow, InputRow, StepRow
from runtime_service.store.tables import AttemptRow, RunRow


def start(
    session: Session,
    run: RunRow,
    worker_id: str,
    worker_principal: str,
    ttl: dt.timedelta,
    now: dt.datetime,
    lease_token_hash: str,
    *,
    start_trace: bool = False,
) -> AttemptRow:
    """A new ACTIVE attempt of ``run`` (locked by the caller) for the worker labelled
    ``worker_id``, authenticated as ``worker_principal``, leased for ``ttl`` from ``now``; it
    becomes the run's current attempt under a new lease epoch. Only the hash of its lease
    token is stored. Its trace context is the child of the run's, or with ``start_trace``
    (the server traces) a new trace's root for a run created outside any trace."""
    run.attempt_count += 1
    run.lease_epoch += 1
    attempt_id = new_id("att")
    attempt = AttemptRow(
        id=attempt_id,
        run_id=run.id,
        number=run.attempt_count,
        reason=run.next_attempt_reason or "INITIAL",
        worker_id=worker_id,
        lease_epoch=run.lease_epoch,
        resume_from_checkpoint_id=run.latest_checkpoint_id,
        status="ACTIVE",
        start_time=now,
        end_time=None,
        lease_expire_time=now + ttl,
        lease_ttl_ms=int(ttl.total_seconds() * 1000),
        error_class="",
        error_message="",
        retryable=False,
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        result_summary="",
        output_ref="",
        lease_token_hash=lease_token_hash,
        worker_principal=worker_principal,
        traceparent=attempt_context(run.traceparent, attempt_id, start_trace=start_trace),
    )
    session.add(attempt)
    run.current_attempt_id = attempt.id
    waited = now - run.create_time if attempt.number == 1 else None
    observe(
        session,
        AttemptStarted(
            run.namespace,
            run.agent_id,
            attempt.reason,
            attempt.number,
            waited,
            transitions.attempt_trace(run, attempt),
        ),
    )
    return attempt


def record_started(session: Session, run: RunRow, attempt: AttemptRow, now: dt.datetime) -> None:
    """Append ``attempt.started`` to the run's chain and write the new attempt's row now, so it
    is in the database before the caller reads on in this transaction."""
    transitions.append_run_event(
        session,
        run,
        event_pb2.AttemptStartedAttributes(
            attempt_id=attempt.id,
            number=attempt.number,
            reason=enum_value(enum_pb2.AttemptReason, "ATTEMPT_REASON_", attempt.reason),
            worker_id=attempt.worker_id,
            lease_epoch=attempt.lease_epoch,
            resume_from_checkpoint_id=attempt.resume_from_checkpoint_id,
            worker_principal=attempt.worker_principal,
        ),
        now,
    )
    session.flush()


def resume_checkpoint(session: Session, run: RunRow) -> CheckpointRow | None:
    """The checkpoint a new attempt of ``run`` resumes from (the run's latest), if any."""
    if not run.latest_checkpoint_id:
        return None
    return session.get(CheckpointRow, run.latest_checkpoint_id)


def get(session: Session, attempt_id: str) -> AttemptRow | None:
    return session.get(AttemptRow, attempt_id)


def run_of(session: Session, attempt: AttemptRow) -> RunRow:
    run = session.get(RunRow, attempt.run_id)
    assert run is not None  # an attempt's run is never deleted
    return run


def record_result(
    run: RunRow, attempt: AttemptRow, result_summary: str, output_ref: str, *, completes_run: bool
) -> None:
    """Store what the worker reported as the attempt's result, and as the run's when the
    attempt completes it."""
    attempt.result_summary, attempt.output_ref = result_summary, output_ref
    if completes_run:
        run.result_summary, run.output_ref = result_summary, output_ref


def open_steps(session: Session, attempt_id: str) -> int:
    """How many of the attempt's steps are still STARTED."""
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(StepRow)
            .where(StepRow.attempt_id == attempt_id, StepRow.status == "STARTED")
        )
        or 0
    )


def approvals_waiting(session: Session, attempt_id: str) -> int:
    """How many of the attempt's approval requests wait for a decision."""
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(StepRow)
            .where(
                StepRow.attempt_id == attempt_id,
                StepRow.type == "APPROVAL_REQUEST",
                StepRow.status == "WAITING_APPROVAL",
            )
        )
        or 0
    )


def pending_inputs(session: Session, run_id: str) -> int:
    """How many inputs were sent to the run and not yet delivered to a turn."""
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(InputRow)
            .where(InputRow.run_id == run_id, InputRow.status == "PENDING")
        )
        or 0
    )
