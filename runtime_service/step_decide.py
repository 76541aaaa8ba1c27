"""BeginStep and EndStep decided: :func:`decide_begin` and :func:`decide_end`.

Pure (see ``step_rules``, which holds the requests, views and decisions these return): the
order of the checks is the contract's order of errors, and each check is here once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from agentrt_core import reasons, resolution
from agentrt_core.actors import display_actor
from agentrt_core.errors import (
    AgentrtError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from agentrt_core.lru import LruCache
from agentrt_core.resolution import BoundDefinition
from agentrt_core.trace_context import trace_id_of
from runtime_service.blob_rules import blob_missing
from runtime_service.fence import FenceClaim, fence_error
from runtime_service.records import BLANK_STEP, Step, new_step
from runtime_service.step_rules import (
    COUNTED,
    BeginDecision,
    BeginView,
    End,
    EndDecision,
    EndView,
    PriorModelCall,
    Record,
    Refuse,
    Reuse,
    RunView,
    StepEnd,
    StepRequest,
    StopOnBudget,
    StopOnFailedSteps,
    Unchanged,
    budget_error,
    dumps,
    failed_step_limit_error,
)


def decide_begin(
    view: BeginView,
    bound: BoundDefinition | None,
    req: StepRequest,
    now: dt.datetime,
    step_id: str,
) -> BeginDecision:
    """What a BeginStep does, given what was read (``req`` already passed
    ``check_step_request``); ``bound``: the run's bound definition (None only when no run
    was read); ``step_id``: the id a new step gets."""
    run = view.run
    error = fence_error(req.fence, run, now)
    if error is not None:
        return Refuse(error)
    assert run is not None and bound is not None  # (the fence holds: the run was read)
    if view.turn_attempt_id != req.attempt_id or view.turn_status != "OPEN":
        return Refuse(
            FailedPrecondition(
                f"turn {req.turn_id} is not the open turn of this attempt",
                reason=reasons.TURN_NOT_OPEN,
            )
        )
    if req.input_ref and not view.input_blob:
        return Refuse(blob_missing("input_ref", req.input_ref))
    # A retry of another run's step (or of no step) would put a link in this run's ledger,
    # and in its audit bundle, that leads out of it.
    if req.retry_of_step_id and view.retry_of_run_id != run.run_id:
        return Refuse(
            InvalidArgument.for_field(
                "retry_of_step_id",
                f"{req.retry_of_step_id!r} is not a step of run {run.run_id}",
            )
        )
    new = _NewStep(run, req, now, step_id, req.retry_of_step_id)
    earlier = view.keyed
    if earlier is not None:
        if earlier.type == "APPROVAL_REQUEST":
            if not earlier.approval_decision or view.keyed_follower_id:
                return Reuse(view.keyed_follower_id or earlier.id, with_steers=False)
            # The decision is in: the (resumed) attempt now gets the tool call itself.
            return _after_approval(new, bound, earlier)
        if earlier.status in ("SUCCEEDED", "DENIED", "WAITING_APPROVAL") or (
            earlier.status == "STARTED" and earlier.attempt_id == req.attempt_id
        ):
            # Returned "with its original resolution and inputs": with the steers it
            # consumed, which were delivered exactly once, to it.
            return Reuse(earlier.id, with_steers=True)
        # It failed, or another attempt began it: this is its retry.
        new.retry_of = new.retry_of or earlier.id
    exceeded = budget_error(run, req.estimate)
    if exceeded is not None:
        return StopOnBudget(exceeded)
    looping = failed_step_limit_error(run.attempt_failed_in_a_row)
    if looping is not None:
        return StopOnFailedSteps(looping)
    if req.type == "MODEL_CALL":
        return _model_call(new, bound, view.last_model_call)
    if req.type == "TOOL_CALL":
        return _tool_call(new, bound)
    if req.check not in bound.completion_checks:
        return Refuse(
            InvalidArgument.for_field(
                "completion_check.check",
                f"{req.check!r} is not a check of the bound completion policy "
                f"({', '.join(bound.completion_checks) or 'none'})",
            )
        )
    if req.check in bound.runtime_checks:
        # What the runtime reads from the ledger no worker may attest.
        return Refuse(
            InvalidArgument.for_field(
                "completion_check.check",
                f"{req.check!r} is evaluated by the runtime from the ledger when the run "
                "completes; it is not attested with a step",
            )
        )
    return Record(new.step("STARTED", completion_check=req.check, operation=req.check))


def decide_end(
    view: EndView, fence: FenceClaim, step_id: str, outcome: StepEnd, now: dt.datetime
) -> EndDecision:
    """What an EndStep does, given what was read (``outcome`` built by ``step_end``)."""
    run, step = view.run, view.step
    error = fence_error(fence, run, now)
    if error is not None:
        return Refuse(error)
    assert run is not None  # (the fence holds: the run was read)
    if step is None or step.run_id != run.run_id:
        return Refuse(NotFound("step", step_id))
    if step.status != "STARTED":
        if outcome.repeats(step):
            return Unchanged(step)
        return Refuse(
            FailedPrecondition(
                f"step {step_id} already ended {step.status}; it cannot end {outcome.status}",
                reason=reasons.STEP_ENDED,
                metadata={"current_status": step.status},
            )
        )
    if step.attempt_id != fence.attempt_id:
        return Refuse(
            FailedPrecondition(
                "the step belongs to another attempt", reason=reasons.STEP_OF_OTHER_ATTEMPT
            )
        )
    if outcome.output_ref and not view.output_blob:
        return Refuse(blob_missing("output_ref", outcome.output_ref))
    return End(
        new_step(
            {
                **step.values(),
                "status": outcome.status,
                "end_time": now,
                "output_ref": outcome.output_ref,
                "summary": outcome.summary,
                "input_tokens": outcome.input_tokens,
                "output_tokens": outcome.output_tokens,
                "cost_usd": outcome.cost_usd,
                "reported_model_id": outcome.reported_model_id,
                "error_class": outcome.error_class,
                "error_message": outcome.error_message,
                "retryable": outcome.retryable,
                "side_effect": step.side_effect or outcome.side_effect,
            }
        )
    )


class _NewStep:
    """How a new step of this BeginStep is built: the next sequence of the run, in the
    request's turn, with its key, input and retry link."""

    def __init__(
        self, run: RunView, req: StepRequest, now: dt.datetime, step_id: str, retry_of: str
    ) -> None:
        self.run, self.req, self.now, self.id, self.retry_of = run, req, now, step_id, retry_of

    def step(self, status: str, *, type_: str = "", **fields: Any) -> Step:
        req = self.req
        return new_step(
            {
                **BLANK_STEP,
                "id": self.id,
                "run_id": self.run.run_id,
                "attempt_id": req.attempt_id,
                "turn_id": req.turn_id,
                "sequence": self.run.last_step_sequence + 1,
                "type": type_ or req.type,
                "status": status,
                "idempotency_key": req.idempotency_key,
                "input_ref": req.input_ref,
                "start_time": self.now,
                "end_time": None if status in ("STARTED", "WAITING_APPROVAL") else self.now,
                "retry_of_step_id": self.retry_of,
                "input_revision": self.run.input_revision,
                "trace_id": trace_id_of(self.run.attempt_traceparent),
                **fields,
                # What the step does, for the ledger's readers: the worker's words, else the
                # tool or check it calls (the contract's promise for an empty operation).
                "operation": req.operation or fields.get("operation", ""),
            }
        )

    def deny(
        self,
        error: AgentrtError,
        message: str,
        *,
        status: str = "DENIED",
        error_class: str = "PERMISSION_DENIED",
        tools: list[dict[str, Any]] | None = None,
    ) -> Record:
        """A refused step the ledger keeps (ended at once), answered with ``error``."""
        req = self.req
        step = self.step(
            status,
            error_class=error_class,
            error_message=message,
            tool_name=req.tool,
            tool_arguments_json=dumps(req.arguments),
            tools_json=dumps(tools or []),
            operation=req.tool,
        )
        error.metadata["step_id"] = step.id
        return Record(step, error=error)


