"""Every rule of BeginStep and EndStep, once, as pure functions.

Given what was read (:class:`BeginView` / :class:`EndView`: the run and attempt, the turn,
the step a repeated idempotency key names, whether a blob exists), the run's bound
definition and the request, :func:`decide_begin` and :func:`decide_end` return a decision:

* :class:`Refuse`: answer an error, write nothing (a lost fence, a turn not open, a missing
  blob, a completion check not in the policy, no model candidate left, ...);
* :class:`Reuse`: a repeated idempotency key names a step that already answers the call;
* :class:`Record`: record a new step, complete, and answer it (or, for a denial the ledger
  keeps, answer the error with it after the commit); it may also deliver the run's pending
  steers to the step, or request an approval;
* :class:`StopOnBudget`: the run has used up a budget: it ends FAILED (BUDGET_EXCEEDED);
* :class:`StopOnFailedSteps`: the attempt's steps failed too often in a row: it ends FAILED
  (FAILED_STEP_LIMIT), and the run is retried if attempts remain;
* :class:`End` / :class:`Unchanged` for EndStep.

This module holds the requests, the views, the decisions and the budget and usage rules;
``step_decide`` holds the two functions that decide. No SQL, no protobuf, no I/O:
``store/steps.py`` reads the views and applies the decisions, ``step_engine`` puts the three
together, the transport maps the result. Adding a rule, or a field a rule sets, happens here
and in ``step_decide``, nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrt_core import reasons, refs
from agentrt_core.errors import (
    AgentrtError,
    ResourceExhausted,
    ViolationCollector,
)
from runtime_service.fence import FenceClaim
from runtime_service.records import Step

#: Step types a worker begins, counted against ``max_steps``.
COUNTED = ("MODEL_CALL", "TOOL_CALL", "COMPLETION_CHECK")
#: The most a thread message or a run input may carry (content and data together).
MAX_INPUT_BYTES = 256 * 1024
MAX_TEXT = 64 * 1024
#: What one step may report using: far beyond any model call (2^40 tokens, a billion
#: dollars), and small enough that a run's totals, which add up at most MAX_RUN_STEPS steps,
#: stay within the 64-bit columns that hold them (2^22 * 2^40 = 2^62) and a finite float.
MAX_STEP_TOKENS = 1 << 40
MAX_STEP_COST_USD = 1e9
#: The runtime's own ceiling on a run's counted steps, whatever its max_steps budget says:
#: what keeps usage totals from overflowing (above).
MAX_RUN_STEPS = 1 << 22
#: The most steps of one attempt that may end FAILED in a row. A worker that calls a dead
#: provider again and again, without backing off or giving up, is stopped here whatever SDK
#: it uses: its next BeginStep ends the attempt (issue 27 saw 2,508 failed model calls in
#: 44 s). The Python SDK gives up on a model call after a handful of tries (RetryPolicy), far
#: below this; agent logic that handles a failure and goes on resets the count with any
#: success.
MAX_FAILED_STEPS_IN_A_ROW = 20


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


# -- requests --------------------------------------------------------------------------


def input_too_large(content: str, data: dict[str, Any]) -> ResourceExhausted | None:
    """The refusal of a message or input over :data:`MAX_INPUT_BYTES`, its content and its
    data (as JSON, when there is any) together (well-formed, only too big:
    ``RESOURCE_EXHAUSTED``, put it in a blob), or None."""
    size = len(content.encode()) + (len(dumps(data).encode()) if data else 0)
    if size <= MAX_INPUT_BYTES:
        return None
    return ResourceExhausted(
        f"content and data together are {size} bytes, over the limit of {MAX_INPUT_BYTES}",
        reason=reasons.INPUT_TOO_LARGE,
        metadata={"limit": str(MAX_INPUT_BYTES)},
    )


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
    skills: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    context_digest: str = ""
    # TOOL_CALL
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    # COMPLETION_CHECK
    check: str = ""
    #: Which of the request's ``details`` is set ("model_call", "tool_call", ...).
    details: str = ""
    #: The fence's secret token (``fence.FenceClaim``); never in a repr (a log line).
    lease_token: str = field(default="", repr=False)

    @property
    def fence(self) -> FenceClaim:
        return FenceClaim(self.attempt_id, self.lease_epoch, self.lease_token)

    @property
    def estimate(self) -> int:
        """The tokens a budget check counts in advance (a model call's estimate)."""
        return self.estimated_input_tokens if self.type == "MODEL_CALL" else 0


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
    if req.arguments and len(dumps(req.arguments).encode()) > MAX_INPUT_BYTES:
        problems.add("tool_call.arguments", f"larger than {MAX_INPUT_BYTES} bytes")
    problems.raise_if_any("invalid step")


#: The step fields EndStep sets, listed once: ``decide_end`` sets no others and
#: ``store/steps.py`` writes exactly these (a field added here is stored; one set without
#: being added here fails ``tests/unit/test_step_rules.py``).
END_FIELDS = (
    "status",
    "end_time",
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


@dataclass(frozen=True)
class StepEnd:
    """How a worker says a step ended (EndStep), checked by :func:`step_end`."""

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

    def repeats(self, step: Step) -> bool:
        """Whether an ended step already ended this way (a repeated EndStep is a no-op)."""
        return (step.status, step.output_ref, step.input_tokens, step.output_tokens) == (
            self.status,
            self.output_ref,
            self.input_tokens,
            self.output_tokens,
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


# -- what was read ---------------------------------------------------------------------


@dataclass(slots=True)
class RunView:
    """A run and the attempt a fence names, as read under the run's lock: the fence, the
    budgets, the counters, the usage totals and the event-chain head.

    ``store/steps.py`` writes the counters, totals and chain head back into it as it
    applies a decision, so it stays what a read would return now (the step writer keeps it
    between calls: ``store/step_states.py``)."""

    run_id: str
    thread_id: str
    run_status: str
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
    pending_steers: int
    attempt_status: str
    lease_expire_time: Any  # dt.datetime (Any: the slots dataclass is built positionally)
    lease_token_hash: str
    attempt_input_tokens: int
    attempt_output_tokens: int
    attempt_cost_usd: float
    #: The attempt's steps FAILED in a row (:func:`failed_in_a_row`).
    attempt_failed_in_a_row: int
    #: The attempt's ``traceparent``: its steps' spans are in its trace.
    attempt_traceparent: str


@dataclass(frozen=True, slots=True)
class PriorModelCall:
    """The attempt's latest MODEL_CALL step, as the ledger holds it: what a model call's
    fallback follows when it FAILED (``step_decide._model_call``)."""

    step_id: str
    status: str
    error_class: str
    candidate_name: str

    @staticmethod
    def of(step: Step) -> PriorModelCall:
        return PriorModelCall(step.id, step.status, step.error_class, step.candidate_name)


@dataclass(slots=True)
class BeginView:
    run: RunView | None
    #: The request's turn (None: no such turn): its attempt and status.
    turn_attempt_id: str | None = None
    turn_status: str | None = None
    #: The request's input_ref names a stored blob.
    input_blob: bool = False
    #: The run of the step ``retry_of_step_id`` names (None: no such step, or none named).
    retry_of_run_id: str | None = None
    #: The latest step of the run begun with the request's idempotency key.
    keyed: Step | None = None
    #: For a keyed APPROVAL_REQUEST: the TOOL_CALL step that followed its decision.
    keyed_follower_id: str | None = None
    #: For a MODEL_CALL request: the attempt's latest MODEL_CALL step (None: there is none;
    #: not read for other requests).
    last_model_call: PriorModelCall | None = None


@dataclass(slots=True)
class EndView:
    run: RunView | None
    step: Step | None = None
    output_blob: bool = False


# -- decisions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refuse:
    error: AgentrtError


@dataclass(frozen=True, slots=True)
class Reuse:
    """Answer an existing step (``existing``); ``with_steers``: with the steers it consumed."""

    step_id: str
    with_steers: bool


@dataclass(frozen=True, slots=True)
class StopOnBudget:
    error: ResourceExhausted


@dataclass(frozen=True, slots=True)
class StopOnFailedSteps:
    error: ResourceExhausted


@dataclass(slots=True)
class Record:
    step: Step
    #: The step consumes the run's pending steers (the store fills in which).
    deliver_steers: bool = False
    #: The step is an APPROVAL_REQUEST (its own event follows ``step.started``).
    approval_requested: bool = False
    #: Answered after the commit: the ledger keeps the step, the caller gets the error.
    error: AgentrtError | None = None


BeginDecision = Refuse | Reuse | StopOnBudget | StopOnFailedSteps | Record


@dataclass(slots=True)
class End:
    step: Step  # the step as it ended


@dataclass(frozen=True, slots=True)
class Unchanged:
    step: Step  # a repeated EndStep: the step as it already ended


EndDecision = Refuse | End | Unchanged


# -- budgets and usage -----------------------------------------------------------------


class Budgeted(Protocol):
    """What a budget check reads: a run row, or a :class:`RunView`."""

    @property
    def max_steps(self) -> int: ...
    @property
    def max_model_tokens(self) -> int: ...
    @property
    def max_cost_usd(self) -> float: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def step_count(self) -> int: ...


def budget_error(run: Budgeted, estimated_tokens: int = 0) -> ResourceExhausted | None:
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
        reason=reasons.BUDGET_EXCEEDED,
        metadata={"budget": name},
    )


def failed_in_a_row(previous: int, status: str) -> int:
    """An attempt's count of steps FAILED in a row, once one of its steps is ``status``:
    a failure adds one, a success starts again from nothing, anything else (a step begun, a
    denial, an approval wait) leaves it."""
    if status == "FAILED":
        return previous + 1
    if status == "SUCCEEDED":
        return 0
    return previous


def failed_step_limit_error(failed: int) -> ResourceExhausted | None:
    """The error that ends an attempt whose last ``failed`` steps all FAILED, or None."""
    if failed < MAX_FAILED_STEPS_IN_A_ROW:
        return None
    return ResourceExhausted(
        f"the last {failed} steps of this attempt failed, the runtime's limit of failed steps"
        " in a row: the attempt has ended FAILED and the run is retried if it has attempts"
        " left; back off between calls to a failing provider, and give up after a few tries",
        reason=reasons.FAILED_STEP_LIMIT,
        metadata={"failed_in_a_row": str(failed), "limit": str(MAX_FAILED_STEPS_IN_A_ROW)},
    )
