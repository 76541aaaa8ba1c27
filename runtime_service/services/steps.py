"""Turns, steps, inputs, approvals, checkpoints and artifacts: what happens inside a run.

``BeginStep`` is where the runtime resolves versions against the run's bound definition and
records them on the step; a refusal that the issue wants *recorded* (a tool outside the
definition, a denied tool, arguments that fail the schema, an exceeded budget) is committed
first and answered with its error afterwards, through :class:`Recorded`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_base.db import utcnow
from agentrt_base.errors import (
    AgentrtError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ViolationCollector,
)
from agentrt_base.ids import new_id
from agentrt_base.lru import LruCache
from agentrt_base.paging import cut_page, page_request
from agentrt_base.raw import RawTx
from registry import refs
from runtime_service import events, notify, proto_map, resolution
from runtime_service.blobs import require_blob
from runtime_service.lifecycle import Actor, RunStatus, Trigger
from runtime_service.resolution import BoundDefinition
from runtime_service.services import step_events, transitions
from runtime_service.services.bound import Bound, BoundAgents
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.services.leases import fence_holds, fenced
from runtime_service.services.runs import run_for_update
from runtime_service.store import step_sql
from runtime_service.store.ledger import (
    ArtifactRow,
    BlobRow,
    CheckpointRow,
    InputRow,
    StepRow,
    StepUsageRow,
    TurnRow,
)
from runtime_service.store.step_states import StepStates
from runtime_service.store.tables import AttemptRow, RunRow

COUNTED = ("MODEL_CALL", "TOOL_CALL", "COMPLETION_CHECK")
_INSERT_USAGE = sa.insert(StepUsageRow)
_INSERT_STEP = sa.insert(StepRow)
MAX_INPUT_BYTES = 256 * 1024
#: ResolvedVersions answers by (bound digest, recorded resolution): see resolved_for.
_RESOLVED: LruCache[tuple[str, ...], message_pb2.ResolvedVersions] = LruCache(1024)
MAX_TEXT = 64 * 1024
#: What one step may report using: far beyond any model call (2^40 tokens, a billion
#: dollars), and small enough that a run's totals, which add up at most MAX_RUN_STEPS steps,
#: stay within the 64-bit columns that hold them (2^22 * 2^40 = 2^62) and a finite float.
MAX_STEP_TOKENS = 1 << 40
MAX_STEP_COST_USD = 1e9
#: The runtime's own ceiling on a run's counted steps, whatever its max_steps budget says:
#: what keeps usage totals from overflowing (above).
MAX_RUN_STEPS = 1 << 22


@dataclass
class StepRequest:
    attempt_id: str
    lease_epoch: int
    turn_id: str
    type: str
    operation: str
    idempotency_key: str
    input_ref: str
    retry_of_step_id: str
    # MODEL_CALL
    estimated_input_tokens: int = 0
    previous_error_class: str = ""
    previous_candidate: str = ""
    skills: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    context_digest: str = ""
    # TOOL_CALL
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    # COMPLETION_CHECK
    check: str = ""
    details: str = ""


class _Budgeted(Protocol):
    """What a budget check reads: a run row, or the step path's view of one."""

    max_steps: int
    max_model_tokens: int
    max_cost_usd: float
    input_tokens: int
    output_tokens: int
    cost_usd: float
    step_count: int


@dataclass
class _Begin:
    """One BeginStep on the ORM path: the locked run, its attempt and open turn, the bound
    definition, the request, the step it retries and the time it happens."""

    session: Session
    run: RunRow
    attempt: AttemptRow
    turn: TurnRow
    bound: BoundDefinition
    req: StepRequest
    retry_of: str
    now: dt.datetime


@dataclass
class StepOutcome:
    step: StepRow
    existing: bool
    resolved: message_pb2.ResolvedVersions | None
    steers: list[InputRow]
    #: The run's bound agent (set by the common path, whose caller adds ``resolved`` from it:
    #: the step writer process leaves that to the server).
    agent_digest: str = ""


@dataclass(frozen=True)
class StepEnd:
    """How a worker says a step ended (EndStep), applied the same way by both paths."""

    status: str
    output_ref: str
    summary: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    reported_model_id: str
    error_class: str
    error_message: str
    retryable: bool
    side_effect: bool

    def repeats(self, step: StepRow) -> bool:
        """Whether an ended step already ended this way (a repeated EndStep is a no-op)."""
        return (step.status, step.output_ref, step.input_tokens, step.output_tokens) == (
            self.status,
            self.output_ref,
            self.input_tokens,
            self.output_tokens,
        )

    def changes(self, step: StepRow, now: dt.datetime) -> dict[str, Any]:
        """The columns ending ``step`` this way sets."""
        return {
            "status": self.status,
            "end_time": now,
            "output_ref": self.output_ref,
            "summary": self.summary,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "reported_model_id": self.reported_model_id,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "retryable": self.retryable,
            "side_effect": step.side_effect or self.side_effect,
        }


@dataclass
class Recorded:
    """A result that was committed but must still be answered with ``error``."""

    value: Any
    error: AgentrtError | None = None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _step_row(
    attempt_id: str,
    turn_id: str,
    sequence: int,
    input_revision: int,
    req: StepRequest,
    retry_of: str,
    now: dt.datetime,
    *,
    status: str,
    type_: str,
    run_id: str,
) -> StepRow:
    """A new step as both paths record it, before its resolution is filled in."""
    return step_sql.detached_step(
        {
            **_BLANK_STEP,
            "id": new_id("stp"),
            "run_id": run_id,
            "attempt_id": attempt_id,
            "turn_id": turn_id,
            "sequence": sequence,
            "type": type_,
            "operation": req.operation,
            "status": status,
            "idempotency_key": req.idempotency_key,
            "input_ref": req.input_ref,
            "start_time": now,
            "end_time": None if status in ("STARTED", "WAITING_APPROVAL") else now,
            "retry_of_step_id": retry_of,
            "input_revision": input_revision,
        }
    )


def _choose_model(bound: BoundDefinition, req: StepRequest) -> resolution.ModelChoice:
    return resolution.choose_model(
        bound.model_policy.spec,
        estimated_input_tokens=req.estimated_input_tokens,
        previous_error_class=req.previous_error_class,
        previous_candidate=req.previous_candidate,
    )