def _model_call(
    new: _NewStep, bound: BoundDefinition, prior: PriorModelCall | None
) -> BeginDecision:
    """A model call: its skills and tools checked against the definition, its candidate
    chosen. A fallback follows the ledger, never the worker's word: when the attempt's latest
    MODEL_CALL step FAILED, its error class and candidate (as recorded) drive the choice, and
    a FALLBACK_AFTER_ERROR names that step (``fallback_from_step_id``). The request's
    ``previous_error_class`` and ``previous_candidate`` are ignored."""
    req = new.req
    unknown = [f"skill {s}" for s in req.skills if s not in bound.skills]
    unknown += [f"tool {t}" for t in req.tools if t not in bound.tools]
    if unknown:
        message = (
            f"not in the bound definition {bound.agent_id}@{bound.version_label}: "
            + ", ".join(unknown)
        )
        return new.deny(
            PermissionDenied(
                message, reason=reasons.NOT_IN_DEFINITION, metadata={"denied": ",".join(unknown)}
            ),
            message,
        )
    failed = prior if prior is not None and prior.status == "FAILED" else None
    try:
        choice = resolution.choose_model(
            bound.model_policy.spec,
            estimated_input_tokens=req.estimated_input_tokens,
            previous_error_class=failed.error_class if failed is not None else "",
            previous_candidate=failed.candidate_name if failed is not None else "",
        )
    except FailedPrecondition as exc:
        if failed is not None:
            exc.metadata["failed_step_id"] = failed.step_id
        return Refuse(exc)
    columns = _model_columns(bound, req, choice, new.run.permission_ceiling)
    after = failed.step_id if failed is not None and choice.reason == "FALLBACK_AFTER_ERROR" else ""
    return Record(
        new.step(
            "STARTED", **columns, context_digest=req.context_digest, fallback_from_step_id=after
        ),
        deliver_steers=new.run.pending_steers > 0,
    )


