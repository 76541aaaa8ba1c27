"""The step rules (``step_decide``), value by value: every decision kind of BeginStep and
EndStep from plain views, no database, and properties over random views and requests (the
decisions that write are exactly those whose fence holds, whose turn is open, ...)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt_core.errors import (
    FailedPrecondition,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PermissionDenied,
)
from agentrt_core.resolution import BoundDefinition, Pinned
from runtime_service.fence import FenceClaim, token_hash
from runtime_service.records import BLANK_STEP, STEP_FIELDS, Step, new_step
from runtime_service.step_decide import decide_begin, decide_end
from runtime_service.step_rules import (
    END_FIELDS,
    MAX_FAILED_STEPS_IN_A_ROW,
    BeginView,
    End,
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
    failed_in_a_row,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
TOKEN = "the-workers-secret"
FENCE = FenceClaim("att_1", 3, TOKEN)
DIGEST = "sha256:" + "a" * 64

BOUND = BoundDefinition(
    digest="sha256:" + "b" * 64,
    agent_id="coding_agent",
    version_label="v1",
    system_prompt=Pinned("prompt", "1", "sha256:" + "c" * 64, {"text": "be careful"}),
    model_policy=Pinned(
        "models",
        "1",
        "sha256:" + "d" * 64,
        {
            "candidates": [
                {
                    "name": "primary",
                    "provider": "p",
                    "model_id": "m1",
                    "fallback_on": ["RATE_LIMITED"],
                },
                {"name": "fallback", "provider": "p", "model_id": "m2"},
            ]
        },
    ),
    skills={"search": Pinned("search", "2", "sha256:" + "e" * 64, {"instructions": "look"})},
    tools={
        "read_file": Pinned(
            "read_file",
            "1",
            "sha256:" + "f" * 64,
            {
                "input_schema": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                }
            },
            schema_digest="sha256:" + "1" * 64,
        ),
        "apply_patch": Pinned(
            "apply_patch", "1", "sha256:" + "2" * 64, {"side_effects": True}, "sha256:" + "3" * 64
        ),
        "rm_rf": Pinned("rm_rf", "1", "sha256:" + "4" * 64, {"side_effects": True}),
    },
    permission_policy=Pinned(
        "perms",
        "1",
        "sha256:" + "5" * 64,
        {
            "default_decision": "ALLOW",
            "rules": [
                {"tool": "apply_patch", "decision": "REQUIRE_APPROVAL"},
                {"tool": "rm_rf", "decision": "DENY"},
            ],
        },
    ),
    completion_policy=Pinned("done", "1", "sha256:" + "6" * 64, {"checks": [{"name": "tests"}]}),
)


def run_view(**over: Any) -> RunView:
    values: dict[str, Any] = {
        "run_id": "run_1",
        "thread_id": "thr_1",
        "run_status": "RUNNING",
        "current_attempt_id": "att_1",
        "lease_epoch": 3,
        "agent_digest": BOUND.digest,
        "permission_ceiling": "FULL",
        "max_steps": 0,
        "max_model_tokens": 0,
        "max_cost_usd": 0.0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "step_count": 4,
        "last_step_sequence": 6,
        "input_revision": 1,
        "last_event_sequence": 20,
        "last_event_hash": "h",
        "pending_steers": 0,
        "attempt_status": "RUNNING",
        "lease_expire_time": NOW + dt.timedelta(seconds=30),
        "lease_token_hash": token_hash(TOKEN),
        "attempt_input_tokens": 0,
        "attempt_output_tokens": 0,
        "attempt_cost_usd": 0.0,
        "attempt_failed_in_a_row": 0,
        "attempt_traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    }
    values.update(over)
    return RunView(**values)


def view(run: RunView | None = None, **over: Any) -> BeginView:
    values: dict[str, Any] = {"turn_attempt_id": "att_1", "turn_status": "OPEN"}
    values.update(over)
    return BeginView(run if run is not None else run_view(), **values)


def request(type_: str = "MODEL_CALL", **over: Any) -> StepRequest:
    details = {"MODEL_CALL": "model_call", "TOOL_CALL": "tool_call"}.get(type_, "completion_check")
    values: dict[str, Any] = {
        "attempt_id": "att_1",
        "lease_epoch": 3,
        "turn_id": "trn_1",
        "type": type_,
        "operation": "",
        "idempotency_key": "",
        "input_ref": "",
        "retry_of_step_id": "",
        "details": details,
        "lease_token": TOKEN,
    }
    values.update(over)
    return StepRequest(**values)


def earlier(**over: Any) -> Step:
    return new_step(
        {
            **BLANK_STEP,
            "id": "stp_0",
            "run_id": "run_1",
            "attempt_id": "att_1",
            "sequence": 2,
            "type": "TOOL_CALL",
            "status": "SUCCEEDED",
            "start_time": NOW,
            "input_revision": 1,
            **over,
        }
    )


def begin(v: BeginView, req: StepRequest) -> Any:
    return decide_begin(v, BOUND, req, NOW, "stp_new")


# -- BeginStep -------------------------------------------------------------------------


def test_a_model_call_is_recorded_with_its_resolution() -> None:
    decision = begin(view(), request(skills=["search"], tools=["read_file"]))
    assert isinstance(decision, Record) and decision.error is None
    step = decision.step
    assert sorted(step.values()) == sorted(STEP_FIELDS)  # every field, no more
    assert (step.id, step.sequence, step.status, step.end_time) == ("stp_new", 7, "STARTED", None)
    assert (step.candidate_name, step.candidate_reason, step.requested_model_id) == (
        "primary",
        "PRIMARY",
        "m1",
    )
    assert '"search"' in step.skills_json and '"read_file"' in step.tools_json
    assert step.trace_id == "a" * 32  # the attempt's trace: the auditor's way to its spans
    assert not decision.deliver_steers


def test_pending_steers_go_to_the_next_model_call_only() -> None:
    run = run_view(pending_steers=2)
    model = begin(view(run), request())
    assert isinstance(model, Record) and model.deliver_steers
    tool = begin(view(run), request("TOOL_CALL", tool="read_file", arguments={"path": "a"}))
    assert isinstance(tool, Record) and not tool.deliver_steers


def test_a_fallback_follows_the_failed_model_call_the_ledger_holds() -> None:
    failed = PriorModelCall("stp_5", "FAILED", "RATE_LIMITED", "primary")
    decision = begin(view(last_model_call=failed), request())
    assert isinstance(decision, Record)
    step = decision.step
    assert (step.candidate_name, step.candidate_reason, step.fallback_from_step_id) == (
        "fallback",
        "FALLBACK_AFTER_ERROR",
        "stp_5",
    )
    # A class the failed candidate does not fall back on: the same candidate again.
    again = PriorModelCall("stp_6", "FAILED", "RATE_LIMITED", "fallback")
    same = begin(view(last_model_call=again), request())
    assert isinstance(same, Record)
    assert (same.step.candidate_name, same.step.fallback_from_step_id) == ("fallback", "stp_6")
    primary = PriorModelCall("stp_7", "FAILED", "PROVIDER_ERROR", "primary")
    retried = begin(view(last_model_call=primary), request())
    assert isinstance(retried, Record)
    assert (retried.step.candidate_reason, retried.step.fallback_from_step_id) == ("PRIMARY", "")


def test_a_fallback_is_never_taken_on_the_workers_word() -> None:
    """No failed model call in the ledger (none, or the latest did not fail): the primary,
    whatever the request claims (its claim is not even part of the request any more)."""
    assert not {"previous_error_class", "previous_candidate"} & set(
        StepRequest.__dataclass_fields__
    )
    for prior in (
        None,
        PriorModelCall("stp_5", "SUCCEEDED", "", "fallback"),
        PriorModelCall("stp_5", "STARTED", "", "primary"),
        PriorModelCall("stp_5", "DENIED", "PERMISSION_DENIED", "primary"),
        PriorModelCall("stp_5", "FAILED", "", "primary"),
    ):
        decision = begin(view(last_model_call=prior), request())
        assert isinstance(decision, Record), prior
        step = decision.step
        assert (step.candidate_name, step.candidate_reason, step.fallback_from_step_id) == (
            "primary",
            "PRIMARY",
            "",
        ), prior


def test_no_candidate_after_a_recorded_failure_names_the_failed_step() -> None:
    failed = PriorModelCall("stp_8", "FAILED", "RATE_LIMITED", "primary")
    decision = begin(view(last_model_call=failed), request(estimated_input_tokens=10))
    assert isinstance(decision, Record)  # (the fallback has no limit)
    tight = {
        "candidates": [
            {"name": "primary", "model_id": "m1", "fallback_on": ["RATE_LIMITED"]},
        ]
    }
    bound = dataclasses.replace(BOUND, model_policy=Pinned("t", "1", DIGEST, tight))
    refused = decide_begin(view(last_model_call=failed), bound, request(), NOW, "stp_new")
    assert isinstance(refused, Refuse) and isinstance(refused.error, FailedPrecondition)
    assert refused.error.reason == "NO_MODEL_CANDIDATE"
    assert refused.error.metadata["failed_step_id"] == "stp_8"


def test_tool_calls_allowed_denied_needing_approval_or_with_bad_arguments() -> None:
    allowed = begin(view(), request("TOOL_CALL", tool="read_file", arguments={"path": "a"}))
    assert isinstance(allowed, Record) and allowed.step.status == "STARTED"
    assert allowed.step.operation == "read_file"  # the tool's name when none is given

    approval = begin(view(), request("TOOL_CALL", tool="apply_patch", operation="patch"))
    assert isinstance(approval, Record) and approval.approval_requested
    assert (approval.step.type, approval.step.status) == ("APPROVAL_REQUEST", "WAITING_APPROVAL")
    assert approval.step.operation == "patch"

    for tool, arguments, error_type, status in (
        ("rm_rf", {}, PermissionDenied, "DENIED"),
        ("nope", {}, PermissionDenied, "DENIED"),
        ("read_file", {"path": 7}, InvalidArgument, "FAILED"),
    ):
        denied = begin(view(), request("TOOL_CALL", tool=tool, arguments=arguments))
        assert isinstance(denied, Record), tool
        assert isinstance(denied.error, error_type) and denied.step.status == status
        assert denied.step.end_time == NOW  # born ended
        assert denied.error.metadata["step_id"] == denied.step.id


def test_the_runs_ceiling_makes_side_effects_need_approval_or_denies_them() -> None:
    req = request("TOOL_CALL", tool="apply_patch")
    read_only = begin(view(run_view(permission_ceiling="READ_ONLY")), req)
    assert isinstance(read_only, Record) and isinstance(read_only.error, PermissionDenied)


def test_a_fence_without_the_attempts_token_is_answered_as_a_stale_one() -> None:
    """The attempt id and epoch are public: only the token proves the write is the worker's,
    and a wrong or missing one learns nothing (the stale fence's error, word for word)."""
    stale = begin(view(), request(lease_epoch=2))
    for token in ("", "guessed", TOKEN + "x"):
        refused = begin(view(), request(lease_token=token))
        assert isinstance(refused, Refuse) and isinstance(refused.error, LeaseLost), token
        assert isinstance(stale, Refuse)
        assert refused.error.metadata == stale.error.metadata
        assert refused.error.message == stale.error.message.replace("epoch 2", "epoch 3")
        ended = decide_end(
            EndView(run_view(), started()), FenceClaim("att_1", 3, token), "stp_1", OUTCOME, NOW
        )
        assert isinstance(ended, Refuse) and isinstance(ended.error, LeaseLost)
    # An attempt from before tokens (an empty hash) takes no token, and only that.
    old = view(run_view(lease_token_hash=""))
    assert isinstance(begin(old, request(lease_token="")), Record)
    assert isinstance(begin(old, request(lease_token=TOKEN)), Refuse)


def test_refusals_write_nothing() -> None:
    cases: list[tuple[BeginView, StepRequest, type]] = [
        (BeginView(None), request(), LeaseLost),
        (view(run_view(lease_epoch=4)), request(), LeaseLost),
        (view(run_view(current_attempt_id="att_2")), request(), LeaseLost),
        (view(run_view(lease_expire_time=NOW - dt.timedelta(seconds=1))), request(), LeaseLost),
        (view(), request(lease_epoch=0), InvalidArgument),
        (view(turn_status="ENDED"), request(), FailedPrecondition),
        (view(turn_attempt_id="att_0"), request(), FailedPrecondition),
        (view(turn_attempt_id=None, turn_status=None), request(), FailedPrecondition),
        (view(), request(input_ref=DIGEST), FailedPrecondition),
        (view(), request(retry_of_step_id="stp_x"), InvalidArgument),
        (view(retry_of_run_id="run_2"), request(retry_of_step_id="stp_x"), InvalidArgument),
        (view(), request("COMPLETION_CHECK", check="lint"), InvalidArgument),
    ]
    for v, req, error_type in cases:
        decision = begin(v, req)
        assert isinstance(decision, Refuse) and isinstance(decision.error, error_type), (v, req)
    blob = begin(view(input_blob=True), request(input_ref=DIGEST))
    assert isinstance(blob, Record) and blob.step.input_ref == DIGEST
    retry = begin(view(retry_of_run_id="run_1"), request(retry_of_step_id="stp_x"))
    assert isinstance(retry, Record) and retry.step.retry_of_step_id == "stp_x"


def test_a_repeated_key_reuses_or_retries() -> None:
    req = request("TOOL_CALL", tool="read_file", arguments={"path": "a"}, idempotency_key="k")
    for status in ("SUCCEEDED", "DENIED", "WAITING_APPROVAL"):
        assert begin(view(keyed=earlier(status=status)), req) == Reuse("stp_0", with_steers=True)
    mine = begin(view(keyed=earlier(status="STARTED")), req)
    assert mine == Reuse("stp_0", with_steers=True)
    # Failed, or begun by another attempt: this call is its retry.
    for step in (earlier(status="FAILED"), earlier(status="STARTED", attempt_id="att_0")):
        retry = begin(view(keyed=step), req)
        assert isinstance(retry, Record) and retry.step.retry_of_step_id == "stp_0"


def test_a_repeated_key_of_an_approval_request() -> None:
    req = request("TOOL_CALL", tool="apply_patch", idempotency_key="k")
    asked = earlier(
        type="APPROVAL_REQUEST",
        status="WAITING_APPROVAL",
        tool_name="apply_patch",
        tools_json="[]",
    )
    assert begin(view(keyed=asked), req) == Reuse("stp_0", with_steers=False)
    approved = earlier(
        type="APPROVAL_REQUEST",
        status="SUCCEEDED",
        tool_name="apply_patch",
        approval_decision="APPROVE",
    )
    call = begin(view(keyed=approved), req)
    assert isinstance(call, Record) and call.step.status == "STARTED"
    assert (call.step.type, call.step.approval_step_id, call.step.side_effect) == (
        "TOOL_CALL",
        "stp_0",
        True,
    )
    assert begin(view(keyed=approved, keyed_follower_id="stp_9"), req) == Reuse(
        "stp_9", with_steers=False
    )
    denied = earlier(
        type="APPROVAL_REQUEST",
        status="DENIED",
        tool_name="apply_patch",
        approval_decision="DENY",
        approver="sec",
        approver_principal="alice",
        approval_comment="no",
    )
    refused = begin(view(keyed=denied), req)
    assert isinstance(refused, Record) and refused.error is None
    # The principal decided; the caller's label is shown beside it, never instead of it.
    assert (refused.step.status, refused.step.error_message) == (
        "DENIED",
        "denied by alice (label 'sec'): no",
    )


def test_the_budget_stops_the_run_before_the_step() -> None:
    for run in (
        run_view(max_steps=4),
        run_view(max_model_tokens=100, input_tokens=60, output_tokens=40),
        run_view(max_cost_usd=1.0, cost_usd=1.0),
    ):
        decision = begin(view(run), request())
        assert isinstance(decision, StopOnBudget) and decision.error.reason == "BUDGET_EXCEEDED"
    estimate = begin(
        view(run_view(max_model_tokens=100, input_tokens=60)), request(estimated_input_tokens=50)
    )
    assert isinstance(estimate, StopOnBudget)
    # A repeated key is answered before the budget: the step was already counted.
    keyed = begin(view(run_view(max_steps=4), keyed=earlier()), request(idempotency_key="k"))
    assert isinstance(keyed, Reuse)


def test_an_attempt_whose_steps_failed_too_often_in_a_row_is_stopped() -> None:
    limit = MAX_FAILED_STEPS_IN_A_ROW
    below = begin(view(run_view(attempt_failed_in_a_row=limit - 1)), request())
    assert isinstance(below, Record)
    at = begin(view(run_view(attempt_failed_in_a_row=limit)), request())
    assert isinstance(at, StopOnFailedSteps)
    assert at.error.reason == "FAILED_STEP_LIMIT"
    assert at.error.metadata == {"failed_in_a_row": str(limit), "limit": str(limit)}
    # A budget used up says so first: the run ends, not just the attempt.
    both = begin(view(run_view(attempt_failed_in_a_row=limit, max_steps=4)), request())
    assert isinstance(both, StopOnBudget)
    # A repeated key is answered before either: the step already exists.
    keyed = begin(
        view(run_view(attempt_failed_in_a_row=limit), keyed=earlier()), request(idempotency_key="k")
    )
    assert isinstance(keyed, Reuse)


def test_failed_in_a_row_counts_failures_and_a_success_starts_again() -> None:
    assert failed_in_a_row(3, "FAILED") == 4
    assert failed_in_a_row(3, "SUCCEEDED") == 0
    # A step begun, a denial (the tool's answer), an approval wait: no end that says either.
    for status in ("STARTED", "DENIED", "WAITING_APPROVAL", "CANCELLED"):
        assert failed_in_a_row(3, status) == 3


# -- EndStep ---------------------------------------------------------------------------

OUTCOME = StepEnd("SUCCEEDED", "", "done", 5, 2, 0.5, "m1@2026", "", "", False, False)


def started(**over: Any) -> Step:
    return earlier(**{"status": "STARTED", "id": "stp_1", **over})


def test_a_started_step_ends() -> None:
    decision = decide_end(EndView(run_view(), started()), FENCE, "stp_1", OUTCOME, NOW)
    assert isinstance(decision, End)
    step = decision.step
    assert (step.status, step.end_time, step.input_tokens, step.reported_model_id) == (
        "SUCCEEDED",
        NOW,
        5,
        "m1@2026",
    )


def test_end_refusals_and_repeats() -> None:
    ended = started(status="SUCCEEDED", input_tokens=5, output_tokens=2)
    assert isinstance(
        decide_end(EndView(run_view(), ended), FENCE, "stp_1", OUTCOME, NOW), Unchanged
    )
    cases: list[tuple[EndView, type]] = [
        (EndView(run_view(lease_epoch=2), started()), LeaseLost),
        (EndView(run_view(), None), NotFound),
        (EndView(run_view(), started(run_id="run_2")), NotFound),
        (EndView(run_view(), started(status="FAILED")), FailedPrecondition),
        (EndView(run_view(), started(attempt_id="att_0")), FailedPrecondition),
    ]
    for v, error_type in cases:
        decision = decide_end(v, FENCE, "stp_1", OUTCOME, NOW)
        assert isinstance(decision, Refuse) and isinstance(decision.error, error_type), v
    other = decide_end(
        EndView(run_view(), started(attempt_id="att_0")), FENCE, "stp_1", OUTCOME, NOW
    )
    assert isinstance(other, Refuse) and other.error.reason == "STEP_OF_OTHER_ATTEMPT"
    with_blob = StepEnd("SUCCEEDED", DIGEST, "", 0, 0, 0.0, "", "", "", False, False)
    missing = decide_end(EndView(run_view(), started()), FENCE, "stp_1", with_blob, NOW)
    assert isinstance(missing, Refuse) and missing.error.reason == "BLOB_MISSING"


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        StepEnd,
        st.sampled_from(["SUCCEEDED", "FAILED", "CANCELLED"]),
        st.sampled_from(["", DIGEST]),
        st.text(max_size=5),
        st.integers(0, 10),
        st.integers(0, 10),
        st.floats(0, 10),
        st.text(max_size=5),
        st.sampled_from(["", "TOOL_ERROR"]),
        st.text(max_size=5),
        st.booleans(),
        st.booleans(),
    ),
    st.booleans(),
)
def test_end_step_sets_only_the_end_fields(outcome: StepEnd, side_effect: bool) -> None:
    """What the store writes for an EndStep is END_FIELDS: the rules may set no other."""
    before = started(side_effect=side_effect)
    decision = decide_end(
        EndView(run_view(), before, output_blob=True), FENCE, "stp_1", outcome, NOW
    )
    assert isinstance(decision, End)
    after = decision.step.values()
    changed = {name for name in STEP_FIELDS if after[name] != before.values()[name]}
    assert changed <= set(END_FIELDS)
    assert after["side_effect"] == (side_effect or outcome.side_effect)  # never unset