def _resolve_model(
    step: StepRow,
    bound: BoundDefinition,
    req: StepRequest,
    choice: resolution.ModelChoice,
    ceiling: str,
) -> None:
    """Record on a new MODEL_CALL step what was resolved for it: the candidate, the prompt,
    and the pinned skills and tools it offers (each tool with its decision under
    ``ceiling``)."""
    candidate = choice.candidate
    skills, tools = tuple(sorted(set(req.skills))), tuple(sorted(set(req.tools)))
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
            "parameters_json": _dumps(candidate.get("parameters", {})),
            "system_prompt_digest": bound.system_prompt.digest,
            "skills_json": _dumps(
                [
                    {"name": s.name, "version": s.version, "digest": s.digest}
                    for s in (bound.skills[n] for n in skills)
                ]
            ),
            "tools_json": _dumps(
                [
                    _recorded_tool(t, resolution.permission(bound, t.name, ceiling))
                    for t in (bound.tools[n] for n in tools)
                ]
            ),
        }
        _MODEL_COLUMNS.put(key, columns)
    step_sql.fill(step, **columns, context_digest=req.context_digest)


#: What a model call records of its resolution, by what decides it (see _resolve_model).
_MODEL_COLUMNS: LruCache[tuple[Any, ...], dict[str, Any]] = LruCache(4096)


def _recorded_tool(pinned: resolution.Pinned, decision: str) -> dict[str, Any]:
    return {
        "name": pinned.name,
        "version": pinned.version,
        "digest": pinned.digest,
        "schema_digest": pinned.schema_digest,
        "decision": decision,
    }


def _call_tool(
    step: StepRow, req: StepRequest, pinned: resolution.Pinned, tools: list[dict[str, Any]]
) -> None:
    """Record on a new TOOL_CALL step the call it makes to a pinned tool."""
    step_sql.fill(
        step,
        tool_name=req.tool,
        tool_arguments_json=_dumps(req.arguments),
        tools_json=_dumps(tools),
        side_effect=bool(pinned.spec.get("side_effects")),
    )


def _reported_usage_rows(step: StepRow) -> list[dict[str, Any]]:
    """The usage row of the model the provider reported, set at EndStep."""
    if not step.reported_model_id:
        return []
    return [
        {
            "step_id": step.id,
            "kind": "model_reported",
            "name": step.reported_model_id,
            "version": "",
            "digest": "",
            "schema_digest": "",
            "run_id": step.run_id,
            "start_time": step.start_time,
        }
    ]


def _usage_rows(step: StepRow) -> list[dict[str, Any]]:
    """Every version the step used, as rows of the index behind FindUsages."""
    rows: list[dict[str, Any]] = []

    def add(kind: str, name: str, version: str, digest: str, schema: str = "") -> None:
        rows.append(
            {
                "step_id": step.id,
                "kind": kind,
                "name": name,
                "version": version,
                "digest": digest,
                "schema_digest": schema,
                "run_id": step.run_id,
                "start_time": step.start_time,
            }
        )

    if step.model_policy_digest:
        add("model_policy", "", "", step.model_policy_digest)
        add("model_requested", step.requested_model_id, "", "")
    if step.system_prompt_digest:
        add("system_prompt", "", "", step.system_prompt_digest)
    if step.skills_json != "[]":
        for skill in json.loads(step.skills_json):
            add("skill", skill["name"], skill["version"], skill["digest"])
    if step.tools_json != "[]":
        for tool in json.loads(step.tools_json):
            add("tool", tool["name"], tool["version"], tool["digest"], tool["schema_digest"])
    return rows


def _open_turn(session: Session, attempt: AttemptRow) -> TurnRow | None:
    return session.scalar(
        sa.select(TurnRow).where(TurnRow.attempt_id == attempt.id, TurnRow.status == "OPEN")
    )


_PENDING_INPUTS = (
    sa.select(InputRow)
    .where(
        InputRow.run_id == sa.bindparam("run_id"),
        InputRow.status == "PENDING",
        InputRow.kind.in_(sa.bindparam("kinds", expanding=True)),
    )
    .order_by(InputRow.create_time, InputRow.id)
)


def _pending_inputs(session: Session, run: RunRow, kinds: tuple[str, ...]) -> list[InputRow]:
    # Prebuilt and run without autoflush: BeginStep asks this on every model call, and the
    # pending step it has not flushed yet cannot be an input anyway.
    with session.no_autoflush:
        return list(session.scalars(_PENDING_INPUTS, {"run_id": run.id, "kinds": list(kinds)}))


def _deliver(
    session: Session,
    run: RunRow,
    inputs: list[InputRow],
    now: dt.datetime,
    *,
    turn_id: str,
    step_id: str = "",
) -> None:
    """Hand inputs over exactly once: each is marked DELIVERED in the same transaction that
    records the consuming turn or step, so a retried call cannot deliver it twice."""
    for item in inputs:
        item.status = "DELIVERED"
        item.delivered_turn_id = turn_id
        item.delivered_step_id = step_id
        item.deliver_time = now
        transitions.append_run_event(
            session,
            run,
            event_pb2.InputConsumedAttributes(
                input_id=item.id,
                kind=enum_pb2.InputKind.Value(f"INPUT_KIND_{item.kind}"),
                step_id=step_id,
                turn_id=turn_id,
            ),
            now,
        )


def _start_turn(
    session: Session, run: RunRow, attempt: AttemptRow, now: dt.datetime, request_id: str
) -> tuple[TurnRow, list[InputRow]]:
    run.turn_count += 1
    turn = TurnRow(
        id=new_id("trn"),
        run_id=run.id,
        attempt_id=attempt.id,
        number=run.turn_count,
        status="OPEN",
        start_time=now,
        end_time=None,
        request_id=request_id,
    )
    session.add(turn)
    inputs = _pending_inputs(session, run, ("FOLLOW_UP", "STEER"))
    transitions.append_run_event(
        session,
        run,
        event_pb2.TurnStartedAttributes(
            turn_id=turn.id,
            attempt_id=attempt.id,
            number=turn.number,
            input_ids=[i.id for i in inputs],
        ),
        now,
    )
    _deliver(session, run, inputs, now, turn_id=turn.id)
    return turn, inputs


def budget_error(run: _Budgeted, estimated_tokens: int = 0) -> ResourceExhausted | None:
    """The error naming the budget one more step would exceed, or None."""
    exceeded = ""
    used_tokens = run.input_tokens + run.output_tokens
    if run.max_steps and run.step_count + 1 > run.max_steps:
        exceeded = f"max_steps ({run.max_steps}) reached"
        name = "max_steps"
    elif run.step_count + 1 > MAX_RUN_STEPS:
        exceeded = f"the runtime's ceiling of {MAX_RUN_STEPS} steps a run reached"
        name = "max_steps"
    # Fix: ModelCallSpec.estimated_input_tokens "drives ... the token budget check": a
    # model call whose estimate alone would pass the budget is refused before it is made.
    elif run.max_model_tokens and (
        used_tokens >= run.max_model_tokens or used_tokens + estimated_tokens > run.max_model_tokens
    ):
        exceeded = f"max_model_tokens ({run.max_model_tokens}) used up"
        name = "max_model_tokens"
    elif run.max_cost_usd and run.cost_usd >= run.max_cost_usd:
        exceeded = f"max_cost_usd ({run.max_cost_usd}) spent"
        name = "max_cost_usd"
    if not exceeded:
        return None
    return ResourceExhausted(
        f"budget exceeded: {exceeded}; the run has ended FAILED (BUDGET_EXCEEDED)",
        reason="BUDGET_EXCEEDED",
        metadata={"budget": name},
    )


