"""ResolveApproval: a person's decision on a tool call that needed one."""

from __future__ import annotations

from sqlalchemy.orm import Session

from agentrt_base.auth import caller_name
from agentrt_base.db import utcnow
from agentrt_core import reasons
from agentrt_core.actors import display_actor
from agentrt_core.errors import FailedPrecondition, InvalidArgument, NotFound, ViolationCollector
from runtime_service import lifecycle
from runtime_service.lifecycle import Actor, RunStatus, Trigger
from runtime_service.records import Run, Step, run_of, step_of
from runtime_service.services.context import Runtime
from runtime_service.step_rules import MAX_TEXT
from runtime_service.store import approvals, step_reads, transitions
from runtime_service.store.ledger import StepRow
from runtime_service.store.runs import run_for_update
from runtime_service.store.tables import RunRow


class ApprovalsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def resolve_approval(
        self, run_id: str, step_id: str, decision: str, approver: str, comment: str
    ) -> tuple[Step, Run]:
        problems = ViolationCollector()
        if decision not in ("APPROVE", "DENY"):
            problems.add("decision", "required: APPROVE or DENY")
        if not approver:
            problems.add("approver", "required: who decided")
        if len(comment.encode()) > MAX_TEXT:
            problems.add("comment", f"larger than {MAX_TEXT} bytes")
        problems.raise_if_any("invalid approval")
        # The decision is the call's principal's; ``approver`` is only the label it gave.
        principal = caller_name()

        def write(session: Session) -> tuple[StepRow, RunRow]:
            run = run_for_update(session, run_id)
            step = step_reads.row(session, step_id)
            if step is None:
                raise NotFound("approval step", step_id)
            # Fix: the contract answers "step not an approval of this run" INVALID_ARGUMENT
            # (NOT_FOUND is for a step that does not exist).
            if step.run_id != run.id or step.type != "APPROVAL_REQUEST":
                raise InvalidArgument.for_field(
                    "step_id", f"{step_id} is not an APPROVAL_REQUEST step of run {run.id}"
                )
            if step.approval_decision:
                if step.approval_decision == decision:
                    return step, run
                raise FailedPrecondition(
                    f"the approval was already resolved: {step.approval_decision}",
                    reason=reasons.APPROVAL_RESOLVED,
                )
            # Fix: an ended run takes no decision (RUN_ENDED); recording one would also append
            # `approval.resolved` after `run.ended`, which must stay the run's last event.
            lifecycle.require_live(RunStatus(run.status), "its approvals can no longer be resolved")
            now = utcnow()
            approvals.resolve(session, run, step, decision, approver, principal, comment, now)
            # The run waits until every approval it asked for is decided (the contract:
            # "once no approval is pending"), then goes on with all the decisions at once.
            if run.status == RunStatus.WAITING_APPROVAL.value and not approvals.waiting(
                session, run.id
            ):
                transitions.apply(
                    session,
                    run,
                    Trigger.RESOLVE_APPROVAL,
                    Actor.CLIENT,
                    now,
                    message=f"approval {decision.lower()} by {display_actor(principal, approver)}",
                    principal=principal,
                )
            return step, run

        step, run = await self._rt.write(write)
        return step_of(step), run_of(run)
