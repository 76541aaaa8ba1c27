"""BeginStep and EndStep requests read from their messages into the step rules' values.

Shared by the WorkerService adapter and the step writer process (``step_writer``), which
parses the same request bytes in another process; neither the writer nor the rules import
the servicers.
"""

from __future__ import annotations

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as pb
from agentrt_core.proto_json import enum_name, struct_to_json
from runtime_service.fence import FenceClaim
from runtime_service.step_rules import StepEnd, StepRequest, step_end


def step_request(request: pb.BeginStepRequest) -> StepRequest:
    model, tool, check = request.model_call, request.tool_call, request.completion_check
    # The worker's claim of a previous failure is ignored (the ledger says what failed:
    # step_decide._model_call), but a value outside the enum is still a malformed request.
    enum_name(
        enum_pb2.ErrorClass,
        "ERROR_CLASS_",
        model.previous_error_class,
        "model_call.previous_error_class",
    )
    return StepRequest(
        attempt_id=request.fence.attempt_id,
        lease_epoch=request.fence.lease_epoch,
        lease_token=request.fence.lease_token,
        turn_id=request.turn_id,
        type=enum_name(enum_pb2.StepType, "STEP_TYPE_", request.type, "type", required=True),
        operation=request.operation,
        idempotency_key=request.idempotency_key,
        input_ref=request.input_ref,
        retry_of_step_id=request.retry_of_step_id,
        estimated_input_tokens=model.estimated_input_tokens,
        skills=list(model.skills),
        tools=list(model.tools),
        context_digest=model.context_digest,
        tool=tool.tool,
        arguments=struct_to_json(tool.arguments),
        check=check.check,
        details=request.WhichOneof("details") or "",
    )


def fence_of(fence: message_pb2.Fence) -> FenceClaim:
    """The fence a fenced request presents (every WorkerService call but AcquireRun)."""
    return FenceClaim(fence.attempt_id, fence.lease_epoch, fence.lease_token)


def step_end_of(request: pb.EndStepRequest) -> StepEnd:
    return step_end(
        enum_name(enum_pb2.StepStatus, "STEP_STATUS_", request.status, "status", required=True),
        output_ref=request.output_ref,
        summary=request.summary,
        input_tokens=request.usage.input_tokens,
        output_tokens=request.usage.output_tokens,
        cost_usd=request.usage.cost_usd,
        reported_model_id=request.reported_model_id,
        error_class=enum_name(
            enum_pb2.ErrorClass, "ERROR_CLASS_", request.error_class, "error_class"
        ),
        error_message=request.error_message,
        retryable=request.retryable,
        side_effect=request.side_effect,
    )