#: The most schema violations a refused tool call's step records one by one (the rest are
#: counted): arguments of a few MB breaking an `items` rule everywhere must not make a step
#: row of as many MB.
_RECORDED_VIOLATIONS = 100


def _tool_call(new: _NewStep, bound: BoundDefinition) -> BeginDecision:
    req = new.req
    pinned = bound.tools.get(req.tool)
    if pinned is None:
        message = (
            f"tool {req.tool!r} is not in the bound definition "
            f"{bound.agent_id}@{bound.version_label}"
        )
        return new.deny(
            PermissionDenied(
                message, reason=reasons.NOT_IN_DEFINITION, metadata={"tool": req.tool}
            ),
            message,
        )
    decision = resolution.permission(bound, req.tool, new.run.permission_ceiling)
    tools = [_recorded_tool(pinned, decision)]
    if decision == "DENY":
        message = f"tool {req.tool!r} is denied by the permission policy or the run's ceiling"
        return new.deny(
            PermissionDenied(message, reason=reasons.TOOL_DENIED, metadata={"tool": req.tool}),
            message,
            tools=tools,
        )
    problems = resolution.argument_errors(pinned, req.arguments)
    if problems:
        schema = f"{pinned.name}@{pinned.version}"
        # Every violation, one field each (the wire carries the first few: grpc_errors),
        # and all of them in the recorded step.
        found = [f"{p.json_path}: {p.message}" for p in problems]
        message = f"arguments do not match the schema of {schema}: " + "; ".join(
            found[:_RECORDED_VIOLATIONS]
        )
        if len(found) > _RECORDED_VIOLATIONS:
            message += f" (and {len(found) - _RECORDED_VIOLATIONS} more)"
        error = InvalidArgument(
            f"arguments do not match the schema of {schema}: {found[0]}"
            + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""),
            [
                FieldViolation(p.field("tool_call.arguments"), f"{text} (schema of {schema})")
                for p, text in zip(problems, found, strict=True)
            ],
        )
        return new.deny(
            error,
            message,
            status="FAILED",
            error_class="INVALID_ARGUMENTS",
            tools=tools,
        )
    call = {
        "tool_name": req.tool,
        "tool_arguments_json": dumps(req.arguments),
        "tools_json": dumps(tools),
        "operation": req.tool,
    }
    if decision == "REQUIRE_APPROVAL":
        return Record(
            new.step("WAITING_APPROVAL", type_="APPROVAL_REQUEST", **call),
            approval_requested=True,
        )
    return Record(new.step("STARTED", **call, side_effect=bool(pinned.spec.get("side_effects"))))


