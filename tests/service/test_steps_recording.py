"""What a step records, fencing, idempotency and bad input: BeginStep / EndStep through real
gRPC on both engines."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    FAILED,
    OK,
    T,
    acquire,
    args,
    closure,
    digest_of,
    events,
    expect,
    get_run,
    get_step,
    list_steps,
    of_type,
    put_blob,
    send,
    start,
    violations,
)

E = enum_pb2
ABORTED = grpc.StatusCode.ABORTED
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
UNKNOWN_ENUM: Any = 99  # a value no enum of the contract has


def test_a_model_call_records_what_was_resolved_against_the_bound_closure(stubs: Stubs) -> None:
    w = start(stubs)
    version = closure(stubs, "coding_agent:prod")
    tools = {t.name: t for t in version.closure.tools}
    assert w.acquired.agent.agent_digest == version.digest
    source = put_blob(stubs, b"the prompt as assembled").blob.digest
    context = digest_of(b"assembled context")

    begun = w.model(
        "turn1:plan",
        operation="plan",
        input_ref=source,
        estimated_input_tokens=1200,
        skills=["repo-debug"],
        tools=["read_file", "apply_patch"],
        context_digest=context,
    )
    step = begun.step
    assert not begun.existing
    assert (step.run_id, step.attempt_id, step.turn_id) == (w.run_id, w.attempt_id, w.turn_id)
    assert step.sequence == 1 and step.type == E.STEP_TYPE_MODEL_CALL
    assert step.operation == "plan" and step.idempotency_key == "turn1:plan"
    assert step.status == E.STEP_STATUS_STARTED and step.input_ref == source
    assert step.HasField("start_time") and not step.HasField("end_time")
    assert step.input_revision == 1

    model = step.versions.model
    assert model.policy_digest == version.closure.model_policy.digest
    assert (model.candidate_name, model.reason) == ("primary", E.CANDIDATE_REASON_PRIMARY)
    assert (model.provider, model.requested_model_id) == ("anthropic", "claude-sonnet-4")
    assert json_format.MessageToDict(model.parameters) == {"temperature": 0.2, "max_tokens": 4096}
    assert model.reported_model_id == ""
    assert step.versions.system_prompt_digest == version.closure.system_prompt.digest
    assert step.versions.context_digest == context
    [skill] = step.versions.skills
    pinned_skill = version.closure.skills[0]
    assert (skill.name, skill.version, skill.digest) == (
        "repo-debug",
        "2.1.0",
        pinned_skill.digest,
    )
    assert [t.name for t in step.versions.tools] == ["apply_patch", "read_file"]
    for recorded in step.versions.tools:
        pinned = tools[recorded.name]
        assert (recorded.version, recorded.digest, recorded.schema_digest) == (
            pinned.version,
            pinned.digest,
            pinned.schema_digest,
        )
    decisions = {t.name: t.decision for t in step.versions.tools}
    assert decisions == {
        "apply_patch": E.PERMISSION_DECISION_REQUIRE_APPROVAL,
        "read_file": E.PERMISSION_DECISION_ALLOW,
    }

    # The response carries the contents to use, matching what was recorded.
    resolved = begun.resolved
    assert resolved.model.model_id == "claude-sonnet-4"
    assert resolved.model.policy_digest == model.policy_digest
    assert resolved.system_prompt_text == "You are a careful coding agent."
    assert resolved.system_prompt_digest == version.closure.system_prompt.digest
    assert resolved.skills[0].instructions == "Reproduce, bisect, fix."
    assert [(f.path, f.content) for f in resolved.skills[0].files] == [
        ("checklist.md", b"- run the tests\n")
    ]
    by_name = {t.name: t for t in resolved.tools}
    assert json_format.MessageToDict(by_name["apply_patch"].input_schema)["required"] == ["patch"]
    assert by_name["apply_patch"].side_effect and not by_name["read_file"].side_effect

    # EndStep records the outcome, usage and the model the provider reported.
    output = put_blob(stubs, b"the model's answer").blob.digest
    ended = w.end(
        step.id,
        output_ref=output,
        summary="planned the fix",
        usage=message_pb2.Usage(input_tokens=100, output_tokens=20, cost_usd=0.5),
        reported_model_id="claude-sonnet-4-20250514",
    )
    stored = get_step(stubs, step.id)
    assert stored == ended
    assert stored.status == OK and stored.output_ref == output
    assert stored.summary == "planned the fix"
    assert stored.HasField("end_time")
    assert stored.end_time.ToDatetime() >= stored.start_time.ToDatetime()
    assert (stored.usage.input_tokens, stored.usage.output_tokens) == (100, 20)
    assert stored.usage.cost_usd == pytest.approx(0.5)
    assert stored.versions.model.reported_model_id == "claude-sonnet-4-20250514"
    assert stored.versions.model.requested_model_id == "claude-sonnet-4"

    run = get_run(stubs, w.run_id)
    assert (run.usage.input_tokens, run.usage.output_tokens) == (100, 20)
    found = events(stubs, w.run_id)
    [started] = of_type(found, E.EVENT_TYPE_STEP_STARTED)
    assert started.step_started_attributes.step_id == step.id
    assert started.step_started_attributes.versions.model.policy_digest == model.policy_digest
    [ended_event] = of_type(found, E.EVENT_TYPE_STEP_ENDED)
    assert ended_event.step_ended_attributes.reported_model_id == "claude-sonnet-4-20250514"


def test_tool_steps_record_errors_retries_side_effects_and_a_sequence_across_attempts(
    stubs: Stubs,
) -> None:
    w = start(stubs)
    version = closure(stubs, "coding_agent:prod")
    read_pin = next(t for t in version.closure.tools if t.name == "read_file")

    first = w.tool("read_file", "read:a", path="a.py").step
    assert first.type == E.STEP_TYPE_TOOL_CALL and first.tool_name == "read_file"
    assert first.operation == "read_file"  # no label given: the tool's name (step.proto)
    assert json_format.MessageToDict(first.tool_arguments) == {"path": "a.py"}
    [tool] = first.versions.tools
    assert (tool.name, tool.version, tool.digest, tool.schema_digest, tool.decision) == (
        "read_file",
        "1",
        read_pin.digest,
        read_pin.schema_digest,
        E.PERMISSION_DECISION_ALLOW,
    )
    assert not first.versions.HasField("model") and not first.side_effect
    failed = w.end(
        first.id,
        FAILED,
        error_class=E.ERROR_CLASS_TOOL_ERROR,
        error_message="ENOENT",
        retryable=True,
    )
    assert (failed.error_class, failed.error_message, failed.retryable) == (
        E.ERROR_CLASS_TOOL_ERROR,
        "ENOENT",
        True,
    )

    # Same key after a failure: a new step that retries the failed one.
    retry = w.tool("read_file", "read:a", path="a.py")
    assert not retry.existing
    assert retry.step.id != first.id and retry.step.retry_of_step_id == first.id
    assert retry.step.sequence == 2
    done = w.end(retry.step.id, side_effect=True)
    assert done.side_effect  # the worker's side-effect marker is kept

    # An explicit retry_of_step_id is recorded as given.
    third = w.model(retry_of_step_id=first.id).step
    assert third.retry_of_step_id == first.id and third.sequence == 3
    w.end(third.id)

    # The sequence continues in the next attempt; turns keep counting too.
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs)
    assert w2.acquired.attempt.number == 2
    again = w2.model().step
    assert again.sequence == 4 and again.attempt_id == w2.attempt_id != w.attempt_id
    all_steps = list_steps(stubs, w.run_id)
    assert [s.sequence for s in all_steps] == [1, 2, 3, 4]
    assert [s.id for s in list_steps(stubs, w.run_id, attempt_id=w2.attempt_id)] == [again.id]
    assert [s.id for s in list_steps(stubs, w.run_id, turn_id=w.turn_id)] == [
        s.id for s in all_steps[:3]
    ]
    # Paging walks the same order.
    page = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=w.run_id, page_size=3), timeout=T)
    rest = stubs.runtime.ListSteps(
        pb.ListStepsRequest(run_id=w.run_id, page_size=3, page_token=page.next_page_token),
        timeout=T,
    )
    assert [s.sequence for s in page.steps] + [s.sequence for s in rest.steps] == [1, 2, 3, 4]
    assert rest.next_page_token == ""


def test_retry_of_step_id_must_name_a_step_of_the_same_run(stubs: Stubs) -> None:
    """In the step writer process and the server's engine alike: a retry of
    another run's step, or of no step, is refused naming the field, and changes nothing."""
    other = start(stubs)
    foreign = other.model("theirs").step
    other.end(foreign.id, FAILED, error_class=E.ERROR_CLASS_RATE_LIMITED, retryable=True)
    w = start(stubs, publish=False)
    assert w.run_id != other.run_id
    own = w.model("mine").step
    before_steps = list_steps(stubs, w.run_id)
    before_run = get_run(stubs, w.run_id)

    for target in (foreign.id, "stp_nope", "x" * 300):
        for call in (
            lambda t=target: w.model(retry_of_step_id=t),
            lambda t=target: w.model("keyed", retry_of_step_id=t),
            lambda t=target: w.begin(
                type=E.STEP_TYPE_TOOL_CALL,
                retry_of_step_id=t,
                tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="a")),
            ),
        ):
            details = expect(INVALID, call)
            assert violations(details) == ["retry_of_step_id"]

    assert list_steps(stubs, w.run_id) == before_steps
    assert get_run(stubs, w.run_id).last_event_sequence == before_run.last_event_sequence
    # A step of the same run is still a valid target.
    retry = w.model(retry_of_step_id=own.id).step
    assert retry.retry_of_step_id == own.id