# -- properties ------------------------------------------------------------------------

_views = st.builds(
    lambda epoch, attempt, expired, turn, status, steers, steps, max_steps: view(
        run_view(
            lease_epoch=epoch,
            current_attempt_id=attempt,
            lease_expire_time=NOW + dt.timedelta(seconds=-1 if expired else 1),
            pending_steers=steers,
            step_count=steps,
            max_steps=max_steps,
        ),
        turn_attempt_id=turn,
        turn_status=status,
    ),
    st.integers(1, 4),
    st.sampled_from(["att_1", "att_2"]),
    st.booleans(),
    st.sampled_from(["att_1", "att_2", None]),
    st.sampled_from(["OPEN", "ENDED", None]),
    st.integers(0, 3),
    st.integers(0, 10),
    st.integers(0, 10),
)
_requests = st.one_of(
    st.builds(
        lambda epoch, skills: request(lease_epoch=epoch, skills=skills),
        st.integers(1, 4),
        st.lists(st.sampled_from(["search", "other"]), max_size=2),
    ),
    st.builds(
        lambda epoch, tool, path: request(
            "TOOL_CALL", lease_epoch=epoch, tool=tool, arguments={"path": path}
        ),
        st.integers(1, 4),
        st.sampled_from(["read_file", "apply_patch", "rm_rf", "nope"]),
        st.one_of(st.text(max_size=3), st.integers()),
    ),
)