def check_step_request(req: StepRequest) -> None:
    """What a BeginStep request must satisfy before anything is read: INVALID_ARGUMENT
    naming each bad field."""
    problems = ViolationCollector()
    if req.type in ("APPROVAL_REQUEST", "CHECKPOINT"):
        problems.add("type", f"{req.type} steps are recorded by the runtime, not begun")
    elif req.type not in COUNTED:
        problems.add("type", "required: MODEL_CALL, TOOL_CALL or COMPLETION_CHECK")
    expected = {
        "MODEL_CALL": "model_call",
        "TOOL_CALL": "tool_call",
        "COMPLETION_CHECK": "completion_check",
    }.get(req.type)
    if expected and req.details != expected:
        problems.add(expected, f"required for a {req.type} step")
    if not req.turn_id:
        problems.add("turn_id", "required: steps are begun inside a turn (BeginTurn)")
    if len(req.operation) > 200:
        problems.add("operation", "at most 200 characters")
    if len(req.idempotency_key) > 200:
        problems.add("idempotency_key", "at most 200 characters")
    if not 0 <= req.estimated_input_tokens <= MAX_STEP_TOKENS:
        problems.add("model_call.estimated_input_tokens", f"must be in [0, {MAX_STEP_TOKENS}]")
    for name, value in (
        ("input_ref", req.input_ref),
        ("model_call.context_digest", req.context_digest),
    ):
        if value and not refs.is_digest(value):
            problems.add(name, "not a sha256 digest")
    if req.type == "TOOL_CALL" and not req.tool:
        problems.add("tool_call.tool", "required")
    if req.type == "COMPLETION_CHECK" and not req.check:
        problems.add("completion_check.check", "required")
    if req.arguments and len(_dumps(req.arguments).encode()) > MAX_INPUT_BYTES:
        problems.add("tool_call.arguments", f"larger than {MAX_INPUT_BYTES} bytes")
    problems.raise_if_any("invalid step")


def check_retry_of(session: Session, run_id: str, retry_of_step_id: str) -> None:
    """The rule for BeginStep's ``retry_of_step_id``: empty, or a step of the same run.

    A retry of another run's step (or of no step) would put a link in this run's ledger, and
    in its audit bundle, that leads out of it. The common path hands every request with a
    ``retry_of_step_id`` to the ORM path (retries are rare), so this is the one check.
    """
    if not retry_of_step_id:
        return
    step_run = session.scalar(sa.select(StepRow.run_id).where(StepRow.id == retry_of_step_id))
    if step_run != run_id:
        raise InvalidArgument.for_field(
            "retry_of_step_id", f"{retry_of_step_id!r} is not a step of run {run_id}"
        )


def step_end(
    status: str,
    *,
    output_ref: str,
    summary: str,
    input_tokens: int,
    output_tokens: int,
    cost_usd: float,
    reported_model_id: str,
    error_class: str,
    error_message: str,
    retryable: bool,
    side_effect: bool,
) -> StepEnd:
    """How a worker says a step ended, checked: INVALID_ARGUMENT naming each bad field."""
    problems = ViolationCollector()
    if status not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        problems.add("status", "required: SUCCEEDED, FAILED or CANCELLED")
    for name, tokens in (
        ("usage.input_tokens", input_tokens),
        ("usage.output_tokens", output_tokens),
    ):
        if not 0 <= tokens <= MAX_STEP_TOKENS:
            problems.add(name, f"must be in [0, {MAX_STEP_TOKENS}] (one step's tokens)")
    # (NaN fails both comparisons.)
    if not 0 <= cost_usd <= MAX_STEP_COST_USD:
        problems.add("usage.cost_usd", f"must be in [0, {MAX_STEP_COST_USD:g}] (one step's cost)")
    if output_ref and not refs.is_digest(output_ref):
        problems.add("output_ref", "not a sha256 digest")
    if len(summary.encode()) > MAX_TEXT:
        problems.add("summary", f"larger than {MAX_TEXT} bytes")
    if len(error_message.encode()) > MAX_TEXT:
        problems.add("error_message", f"larger than {MAX_TEXT} bytes")
    problems.raise_if_any("invalid step outcome")
    return StepEnd(
        status=status,
        output_ref=output_ref,
        summary=summary,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost_usd,
        reported_model_id=reported_model_id[:200],
        error_class=error_class,
        error_message=error_message,
        retryable=retryable,
        side_effect=side_effect,
    )


def resolved_for(bound: BoundDefinition, step: StepRow) -> message_pb2.ResolvedVersions:
    """The contents a worker needs for a step (what the step recorded, with content).

    Kept per bound digest and recorded resolution: both are immutable, and building the
    message (a prompt, skill files, tool schemas as Structs) on every model call cost
    more than recording the step. Callers copy it, never change it.
    """
    key = (bound.digest, step.type, *proto_map.recorded_resolution(step))
    cached = _RESOLVED.get(key)
    if cached is None:
        cached = _build_resolved(bound, step)
        _RESOLVED.put(key, cached)
    return cached


_TYPE_AND_RESOLUTION = operator.itemgetter(
    *(step_sql.STEP_COLUMNS.index(c) for c in ("type", *proto_map.RESOLUTION_COLUMNS))
)


def resolved_for_columns(
    bound: BoundDefinition, columns: Sequence[Any]
) -> message_pb2.ResolvedVersions:
    """:func:`resolved_for` of a step given as its columns (in ``STEP_COLUMNS`` order)."""
    cached = _RESOLVED.get((bound.digest, *_TYPE_AND_RESOLUTION(columns)))
    if cached is None:
        cached = resolved_for(bound, step_sql.step_from_tuple(tuple(columns)))
    return cached