def test_a_stale_fence_is_lease_lost_and_changes_nothing(stubs: Stubs) -> None:
    w1 = start(stubs)
    open_step = w1.model("k").step
    blob = put_blob(stubs, b"state").blob.digest
    w1.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs)
    current = w2.model("k2").step
    before_steps = list_steps(stubs, w1.run_id)
    before_run = get_run(stubs, w1.run_id)

    stale = w1.fence
    wrong_epoch = message_pb2.Fence(attempt_id=w2.attempt_id, lease_epoch=w2.fence.lease_epoch + 1)
    unknown = message_pb2.Fence(attempt_id="att_nope", lease_epoch=1)
    for fence in (stale, wrong_epoch, unknown):
        calls = [
            lambda f=fence: w2.begin(fence=f, type=E.STEP_TYPE_MODEL_CALL, model_call={}),
            lambda f=fence: w2.end(current.id, fence=f),
            lambda f=fence: stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=f), timeout=T),
            lambda f=fence: stubs.worker.EndTurn(
                wpb.EndTurnRequest(fence=f, turn_id=w2.turn_id), timeout=T
            ),
            lambda f=fence: stubs.worker.WriteCheckpoint(
                wpb.WriteCheckpointRequest(fence=f, state_ref=blob), timeout=T
            ),
            lambda f=fence: stubs.worker.CreateArtifact(
                wpb.CreateArtifactRequest(fence=f, step_id=current.id, name="x", blob_digest=blob),
                timeout=T,
            ),
        ]
        for call in calls:
            details = expect(ABORTED, call, reason="LEASE_LOST")
            assert "attempt_status" in details["ErrorInfo"].metadata
    stale_details = expect(ABORTED, w1.end, open_step.id, reason="LEASE_LOST")
    assert stale_details["ErrorInfo"].metadata["attempt_status"] == "FAILED"

    assert list_steps(stubs, w1.run_id) == before_steps
    after_run = get_run(stubs, w1.run_id)
    assert after_run.last_event_sequence == before_run.last_event_sequence
    assert after_run.latest_checkpoint_id == ""
    # The first attempt's open step was cancelled when it ended, not ended by the stale call.
    assert get_step(stubs, open_step.id).status == E.STEP_STATUS_CANCELLED

    # No fence at all is malformed input, not a lost lease.
    details = expect(
        INVALID, w2.begin, fence=message_pb2.Fence(), type=E.STEP_TYPE_MODEL_CALL, model_call={}
    )
    assert "fence" in violations(details)


