from __future__ import annotations

import grpc
import pytest

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import args
from tests.support import error_details


def test_step_flow(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    got = stubs.acquire()
    fence = got.fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence)).turn
    model = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key="m1",
            model_call=message_pb2.ModelCallSpec(
                estimated_input_tokens=1000, skills=["repo-debug"], tools=["read_file"]
            ),
        )
    )
    assert model.resolved.model.model_id == "claude-sonnet-4"
    assert model.resolved.skills[0].version == "2.1.0"
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=model.step.id,
            status=enum_pb2.STEP_STATUS_FAILED,
            error_class=enum_pb2.ERROR_CLASS_RATE_LIMITED,
        )
    )
    fallback = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key="m1",
            model_call=message_pb2.ModelCallSpec(
                estimated_input_tokens=1000,
                previous_error_class=enum_pb2.ERROR_CLASS_RATE_LIMITED,
                previous_candidate="primary",
            ),
        )
    )
    assert fallback.resolved.model.model_id == "gpt-4.1"
    assert fallback.step.retry_of_step_id == model.step.id
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=fallback.step.id,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            usage=message_pb2.Usage(input_tokens=10, output_tokens=5, cost_usd=0.01),
            reported_model_id="gpt-4.1-2025",
        )
    )
    with pytest.raises(grpc.RpcError) as info:
        stubs.worker.BeginStep(
            wpb.BeginStepRequest(
                fence=fence,
                turn_id=turn.id,
                type=enum_pb2.STEP_TYPE_TOOL_CALL,
                tool_call=message_pb2.ToolCallSpec(tool="rm_rf", arguments=args()),
            )
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    denied_id = error_details(info.value)["ErrorInfo"].metadata["step_id"]
    assert (
        stubs.runtime.GetStep(pb.GetStepRequest(step_id=denied_id)).step.status
        == enum_pb2.STEP_STATUS_DENIED
    )
    with pytest.raises(grpc.RpcError) as info:
        stubs.worker.BeginStep(
            wpb.BeginStepRequest(
                fence=fence,
                turn_id=turn.id,
                type=enum_pb2.STEP_TYPE_TOOL_CALL,
                tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path=3)),
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    read = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="r1",
            tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="a.py")),
        )
    )
    assert read.step.status == enum_pb2.STEP_STATUS_STARTED
    assert read.resolved.tools[0].schema_digest.startswith("sha256:")
    stubs.worker.EndStep(
        wpb.EndStepRequest(fence=fence, step_id=read.step.id, status=enum_pb2.STEP_STATUS_SUCCEEDED)
    )
    patch = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="p1",
            tool_call=message_pb2.ToolCallSpec(tool="apply_patch", arguments=args(patch="diff")),
        )
    )
    assert patch.step.type == enum_pb2.STEP_TYPE_APPROVAL_REQUEST
    assert patch.step.status == enum_pb2.STEP_STATUS_WAITING_APPROVAL
    stubs.finish(fence, enum_pb2.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    assert (
        stubs.runtime.GetRun(pb.GetRunRequest(run_id=run.id)).run.status
        == enum_pb2.RUN_STATUS_WAITING_APPROVAL
    )
    resolved = stubs.runtime.ResolveApproval(
        pb.ResolveApprovalRequest(
            run_id=run.id,
            step_id=patch.step.id,
            decision=enum_pb2.APPROVAL_DECISION_APPROVE,
            approver="alice",
        )
    )
    assert resolved.run.status == enum_pb2.RUN_STATUS_QUEUED
    second = stubs.acquire()
    assert second.attempt.reason == enum_pb2.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL
    fence2 = second.fence
    turn2 = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence2)).turn
    call = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence2,
            turn_id=turn2.id,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="p1",
            tool_call=message_pb2.ToolCallSpec(tool="apply_patch", arguments=args(patch="diff")),
        )
    )
    assert (
        call.step.type == enum_pb2.STEP_TYPE_TOOL_CALL
        and call.step.approval_step_id == patch.step.id
    )
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence2, step_id=call.step.id, status=enum_pb2.STEP_STATUS_SUCCEEDED
        )
    )
    with pytest.raises(grpc.RpcError) as info:
        stubs.finish(fence2, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    assert error_details(info.value)["ErrorInfo"].reason == "COMPLETION_CHECKS_MISSING"
    for check in ("tests-pass", "diff-reviewed"):
        c = stubs.worker.BeginStep(
            wpb.BeginStepRequest(
                fence=fence2,
                turn_id=turn2.id,
                type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
                completion_check=message_pb2.CompletionCheckSpec(check=check),
            )
        )
        stubs.worker.EndStep(
            wpb.EndStepRequest(
                fence=fence2, step_id=c.step.id, status=enum_pb2.STEP_STATUS_SUCCEEDED
            )
        )
    done = stubs.finish(fence2, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    assert done.run.status == enum_pb2.RUN_STATUS_COMPLETED
    steps = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=run.id)).steps
    assert [s.sequence for s in steps] == list(range(1, len(steps) + 1))