def _build_resolved(bound: BoundDefinition, step: StepRow) -> message_pb2.ResolvedVersions:
    out = message_pb2.ResolvedVersions()
    if step.type == "MODEL_CALL":
        out.model.policy_digest = step.model_policy_digest
        out.model.candidate_name = step.candidate_name
        out.model.reason = enum_pb2.CandidateReason.Value(
            f"CANDIDATE_REASON_{step.candidate_reason}"
        )
        out.model.provider = step.provider
        out.model.model_id = step.requested_model_id
        out.model.parameters.update(json.loads(step.parameters_json))
        out.system_prompt_digest = bound.system_prompt.digest
        out.system_prompt_text = str(bound.system_prompt.spec.get("text", ""))
        for skill in json.loads(step.skills_json):
            pinned = bound.skills[skill["name"]]
            resolved = out.skills.add(
                name=pinned.name,
                version=pinned.version,
                digest=pinned.digest,
                instructions=str(pinned.spec.get("instructions", "")),
            )
            for f in pinned.spec.get("files", []):
                resolved.files.add(path=f["path"], content=str(f.get("content", "")).encode())
    for tool in json.loads(step.tools_json):
        pinned_tool = bound.tools.get(tool["name"])
        if pinned_tool is None:
            continue
        resolved_tool = out.tools.add(
            name=pinned_tool.name,
            version=pinned_tool.version,
            digest=pinned_tool.digest,
            schema_digest=pinned_tool.schema_digest,
            decision=enum_pb2.PermissionDecision.Value(
                f"PERMISSION_DECISION_{tool.get('decision', 'ALLOW')}"
            ),
            side_effect=bool(pinned_tool.spec.get("side_effects")),
        )
        resolved_tool.input_schema.update(pinned_tool.spec.get("input_schema", {}))
        if "output_schema" in pinned_tool.spec:
            resolved_tool.output_schema.update(pinned_tool.spec["output_schema"])
    return out


class CommonPath:
    """BeginStep and EndStep's common case in plain SQL, on a RawTx of a write transaction.

    Used by :class:`StepsService` in the server process and by ``runtime_service.step_process``
    in the step writer process; ``bound`` finds a run's bound definition by digest (None:
    not at hand, so the ORM path takes the step); ``states`` reads the state to check (the
    writer process keeps what it wrote: ``store/step_states.py``).
    """

    def __init__(
        self, bound: Callable[[str], Bound | None], states: StepStates | None = None
    ) -> None:
        self._bound = bound
        self._states = states if states is not None else StepStates()

    def begin(self, tx: RawTx, req: StepRequest) -> StepOutcome | None:
        """BeginStep's common case in plain SQL: a step that is simply recorded and started.

        Returns None, having written nothing, for anything else (a fence that no longer
        holds, a closed turn, a missing blob, a repeated idempotency key, a budget reached,
        a steer waiting, a skill or tool to deny, a tool needing approval, a definition not
        yet cached): the ORM path then handles it, and answers its errors, in one place.
        Both paths build the step, its event and its usage rows with the same functions.
        """
        state = self._states.begin(
            tx, req.attempt_id, req.turn_id, req.idempotency_key, req.input_ref
        )
        now = utcnow()
        if (
            state is None
            or not fence_holds(state, req.attempt_id, req.lease_epoch, now)
            or state.turn_attempt_id != req.attempt_id
            or state.turn_status != "OPEN"
            or (req.input_ref and not state.input_blob)
            or state.keyed_step_id is not None
            or req.retry_of_step_id  # checked by the ORM path (check_retry_of)
        ):
            return None
        cached = self._bound(state.agent_digest)
        estimate = req.estimated_input_tokens if req.type == "MODEL_CALL" else 0
        if cached is None or budget_error(state, estimate) is not None:
            return None
        bound = cached.definition
        step = _step_row(
            req.attempt_id,
            req.turn_id,
            state.last_step_sequence + 1,
            state.input_revision,
            req,
            req.retry_of_step_id,
            now,
            status="STARTED",
            type_=req.type,
            run_id=state.run_id,
        )
        if req.type == "MODEL_CALL":
            if (
                state.pending_steers
                or any(n not in bound.skills for n in req.skills)
                or any(n not in bound.tools for n in req.tools)
            ):
                return None
            _resolve_model(step, bound, req, _choose_model(bound, req), state.permission_ceiling)
        elif req.type == "TOOL_CALL":
            pinned = bound.tools.get(req.tool)
            if pinned is None:
                return None
            decision = resolution.permission(bound, req.tool, state.permission_ceiling)
            if decision != "ALLOW" or resolution.argument_error(pinned, req.arguments):
                return None
            _call_tool(step, req, pinned, [_recorded_tool(pinned, decision)])
        elif req.check in bound.completion_checks:
            step.completion_check = req.check
        else:
            return None
        chain = events.Chain(
            state.thread_id, state.run_id, state.last_event_sequence, state.last_event_hash
        )
        with tx.pipeline():  # the writes: one round trip on PostgreSQL
            step_sql.insert_step(tx, step)
            events.append_raw(tx, chain, step_events.started(step), now)
            step_sql.insert_usages(tx, _usage_rows(step))
            step_sql.advance_run(
                tx,
                state.run_id,
                step.sequence,
                state.step_count + 1,
                chain.last_sequence,
                chain.last_hash,
            )
        self._states.began(state, step, chain.last_sequence, chain.last_hash)
        tx.wake += [notify.run_key(state.run_id), notify.thread_key(state.thread_id)]
        return StepOutcome(step, False, None, [], state.agent_digest)

    def end(
        self, tx: RawTx, attempt_id: str, lease_epoch: int, step_id: str, outcome: StepEnd
    ) -> StepRow | None:
        """EndStep's common case in plain SQL: a started step of this attempt ends.

        Returns None, having written nothing, for anything else (a lost fence, an unknown or
        already ended step, a step of another attempt, a missing blob): the ORM path then
        answers it, as for BeginStep.
        """
        state = self._states.end(tx, attempt_id, step_id, outcome.output_ref)
        now = utcnow()
        if (
            state is None
            or not fence_holds(state, attempt_id, lease_epoch, now)
            or state.step is None
            or state.step.run_id != state.run_id
            or state.step.status != "STARTED"
            or state.step.attempt_id != attempt_id
            or (outcome.output_ref and not state.output_blob)
        ):
            return None
        step = state.step
        step_sql.fill(step, **outcome.changes(step, now))
        chain = events.Chain(
            state.thread_id, state.run_id, state.last_event_sequence, state.last_event_hash
        )
        with tx.pipeline():  # the writes: one round trip on PostgreSQL
            step_sql.end_step(tx, step)
            events.append_raw(tx, chain, step_events.ended(step), now)
            step_sql.add_usage(tx, step, state.run_id, chain.last_sequence, chain.last_hash)
            step_sql.insert_usages(tx, _reported_usage_rows(step))
        self._states.ended(state, step, chain.last_sequence, chain.last_hash)
        tx.wake += [notify.run_key(state.run_id), notify.thread_key(state.thread_id)]
        return step


