"""BeginStep and EndStep messages to and from the step use case.

Shared by the WorkerService adapter and the step writer process
(``runtime_service.step_process``), which answers the same messages in another process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as pb
from runtime_service import proto_map as pm
from runtime_service.servicers.convert import enum_name, struct_json
from runtime_service.services.steps import StepEnd, StepOutcome, StepRequest, step_end
from runtime_service.store.ledger import StepRow


def step_request(request: pb.BeginStepRequest) -> StepRequest:
    model, tool, check = request.model_call, request.tool_call, request.completion_check
    return StepRequest(
        attempt_id=request.fence.attempt_id,
        lease_epoch=request.fence.lease_epoch,
        turn_id=request.turn_id,
        type=enum_name(enum_pb2.StepType, "STEP_TYPE_", request.type, "type", required=True),
        operation=request.operation,
        idempotency_key=request.idempotency_key,
        input_ref=request.input_ref,
        retry_of_step_id=request.retry_of_step_id,
        estimated_input_tokens=model.estimated_input_tokens,
        previous_error_class=enum_name(
            enum_pb2.ErrorClass,
            "ERROR_CLASS_",
            model.previous_error_class,
            "model_call.previous_error_class",
        ),
        previous_candidate=model.previous_candidate,
        skills=list(model.skills),
        tools=list(model.tools),
        context_digest=model.context_digest,
        tool=tool.tool,
        arguments=struct_json(tool.arguments),
        check=check.check,
        details=request.WhichOneof("details") or "",
    )


def begin_step_response(outcome: StepOutcome) -> pb.BeginStepResponse:
    response = pb.BeginStepResponse(
        step=pm.step(outcome.step),
        steer_inputs=[pm.input_(i) for i in outcome.steers],
        existing=outcome.existing,
    )
    if outcome.resolved is not None:
        response.resolved.CopyFrom(outcome.resolved)
    return response


def begun_response(
    columns: Sequence[Any], resolved: message_pb2.ResolvedVersions
) -> pb.BeginStepResponse:
    """The answer to a BeginStep the step writer process recorded (a STARTED step)."""
    return pb.BeginStepResponse(step=pm.step_from_columns(columns), resolved=resolved)


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


def end_step_response(step: StepRow) -> pb.EndStepResponse:
    return pb.EndStepResponse(step=pm.step(step))


def ended_response(columns: Sequence[Any]) -> pb.EndStepResponse:
    """The answer to an EndStep the step writer process recorded."""
    return pb.EndStepResponse(step=pm.step_from_columns(columns))