def test_refs_must_name_uploaded_blobs(stubs: Stubs) -> None:
    w = start(stubs)
    missing = digest_of(b"never uploaded")
    details = expect(
        PRECONDITION,
        w.model,
        input_ref=missing,
        reason="BLOB_MISSING",
    )
    assert details["ErrorInfo"].metadata["digest"] == missing
    assert list_steps(stubs, w.run_id) == []  # nothing recorded

    step = w.model().step
    expect(PRECONDITION, w.end, step.id, output_ref=missing, reason="BLOB_MISSING")
    assert get_step(stubs, step.id).status == E.STEP_STATUS_STARTED  # unchanged
    details = expect(INVALID, w.end, step.id, output_ref="sha256:short")
    assert "output_ref" in violations(details)
    details = expect(INVALID, w.model, input_ref="not-a-digest")
    assert "input_ref" in violations(details)


def test_a_repeated_idempotency_key_returns_the_same_step_and_creates_nothing(
    stubs: Stubs,
) -> None:
    w = start(stubs)
    steer = send(stubs, w.run_id, E.INPUT_KIND_STEER, "use the fast path")
    first = w.model("plan-1", skills=["repo-debug"], tools=["read_file"])
    assert [i.id for i in first.steer_inputs] == [steer.id]
    mark = get_run(stubs, w.run_id).last_event_sequence

    again = w.model("plan-1", skills=["repo-debug"], tools=["read_file"])
    assert again.existing and again.step == first.step
    assert again.resolved == first.resolved
    # The steer it consumed is handed back too (it is delivered exactly once, to this step).
    assert [i.id for i in again.steer_inputs] == [steer.id]
    assert len(list_steps(stubs, w.run_id)) == 1
    assert get_run(stubs, w.run_id).last_event_sequence == mark

    usage = message_pb2.Usage(input_tokens=5, output_tokens=6, cost_usd=0.01)
    ended = w.end(first.step.id, usage=usage, summary="ok")
    mark = get_run(stubs, w.run_id).last_event_sequence
    # The same EndStep again is a no-op ...
    assert w.end(first.step.id, usage=usage, summary="ok") == ended
    assert get_run(stubs, w.run_id).last_event_sequence == mark
    assert get_run(stubs, w.run_id).usage.input_tokens == 5  # not added twice
    # ... a different outcome is refused.
    expect(PRECONDITION, w.end, first.step.id, FAILED, reason="STEP_ENDED")
    expect(PRECONDITION, w.end, first.step.id, usage=message_pb2.Usage(input_tokens=99))
    assert get_step(stubs, first.step.id) == ended

    # A SUCCEEDED step with the key is returned as is, not run again.
    after = w.model("plan-1")
    assert after.existing and after.step.id == first.step.id and after.step.status == OK

    # A STARTED tool call with the key: the same step.
    call = w.tool("read_file", "read-1", path="a")
    assert w.tool("read_file", "read-1", path="a").step.id == call.step.id
    assert len(list_steps(stubs, w.run_id)) == 2

    # A STARTED step of an attempt that ended was cancelled: the key now starts a retry.
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs)
    retried = w2.tool("read_file", "read-1", path="a")
    assert not retried.existing and retried.step.retry_of_step_id == call.step.id
    assert get_step(stubs, call.step.id).status == E.STEP_STATUS_CANCELLED


