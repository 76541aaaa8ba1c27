"""Approvals as stored: the APPROVAL_REQUEST step a decision is recorded on."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core.proto_json import enum_value
from runtime_service.observations import ApprovalResolved, StepRecorded, observe
from runtime_service.records import step_of
from runtime_service.store import transitions
from runtime_service.store.ledger import StepRow
from runtime_service.store.tables import RunRow


def resolve(
    session: Session,
    run: RunRow,
    step: StepRow,
    decision: str,
    approver: str,
    principal: str,
    comment: str,
    now: dt.datetime,
) -> None:
    """Record ``decision`` (APPROVE or DENY) on the approval ``step``, which ends with it
    (SUCCEEDED or DENIED), and append ``approval.resolved``: ``principal`` decided,
    ``approver`` is the label the caller gave."""
    step.approval_decision, step.approver = decision, approver[:200]
    step.approver_principal = principal
    step.approval_comment, step.approval_time = comment, now
    step.status = "SUCCEEDED" if decision == "APPROVE" else "DENIED"
    step.end_time = now
    observe(session, ApprovalResolved(run.namespace, run.agent_id, decision, now - step.start_time))
    observe(session, StepRecorded.ended_step(run.agent_id, step_of(step)))
    transitions.append_run_event(
        session,
        run,
        event_pb2.ApprovalResolvedAttributes(
            step_id=step.id,
            decision=enum_value(enum_pb2.ApprovalDecision, "APPROVAL_DECISION_", decision),
            approver=step.approver,
            comment=comment,
            approver_principal=principal,
        ),
        now,
    )


def waiting(session: Session, run_id: str) -> int:
    """How many approval requests of the run still wait for a decision."""
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(StepRow)
            .where(
                StepRow.run_id == run_id,
                StepRow.type == "APPROVAL_REQUEST",
                StepRow.status == "WAITING_APPROVAL",
            )
        )
        or 0
    )