def _after_approval(new: _NewStep, bound: BoundDefinition, approval: Step) -> BeginDecision:
    """The tool call an approval was requested for, now that it is decided: started if
    approved, recorded DENIED (the tool's result for the agent, not a failure of the run)
    if not."""
    approved = approval.approval_decision == "APPROVE"
    new.retry_of = ""
    tool = bound.tools.get(approval.tool_name)
    fields: dict[str, Any] = {
        "tool_name": approval.tool_name,
        "tool_arguments_json": approval.tool_arguments_json,
        "tools_json": approval.tools_json,
        "approval_step_id": approval.id,
        "operation": approval.operation or approval.tool_name,
    }
    if approved:
        fields["side_effect"] = bool(tool and tool.spec.get("side_effects"))
        return Record(new.step("STARTED", type_="TOOL_CALL", **fields))
    fields["error_class"] = "PERMISSION_DENIED"
    who = display_actor(approval.approver_principal, approval.approver)
    fields["error_message"] = f"denied by {who}: {approval.approval_comment}".strip()
    return Record(new.step("DENIED", type_="TOOL_CALL", **fields))


def counts(step: Step) -> bool:
    """Whether a step counts against ``max_steps``."""
    return step.type in COUNTED


# -- what a model call resolves to -----------------------------------------------------

#: What a model call records of its resolution, by what decides it (see _model_columns).
_MODEL_COLUMNS: LruCache[tuple[Any, ...], dict[str, Any]] = LruCache(4096)


def _model_columns(
    bound: BoundDefinition, req: StepRequest, choice: resolution.ModelChoice, ceiling: str
) -> dict[str, Any]:
    """What a new MODEL_CALL step records of what was resolved for it: the candidate, the
    prompt, the pinned skills it is handed (``resolution.skills_for_call``) and the tools it
    offers (each with its decision under ``ceiling``). Callers copy it, never change it."""
    candidate = choice.candidate
    skills = resolution.skills_for_call(bound, req.skills)
    tools = tuple(sorted(set(req.tools)))
    # Candidate names are unique within a policy (the registry refuses duplicates), and a
    # bound definition never changes: the same inputs always resolve to the same columns.
    key = (bound.digest, candidate.get("name"), choice.reason, skills, tools, ceiling)
    columns = _MODEL_COLUMNS.get(key)
    if columns is None:
        columns = {
            "model_policy_digest": bound.model_policy.digest,
            "candidate_name": str(candidate.get("name", "")),
            "candidate_reason": choice.reason,
            "provider": str(candidate.get("provider", "")),
            "requested_model_id": str(candidate.get("model_id", "")),
            "parameters_json": dumps(candidate.get("parameters", {})),
            "system_prompt_digest": bound.system_prompt.digest,
            "skills_json": dumps(
                [
                    {"name": s.name, "version": s.version, "digest": s.digest}
                    for s in (bound.skills[n] for n in skills)
                ]
            ),
            "tools_json": dumps(
                [
                    _recorded_tool(t, resolution.permission(bound, t.name, ceiling))
                    for t in (bound.tools[n] for n in tools)
                ]
            ),
        }
        _MODEL_COLUMNS.put(key, columns)
    return columns


def _recorded_tool(pinned: resolution.Pinned, decision: str) -> dict[str, Any]:
    return {
        "name": pinned.name,
        "version": pinned.version,
        "digest": pinned.digest,
        "schema_digest": pinned.schema_digest,
        "decision": decision,
    }
