"""Checkpoints as stored: a run's saved state, each also a CHECKPOINT step of the ledger."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import event_pb2
from agentrt_core.ids import new_id
from agentrt_core.trace_context import trace_id_of
from runtime_service import step_events
from runtime_service.observations import StepRecorded, observe
from runtime_service.records import BLANK_STEP, new_step
from runtime_service.store import transitions
from runtime_service.store.ledger import CheckpointRow, StepRow, TurnRow
from runtime_service.store.tables import AttemptRow, RunRow

_INSERT_STEP = sa.insert(StepRow)


def by_request(session: Session, request_key: str) -> CheckpointRow | None:
    """The checkpoint an earlier WriteCheckpoint stored under this (scoped) request id, if any."""
    return session.scalar(sa.select(CheckpointRow).where(CheckpointRow.request_id == request_key))


def write(
    session: Session,
    run: RunRow,
    attempt: AttemptRow,
    turn: TurnRow | None,
    state_ref: str,
    after_sequence: int,
    request_key: str | None,
    now: dt.datetime,
) -> CheckpointRow:
    """Store a checkpoint of ``run`` (locked by the caller) as the run's next step, in
    ``turn`` if one is open, and make it the run's latest; record the step's ``step.started``
    and ``step.ended`` and then ``checkpoint.written``."""
    run.last_step_sequence += 1
    step = new_step(
        {
            **BLANK_STEP,
            "id": new_id("stp"),
            "run_id": run.id,
            "attempt_id": attempt.id,
            "turn_id": turn.id if turn else "",
            "sequence": run.last_step_sequence,
            "type": "CHECKPOINT",
            "operation": "checkpoint",
            "status": "SUCCEEDED",
            "input_ref": state_ref,
            "output_ref": state_ref,
            "start_time": now,
            "end_time": now,
            "input_revision": run.input_revision,
            "trace_id": trace_id_of(attempt.traceparent),
        }
    )
    checkpoint = CheckpointRow(
        id=new_id("ckp"),
        run_id=run.id,
        attempt_id=attempt.id,
        step_id=step.id,
        state_ref=state_ref,
        after_sequence=after_sequence,
        create_time=now,
        request_id=request_key,
    )
    session.add(checkpoint)
    run.latest_checkpoint_id = checkpoint.id
    # A checkpoint is a step of the ledger too, born ended (it resolves nothing).
    session.execute(_INSERT_STEP, step.values())
    observe(session, StepRecorded.of(run.agent_id, step, begun=True))
    transitions.append_run_event(session, run, step_events.started(step), now)
    transitions.append_run_event(session, run, step_events.ended(step), now)
    transitions.append_run_event(
        session,
        run,
        event_pb2.CheckpointWrittenAttributes(
            checkpoint_id=checkpoint.id,
            attempt_id=attempt.id,
            step_id=step.id,
            state_ref=state_ref,
            after_sequence=after_sequence,
        ),
        now,
    )
    return checkpoint