def test_bad_input_is_invalid_argument_naming_the_field(stubs: Stubs) -> None:
    w = start(stubs)
    step = w.model().step
    mark = get_run(stubs, w.run_id).last_event_sequence

    def bad_end(field: str, **kw: Any) -> None:
        details = expect(INVALID, w.end, step.id, **kw)
        assert field in violations(details), violations(details)

    bad_end("usage.input_tokens", usage=message_pb2.Usage(input_tokens=-1))
    bad_end("usage.output_tokens", usage=message_pb2.Usage(output_tokens=-5))
    bad_end("usage.cost_usd", usage=message_pb2.Usage(cost_usd=-0.01))
    bad_end("usage.cost_usd", usage=message_pb2.Usage(cost_usd=float("nan")))
    bad_end("summary", summary="x" * (64 * 1024 + 1))
    bad_end("error_message", error_message="x" * (64 * 1024 + 1))
    bad_end("status", status=99)
    bad_end("status", status=E.STEP_STATUS_DENIED)  # not a status a worker reports
    bad_end("error_class", error_class=99)
    assert get_step(stubs, step.id).status == E.STEP_STATUS_STARTED

    def bad_begin(field: str, **kw: Any) -> None:
        details = expect(INVALID, w.begin, **kw)
        assert field in violations(details), violations(details)

    model = message_pb2.ModelCallSpec()
    bad_begin("type", type=99, model_call=model)
    bad_begin("type", model_call=model)
    bad_begin("type", type=E.STEP_TYPE_APPROVAL_REQUEST, model_call=model)
    bad_begin("type", type=E.STEP_TYPE_CHECKPOINT, model_call=model)
    bad_begin(
        "model_call",
        type=E.STEP_TYPE_MODEL_CALL,
        tool_call=message_pb2.ToolCallSpec(tool="read_file"),
    )
    bad_begin("operation", type=E.STEP_TYPE_MODEL_CALL, model_call=model, operation="o" * 201)
    bad_begin(
        "idempotency_key",
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=model,
        idempotency_key="k" * 201,
    )
    bad_begin(
        "model_call.estimated_input_tokens",
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=message_pb2.ModelCallSpec(estimated_input_tokens=-1),
    )
    bad_begin(
        "model_call.previous_error_class",
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=message_pb2.ModelCallSpec(previous_error_class=UNKNOWN_ENUM),
    )
    bad_begin(
        "model_call.context_digest",
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=message_pb2.ModelCallSpec(context_digest="md5:abc"),
    )
    bad_begin("tool_call.tool", type=E.STEP_TYPE_TOOL_CALL, tool_call=message_pb2.ToolCallSpec())
    bad_begin(
        "tool_call.arguments",
        type=E.STEP_TYPE_TOOL_CALL,
        tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="p" * 300_000)),
    )
    bad_begin(
        "completion_check.check",
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="no-such-check"),
    )
    bad_begin("turn_id", turn_id="", type=E.STEP_TYPE_MODEL_CALL, model_call=model)
    details = expect(
        INVALID,
        stubs.finish,
        w.fence,
        99,
    )
    assert "outcome" in violations(details)
    assert get_run(stubs, w.run_id).last_event_sequence == mark  # nothing was written
    assert len(list_steps(stubs, w.run_id)) == 1

    # A turn that is not open: FAILED_PRECONDITION.
    w.end(step.id)
    ended_turn = w.turn_id
    w.end_turn()
    expect(
        PRECONDITION, w.begin, turn_id=ended_turn, type=1, model_call=model, reason="TURN_NOT_OPEN"
    )
    w.begin_turn()
    # An open turn cannot be opened twice.
    expect(PRECONDITION, stubs.worker.BeginTurn, wpb.BeginTurnRequest(fence=w.fence), timeout=T)
    # NOT_FOUND for a step or turn that does not exist.
    expect(grpc.StatusCode.NOT_FOUND, w.end, "stp_nope")
    expect(grpc.StatusCode.NOT_FOUND, w.end_turn, "trn_nope")
    expect(grpc.StatusCode.NOT_FOUND, get_step, stubs, "stp_nope")
    expect(grpc.StatusCode.NOT_FOUND, list_steps, stubs, "run_nope")