class StepsService:
    def __init__(self, runtime: Runtime, bound: BoundAgents) -> None:
        self._rt = runtime
        self._bound = bound
        self._common = CommonPath(bound.cached)

    async def _write_recorded(self, fn: Any) -> Any:
        result: Recorded = await self._rt.write(fn)
        if result.error is not None:
            raise result.error
        return result.value

    # -- turns -----------------------------------------------------------------------------

    async def begin_turn(
        self, attempt_id: str, lease_epoch: int, request_id: str
    ) -> tuple[TurnRow, list[InputRow]]:
        def write(session: Session) -> tuple[TurnRow, list[InputRow]]:
            run, attempt = fenced(session, attempt_id, lease_epoch)
            if request_id:
                earlier = session.scalar(
                    sa.select(TurnRow).where(
                        TurnRow.attempt_id == attempt.id, TurnRow.request_id == request_id
                    )
                )
                if earlier is not None:
                    delivered = list(
                        session.scalars(
                            sa.select(InputRow).where(InputRow.delivered_turn_id == earlier.id)
                        )
                    )
                    return earlier, delivered
            if _open_turn(session, attempt) is not None:
                raise FailedPrecondition(
                    "a turn of this attempt is still open: end it first", reason="TURN_OPEN"
                )
            return _start_turn(session, run, attempt, utcnow(), request_id)

        return await self._rt.write(write)

    async def end_turn(
        self, attempt_id: str, lease_epoch: int, turn_id: str
    ) -> tuple[TurnRow, TurnRow | None, list[InputRow]]:
        def write(session: Session) -> tuple[TurnRow, TurnRow | None, list[InputRow]]:
            run, attempt = fenced(session, attempt_id, lease_epoch)
            turn = session.get(TurnRow, turn_id)
            if turn is None or turn.run_id != run.id:
                raise NotFound("turn", turn_id)
            if turn.attempt_id != attempt.id:
                raise FailedPrecondition(
                    "the turn belongs to another attempt", reason="TURN_NOT_OPEN"
                )
            if turn.status != "OPEN":
                following = session.scalar(
                    sa.select(TurnRow).where(
                        TurnRow.run_id == run.id, TurnRow.number == turn.number + 1
                    )
                )
                delivered = (
                    list(
                        session.scalars(
                            sa.select(InputRow).where(InputRow.delivered_turn_id == following.id)
                        )
                    )
                    if following
                    else []
                )
                return turn, following, delivered
            started = session.scalar(
                sa.select(sa.func.count())
                .select_from(StepRow)
                .where(StepRow.turn_id == turn.id, StepRow.status == "STARTED")
            )
            if started:
                raise FailedPrecondition(
                    f"{started} step(s) of the turn are still STARTED: end them first",
                    reason="STEPS_OPEN",
                )
            now = utcnow()
            turn.status, turn.end_time = "ENDED", now
            transitions.append_run_event(
                session,
                run,
                event_pb2.TurnEndedAttributes(turn_id=turn.id, status=enum_pb2.TURN_STATUS_ENDED),
                now,
            )
            if not _pending_inputs(session, run, ("FOLLOW_UP", "STEER")):
                return turn, None, []
            following_turn, delivered = _start_turn(session, run, attempt, now, "")
            return turn, following_turn, delivered

        return await self._rt.write(write)

    # -- inputs ----------------------------------------------------------------------------

    async def send_input(
        self,
        run_id: str,
        kind: str,
        content: str,
        data: dict[str, Any],
        sender: str,
        request_id: str,
    ) -> InputRow:
        problems = ViolationCollector()
        if kind not in ("STEER", "FOLLOW_UP"):
            problems.add("kind", "required: STEER or FOLLOW_UP")
        if not content and not data:
            problems.add("content", "required: text content or structured data")
        if len(request_id) > 128:
            problems.add("request_id", "at most 128 characters")
        problems.raise_if_any("invalid input")
        # Fix: the contract answers an input over the server limit RESOURCE_EXHAUSTED, not
        # INVALID_ARGUMENT (it is well-formed, just too big: put it in a blob).
        size = len(content.encode()) + len(_dumps(data).encode())
        if size > MAX_INPUT_BYTES:
            raise ResourceExhausted(
                f"content and data together are {size} bytes, over the limit of {MAX_INPUT_BYTES}",
                reason="INPUT_TOO_LARGE",
                metadata={"limit": str(MAX_INPUT_BYTES)},
            )
        key = scoped_request_id(run_id, request_id)

        def write(session: Session) -> InputRow:
            if key:
                earlier = session.scalar(sa.select(InputRow).where(InputRow.request_id == key))
                if earlier is not None:
                    return earlier
            run = run_for_update(session, run_id)
            if RunStatus(run.status).terminal:
                raise FailedPrecondition(
                    f"run is {run.status} (it has ended): it takes no more input",
                    reason="RUN_ENDED",
                    metadata={"current_status": run.status},
                )
            now = utcnow()
            item = InputRow(
                id=new_id("inp"),
                run_id=run.id,
                kind=kind,
                content=content,
                data_json=_dumps(data),
                sender=sender[:200],
                create_time=now,
                status="PENDING",
                delivered_step_id="",
                delivered_turn_id="",
                deliver_time=None,
                request_id=key,
            )
            session.add(item)
            run.update_time = now
            transitions.append_run_event(
                session,
                run,
                event_pb2.InputReceivedAttributes(
                    input_id=item.id,
                    kind=enum_pb2.InputKind.Value(f"INPUT_KIND_{kind}"),
                    sender=item.sender,
                ),
                now,
            )
            return item

        return await self._rt.write(write)

    # -- steps -----------------------------------------------------------------------------

    async def _definition(self, digest: str) -> BoundDefinition:
        bound = self._bound.cached(digest)
        if bound is None:
            bound = await self._rt.read(lambda session: self._bound.get(session, digest))
        return bound.definition

    async def resolved_elsewhere(
        self, columns: Sequence[Any], agent_digest: str
    ) -> message_pb2.ResolvedVersions:
        """What a BeginStep the step writer process recorded resolved to, with content: from
        its step's columns and the run's agent, whose definition has the contents."""
        return resolved_for_columns(await self._definition(agent_digest), columns)

    async def _with_resolution(self, outcome: StepOutcome) -> StepOutcome:
        """Add to a step the common path recorded what it resolved to, with content."""
        outcome.resolved = resolved_for(await self._definition(outcome.agent_digest), outcome.step)
        return outcome

    async def begin_step(self, req: StepRequest) -> StepOutcome:
        check_step_request(req)
        fast = await self._rt.write_raw(lambda tx: self._common.begin(tx, req))
        if fast is not None:
            return await self._with_resolution(fast)
        return await self._write_recorded(lambda session: self._begin_step(session, req))  # type: ignore[no-any-return]

    def _begin_step(self, session: Session, req: StepRequest) -> Recorded:
        run, attempt = fenced(session, req.attempt_id, req.lease_epoch)
        turn = session.get(TurnRow, req.turn_id)
        if turn is None or turn.attempt_id != attempt.id or turn.status != "OPEN":
            raise FailedPrecondition(
                f"turn {req.turn_id} is not the open turn of this attempt", reason="TURN_NOT_OPEN"
            )
        if req.input_ref:
            require_blob(session, req.input_ref, "input_ref")
        check_retry_of(session, run.id, req.retry_of_step_id)
        b = _Begin(
            session,
            run,
            attempt,
            turn,
            self._bound.get(session, run.agent_digest).definition,
            req,
            req.retry_of_step_id,
            utcnow(),
        )
        if req.idempotency_key:
            earlier = session.scalar(
                sa.select(StepRow)
                .where(
                    StepRow.run_id == run.id,
                    StepRow.idempotency_key == req.idempotency_key,
                    StepRow.idempotency_key != "",  # the index is partial
                )
                .order_by(StepRow.sequence.desc())
                .limit(1)
            )
            if earlier is not None:
                reused = self._reuse(b, earlier)
                if reused is not None:
                    return reused
                b.retry_of = b.retry_of or earlier.id
        exceeded = budget_error(run, req.estimated_input_tokens if req.type == "MODEL_CALL" else 0)
        if exceeded is not None:
            transitions.apply(
                session,
                run,
                Trigger.BUDGET,
                Actor.RUNTIME,
                b.now,
                attempt=attempt,
                message=exceeded.message,
                error_class="BUDGET_EXCEEDED",
                error_message=exceeded.message,
            )
            return Recorded(None, exceeded)
        if req.type == "MODEL_CALL":
            return self._model_call(b)
        if req.type == "TOOL_CALL":
            return self._tool_call(b)
        if req.check not in b.bound.completion_checks:
            raise InvalidArgument.for_field(
                "completion_check.check",
                f"{req.check!r} is not a check of the bound completion policy "
                f"({', '.join(b.bound.completion_checks) or 'none'})",
            )
        step = self._new_step(b, status="STARTED")
        step.completion_check = req.check
        self._started(session, run, step, b.now)
        return Recorded(StepOutcome(step, False, message_pb2.ResolvedVersions(), []))

    def _reuse(self, b: _Begin, earlier: StepRow) -> Recorded | None:
        """The answer for a repeated idempotency key, or None to create a (retry) step."""
        if earlier.type == "APPROVAL_REQUEST":
            if not earlier.approval_decision:
                return Recorded(StepOutcome(earlier, True, None, []))
            # The decision is in: the resumed attempt now gets the tool call itself.
            return self._after_approval(b, earlier)
        if earlier.status in ("SUCCEEDED", "DENIED", "WAITING_APPROVAL") or (
            earlier.status == "STARTED" and earlier.attempt_id == b.attempt.id
        ):
            # Fix: an existing step is returned "with its original resolution and inputs";
            # without the steers it consumed, a worker that lost the first response would
            # never see them (they are delivered exactly once, to this step).
            steers = list(
                b.session.scalars(
                    sa.select(InputRow)
                    .where(InputRow.delivered_step_id == earlier.id)
                    .order_by(InputRow.create_time, InputRow.id)
                )
            )
            return Recorded(StepOutcome(earlier, True, resolved_for(b.bound, earlier), steers))
        return None

    def _new_step(self, b: _Begin, *, status: str, type_: str = "") -> StepRow:
        run = b.run
        run.last_step_sequence += 1
        type_ = type_ or b.req.type
        if type_ in COUNTED:
            run.step_count += 1
        # Not added to the session: _started inserts it with one Core statement once every
        # field is set (an ORM unit-of-work flush of a 45-column row cost more than the rest
        # of BeginStep).
        return _step_row(
            b.attempt.id,
            b.turn.id,
            run.last_step_sequence,
            run.input_revision,
            b.req,
            b.retry_of,
            b.now,
            status=status,
            type_=type_,
            run_id=run.id,
        )

    def _started(self, session: Session, run: RunRow, step: StepRow, now: dt.datetime) -> None:
        """Insert the (fully built) step and record ``step.started`` (and ``step.ended`` for
        a step that is born ended, such as a denial), plus its usage index rows."""
        session.execute(_INSERT_STEP, {k: getattr(step, k) for k in step_sql.STEP_COLUMNS})
        transitions.append_run_event(session, run, step_events.started(step), now)
        if step.status != "STARTED":
            self._ended_event(session, run, step, now)
        rows = _usage_rows(step)
        if rows:
            session.execute(_INSERT_USAGE, rows)

    def _ended_event(self, session: Session, run: RunRow, step: StepRow, now: dt.datetime) -> None:
        transitions.append_run_event(session, run, step_events.ended(step), now)

    def _deny(
        self,
        b: _Begin,
        *,
        message: str,
        error: AgentrtError,
        status: str = "DENIED",
        error_class: str = "PERMISSION_DENIED",
        tools: list[dict[str, Any]] | None = None,
    ) -> Recorded:
        """Record a refused step (the issue wants denials kept), then answer ``error``."""
        step = self._new_step(b, status=status)
        step.error_class, step.error_message = error_class, message
        step.tool_name = b.req.tool
        step.tool_arguments_json = _dumps(b.req.arguments)
        step.tools_json = _dumps(tools or [])
        self._started(b.session, b.run, step, b.now)
        error.metadata["step_id"] = step.id
        return Recorded(StepOutcome(step, False, None, []), error)

    def _model_call(self, b: _Begin) -> Recorded:
        req, bound = b.req, b.bound
        unknown = [f"skill {s}" for s in req.skills if s not in bound.skills]
        unknown += [f"tool {t}" for t in req.tools if t not in bound.tools]
        if unknown:
            message = (
                f"not in the bound definition {bound.agent_id}@{bound.version_label}: "
                + ", ".join(unknown)
            )
            return self._deny(
                b,
                message=message,
                error=PermissionDenied(
                    message, reason="NOT_IN_DEFINITION", metadata={"denied": ",".join(unknown)}
                ),
            )
        choice = _choose_model(bound, req)
        step = self._new_step(b, status="STARTED")
        _resolve_model(step, bound, req, choice, b.run.permission_ceiling)
        steers = _pending_inputs(b.session, b.run, ("STEER",))
        step.consumed_input_ids_json = _dumps([i.id for i in steers])
        self._started(b.session, b.run, step, b.now)
        _deliver(b.session, b.run, steers, b.now, turn_id=b.turn.id, step_id=step.id)
        return Recorded(StepOutcome(step, False, resolved_for(bound, step), steers))

    def _tool_call(self, b: _Begin) -> Recorded:
        req, bound = b.req, b.bound
        pinned = bound.tools.get(req.tool)
        if pinned is None:
            where = f"{bound.agent_id}@{bound.version_label}"
            message = f"tool {req.tool!r} is not in the bound definition {where}"
            return self._deny(
                b,
                message=message,
                error=PermissionDenied(
                    message, reason="NOT_IN_DEFINITION", metadata={"tool": req.tool}
                ),
            )
        decision = resolution.permission(bound, req.tool, b.run.permission_ceiling)
        tools = [_recorded_tool(pinned, decision)]
        if decision == "DENY":
            message = f"tool {req.tool!r} is denied by the permission policy or the run's ceiling"
            return self._deny(
                b,
                message=message,
                tools=tools,
                error=PermissionDenied(message, reason="TOOL_DENIED", metadata={"tool": req.tool}),
            )
        problem = resolution.argument_error(pinned, req.arguments)
        if problem is not None:
            message = (
                f"arguments do not match the schema of {pinned.name}@{pinned.version}: {problem}"
            )
            error = InvalidArgument.for_field(
                f"tool_call.arguments{problem.split(':')[0][1:]}", message
            )
            return self._deny(
                b,
                message=message,
                status="FAILED",
                error_class="INVALID_ARGUMENTS",
                tools=tools,
                error=error,
            )
        if decision == "REQUIRE_APPROVAL":
            step = self._new_step(b, status="WAITING_APPROVAL", type_="APPROVAL_REQUEST")
            step.tool_name = req.tool
            step.tool_arguments_json = _dumps(req.arguments)
            step.tools_json = _dumps(tools)
            self._started(b.session, b.run, step, b.now)
            transitions.append_run_event(
                b.session,
                b.run,
                event_pb2.ApprovalRequestedAttributes(step_id=step.id, tool_name=req.tool),
                b.now,
            )
            return Recorded(StepOutcome(step, False, resolved_for(bound, step), []))
        step = self._new_step(b, status="STARTED")
        _call_tool(step, req, pinned, tools)
        self._started(b.session, b.run, step, b.now)
        return Recorded(StepOutcome(step, False, resolved_for(bound, step), []))

    def _after_approval(self, b: _Begin, approval: StepRow) -> Recorded:
        following = b.session.scalar(
            sa.select(StepRow).where(
                StepRow.approval_step_id == approval.id, StepRow.type == "TOOL_CALL"
            )
        )
        if following is not None:
            return Recorded(StepOutcome(following, True, resolved_for(b.bound, following), []))
        approved = approval.approval_decision == "APPROVE"
        call = dataclasses.replace(
            b.req, tool=approval.tool_name, arguments=json.loads(approval.tool_arguments_json)
        )
        step = self._new_step(
            dataclasses.replace(b, req=call, retry_of=""),
            status="STARTED" if approved else "DENIED",
        )
        step.tool_name = approval.tool_name
        step.tool_arguments_json = approval.tool_arguments_json
        step.tools_json = approval.tools_json
        step.approval_step_id = approval.id
        approved_tool = b.bound.tools.get(approval.tool_name)
        if approved:
            step.side_effect = bool(approved_tool and approved_tool.spec.get("side_effects"))
        else:
            # A denial is the tool's result for the agent, not a failure of the run.
            step.error_class = "PERMISSION_DENIED"
            step.error_message = (
                f"denied by {approval.approver}: {approval.approval_comment}".strip()
            )
        self._started(b.session, b.run, step, b.now)
        return Recorded(StepOutcome(step, False, resolved_for(b.bound, step), []))

    async def end_step(
        self, attempt_id: str, lease_epoch: int, step_id: str, outcome: StepEnd
    ) -> StepRow:
        """End a step as ``outcome`` (built, and so validated, by :func:`step_end`)."""
        fast = await self._rt.write_raw(
            lambda tx: self._common.end(tx, attempt_id, lease_epoch, step_id, outcome)
        )
        if fast is not None:
            return fast

        def write(session: Session) -> StepRow:
            run, attempt = fenced(session, attempt_id, lease_epoch)
            step = session.get(StepRow, step_id)
            if step is None or step.run_id != run.id:
                raise NotFound("step", step_id)
            if step.status != "STARTED":
                if outcome.repeats(step):
                    return step  # a repeated EndStep: nothing changes
                raise FailedPrecondition(
                    f"step {step_id} already ended {step.status}; it cannot end {outcome.status}",
                    reason="STEP_ENDED",
                    metadata={"current_status": step.status},
                )
            if step.attempt_id != attempt.id:
                raise FailedPrecondition(
                    "the step belongs to another attempt", reason="STEP_OF_OTHER_ATTEMPT"
                )
            if outcome.output_ref:
                require_blob(session, outcome.output_ref, "output_ref")
            now = utcnow()
            for key, value in outcome.changes(step, now).items():
                setattr(step, key, value)  # a loaded row: the ORM flushes what changed
            for owner in (attempt, run):
                owner.input_tokens += outcome.input_tokens
                owner.output_tokens += outcome.output_tokens
                owner.cost_usd += outcome.cost_usd
            self._ended_event(session, run, step, now)
            rows = _reported_usage_rows(step)
            if rows:
                session.execute(_INSERT_USAGE, rows)
            return step

        return await self._rt.write(write)

    # -- approvals -------------------------------------------------------------------------

    async def resolve_approval(
        self, run_id: str, step_id: str, decision: str, approver: str, comment: str
    ) -> tuple[StepRow, RunRow]:
        problems = ViolationCollector()
        if decision not in ("APPROVE", "DENY"):
            problems.add("decision", "required: APPROVE or DENY")
        if not approver:
            problems.add("approver", "required: who decided")
        if len(comment.encode()) > MAX_TEXT:
            problems.add("comment", f"larger than {MAX_TEXT} bytes")
        problems.raise_if_any("invalid approval")

        def write(session: Session) -> tuple[StepRow, RunRow]:
            run = run_for_update(session, run_id)
            step = session.get(StepRow, step_id)
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
                    reason="APPROVAL_RESOLVED",
                )
            # Fix: an ended run takes no decision (RUN_ENDED); recording one would also append
            # `approval.resolved` after `run.ended`, which must stay the run's last event.
            if RunStatus(run.status).terminal:
                raise FailedPrecondition(
                    f"run is {run.status} (it has ended): its approvals can no longer be resolved",
                    reason="RUN_ENDED",
                    metadata={"current_status": run.status},
                )
            now = utcnow()
            step.approval_decision, step.approver = decision, approver[:200]
            step.approval_comment, step.approval_time = comment, now
            step.status = "SUCCEEDED" if decision == "APPROVE" else "DENIED"
            step.end_time = now
            transitions.append_run_event(
                session,
                run,
                event_pb2.ApprovalResolvedAttributes(
                    step_id=step.id,
                    decision=enum_pb2.ApprovalDecision.Value(f"APPROVAL_DECISION_{decision}"),
                    approver=step.approver,
                    comment=comment,
                ),
                now,
            )
            if run.status == RunStatus.WAITING_APPROVAL.value:
                transitions.apply(
                    session,
                    run,
                    Trigger.RESOLVE_APPROVAL,
                    Actor.CLIENT,
                    now,
                    message=f"approval {decision.lower()} by {approver}",
                )
            return step, run

        return await self._rt.write(write)

    # -- checkpoints and artifacts ---------------------------------------------------------

    async def write_checkpoint(
        self,
        attempt_id: str,
        lease_epoch: int,
        state_ref: str,
        after_sequence: int,
        request_id: str,
    ) -> CheckpointRow:
        if after_sequence < 0:
            raise InvalidArgument.for_field("after_sequence", "must not be negative")

        key = scoped_request_id(attempt_id, request_id)

        def write(session: Session) -> CheckpointRow:
            if key:
                earlier = session.scalar(
                    sa.select(CheckpointRow).where(CheckpointRow.request_id == key)
                )
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, attempt_id, lease_epoch)
            require_blob(session, state_ref, "state_ref")
            if after_sequence > run.last_step_sequence:
                raise InvalidArgument.for_field(
                    "after_sequence", f"beyond the run's last step ({run.last_step_sequence})"
                )
            now = utcnow()
            turn = _open_turn(session, attempt)
            run.last_step_sequence += 1
            step = StepRow(
                **{
                    **blank_step(),
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
                request_id=key,
            )
            session.add(checkpoint)
            run.latest_checkpoint_id = checkpoint.id
            self._started(session, run, step, now)
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

        return await self._rt.write(write)

    async def create_artifact(
        self,
        attempt_id: str,
        lease_epoch: int,
        step_id: str,
        name: str,
        blob_digest: str,
        media_type: str,
        labels: dict[str, str],
        request_id: str,
    ) -> ArtifactRow:
        problems = ViolationCollector()
        if not name or len(name) > 512:
            problems.add("name", "required, at most 512 characters")
        if not step_id:
            problems.add("step_id", "required: the step that made the artifact")
        if len(labels) > 64:
            problems.add("labels", "at most 64 entries")
        problems.raise_if_any("invalid artifact")

        key = scoped_request_id(attempt_id, request_id)

        def write(session: Session) -> ArtifactRow:
            if key:
                earlier = session.scalar(
                    sa.select(ArtifactRow).where(ArtifactRow.request_id == key)
                )
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, attempt_id, lease_epoch)
            step = session.get(StepRow, step_id)
            if step is None or step.run_id != run.id:
                raise NotFound("step", step_id)
            if step.attempt_id != attempt.id:
                raise InvalidArgument.for_field("step_id", "a step of another attempt")
            require_blob(session, blob_digest, "blob_digest")
            blob = session.get(BlobRow, blob_digest)
            now = utcnow()
            artifact = ArtifactRow(
                id=new_id("art"),
                run_id=run.id,
                thread_id=run.thread_id,
                attempt_id=attempt.id,
                step_id=step.id,
                name=name,
                blob_digest=blob_digest,
                media_type=media_type or (blob.media_type if blob else ""),
                size=blob.size if blob else 0,
                labels_json=_dumps(labels),
                create_time=now,
                request_id=key,
            )
            session.add(artifact)
            transitions.append_run_event(
                session,
                run,
                event_pb2.ArtifactCreatedAttributes(
                    artifact_id=artifact.id,
                    step_id=step.id,
                    name=name,
                    blob_digest=blob_digest,
                    media_type=artifact.media_type,
                ),
                now,
            )
            return artifact

        return await self._rt.write(write)

    # -- reads -----------------------------------------------------------------------------

    async def list_steps(
        self, run_id: str, attempt_id: str, turn_id: str, page_size: int, page_token: str
    ) -> tuple[list[StepRow], str]:
        filters = {"run_id": run_id, "attempt_id": attempt_id, "turn_id": turn_id}
        page = page_request(page_size, page_token, filters, key=(int,), default=100)

        def read(session: Session) -> tuple[list[StepRow], str]:
            if session.get(RunRow, run_id) is None:
                raise NotFound("run", run_id)
            stmt = sa.select(StepRow).where(StepRow.run_id == run_id)
            if attempt_id:
                stmt = stmt.where(StepRow.attempt_id == attempt_id)
            if turn_id:
                stmt = stmt.where(StepRow.turn_id == turn_id)
            if page.after is not None:
                stmt = stmt.where(StepRow.sequence > page.after[0])
            rows = session.scalars(stmt.order_by(StepRow.sequence).limit(page.size + 1)).all()
            return cut_page(rows, page.size, filters, lambda r: [r.sequence])

        return await self._rt.read(read)

    async def get_step(self, step_id: str) -> StepRow:
        def read(session: Session) -> StepRow:
            step = session.get(StepRow, step_id)
            if step is None:
                raise NotFound("step", step_id)
            return step

        return await self._rt.read(read)

    async def list_artifacts(
        self, run_id: str, thread_id: str, page_size: int, page_token: str
    ) -> tuple[list[ArtifactRow], str]:
        if bool(run_id) == bool(thread_id):
            raise InvalidArgument.for_field("run_id", "exactly one of run_id and thread_id")
        filters = {"run_id": run_id, "thread_id": thread_id}
        page = page_request(page_size, page_token, filters, key=(str,), default=100)

        def read(session: Session) -> tuple[list[ArtifactRow], str]:
            stmt = sa.select(ArtifactRow)
            stmt = (
                stmt.where(ArtifactRow.run_id == run_id)
                if run_id
                else stmt.where(ArtifactRow.thread_id == thread_id)
            )
            if page.after is not None:
                stmt = stmt.where(ArtifactRow.id > page.after[0])
            rows = session.scalars(stmt.order_by(ArtifactRow.id).limit(page.size + 1)).all()
            return cut_page(rows, page.size, filters, lambda r: [r.id])

        return await self._rt.read(read)


def blank_step() -> dict[str, Any]:
    """Every step column a new step leaves at its default (the generator in
    ``bench/audit_bench.py`` starts from it too)."""
    return {
        "turn_id": "",
        "operation": "",
        "idempotency_key": "",
        "input_ref": "",
        "output_ref": "",
        "summary": "",
        "end_time": None,
        "error_class": "",
        "error_message": "",
        "retryable": False,
        "retry_of_step_id": "",
        "side_effect": False,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "consumed_input_ids_json": "[]",
        "tool_name": "",
        "tool_arguments_json": "{}",
        "approval_decision": "",
        "approver": "",
        "approval_comment": "",
        "approval_time": None,
        "approval_step_id": "",
        "completion_check": "",
        "model_policy_digest": "",
        "candidate_name": "",
        "candidate_reason": "",
        "provider": "",
        "requested_model_id": "",
        "parameters_json": "{}",
        "reported_model_id": "",
        "system_prompt_digest": "",
        "context_digest": "",
        "skills_json": "[]",
        "tools_json": "[]",
    }


#: blank_step() once: its values are immutable, so new steps can share them.
_BLANK_STEP = blank_step()