@settings(max_examples=300, deadline=None)
@given(_views, _requests)
def test_only_a_held_fence_and_an_open_turn_of_the_attempt_ever_write(
    v: BeginView, req: StepRequest
) -> None:
    decision = begin(v, req)
    run = v.run
    assert run is not None
    holds = (
        run.current_attempt_id == req.attempt_id
        and run.lease_epoch == req.lease_epoch
        and run.lease_expire_time >= NOW
    )
    turn_open = v.turn_attempt_id == req.attempt_id and v.turn_status == "OPEN"
    if not (holds and turn_open):
        assert isinstance(decision, Refuse)
    elif budget_error(run, req.estimate) is not None:
        assert isinstance(decision, StopOnBudget)
    else:
        assert isinstance(decision, Record)
        step = decision.step
        # The next sequence, in the request's turn; counted types advance the step count.
        assert (step.sequence, step.turn_id, step.attempt_id) == (
            run.last_step_sequence + 1,
            req.turn_id,
            req.attempt_id,
        )
        # Steers go to the next model call that starts (a denied one consumes none).
        starts_model_call = step.type == "MODEL_CALL" and step.status == "STARTED"
        assert decision.deliver_steers == (starts_model_call and run.pending_steers > 0)
        # A recorded refusal is answered with its error, which names the step.
        if step.status in ("DENIED", "FAILED"):
            assert decision.error is not None
            assert decision.error.metadata["step_id"] == step.id


def test_decisions_are_deterministic() -> None:
    """Same view, same request, same answer: the rules read nothing else."""
    reqs = [
        request(),
        request("TOOL_CALL", tool="read_file", arguments={"path": "a"}),
        request("TOOL_CALL", tool="apply_patch"),
    ]
    for req, _ in itertools.product(reqs, range(2)):
        first, second = begin(view(), req), begin(view(), req)
        assert type(first) is type(second)
        if isinstance(first, Record) and isinstance(second, Record):
            assert first.step.values() == second.step.values()