def test_a_step_for_an_ended_run_is_lease_lost(stubs: Stubs) -> None:
    w = start(stubs)
    step = w.model().step
    w.end(step.id)
    finished = w.finish(
        E.ATTEMPT_OUTCOME_FAILED_PERMANENT,
        error=message_pb2.AttemptError(error_class=E.ERROR_CLASS_TOOL_ERROR, message="broken"),
    )
    assert finished.run.status == E.RUN_STATUS_FAILED
    # A terminal run has no current attempt, so the worker's fence is gone: every write is
    # answered ABORTED (LEASE_LOST) with the run's status, never FAILED_PRECONDITION.
    details = expect(ABORTED, w.model, reason="LEASE_LOST")
    assert details["ErrorInfo"].metadata["run_status"] == "FAILED"
    expect(ABORTED, w.tool, "read_file", path="a", reason="LEASE_LOST")
    expect(ABORTED, w.end, step.id, reason="LEASE_LOST")
    expect(ABORTED, w.begin_turn, reason="LEASE_LOST")
    assert len(list_steps(stubs, w.run_id)) == 1


def test_run_step_count_is_the_last_sequence(stubs: Stubs) -> None:
    w = start(stubs)
    w.end(w.model().step.id)
    stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=w.fence, state_ref=put_blob(stubs, b"s").blob.digest),
        timeout=T,
    )
    assert get_run(stubs, w.run_id).step_count == list_steps(stubs, w.run_id)[-1].sequence
