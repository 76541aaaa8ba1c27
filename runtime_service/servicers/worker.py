"""gRPC adapter of ``agentrt.runtime.v1.WorkerService``: proto in, use case, proto out."""

from __future__ import annotations

from typing import Any

from agentrt.runtime.v1 import enum_pb2, message_pb2, worker_service_pb2_grpc
from agentrt.runtime.v1 import worker_service_pb2 as pb
from runtime_service import proto_map as pm
from runtime_service.servicers.convert import duration_or_none, enum_name, struct_json
from runtime_service.services.bound import BoundAgents
from runtime_service.services.context import Runtime
from runtime_service.services.leases import LeasesService
from runtime_service.services.steps import StepRequest, StepsService

Context = Any


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime: Runtime, bound: BoundAgents) -> None:
        self._leases = LeasesService(runtime, bound)
        self._steps = StepsService(runtime, bound)

    @property
    def leases(self) -> LeasesService:
        return self._leases

    async def AcquireRun(
        self, request: pb.AcquireRunRequest, context: Context
    ) -> pb.AcquireRunResponse:
        acquired = await self._leases.acquire(
            request.worker_id,
            list(request.filter.agent_ids),
            dict(request.filter.labels),
            duration_or_none(request, "lease_ttl"),
            duration_or_none(request, "wait"),
        )
        if acquired is None:
            return pb.AcquireRunResponse()
        response = pb.AcquireRunResponse(
            run=pm.run(acquired.run),
            attempt=pm.attempt(acquired.attempt),
            fence=message_pb2.Fence(
                attempt_id=acquired.attempt.id, lease_epoch=acquired.attempt.lease_epoch
            ),
            agent=message_pb2.BoundAgent(
                agent_digest=acquired.run.agent_digest,
                agent_id=acquired.run.agent_id,
                version_label=acquired.run.agent_version_label,
                definition_json=acquired.agent_json,
                tool_names=acquired.tool_names,
                skill_names=acquired.skill_names,
                completion_checks=acquired.completion_checks,
            ),
        )
        if acquired.checkpoint is not None:
            response.resume_from.CopyFrom(pm.checkpoint(acquired.checkpoint))
        return response

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        result = await self._leases.heartbeat(request.fence.attempt_id, request.fence.lease_epoch)
        return pb.HeartbeatResponse(
            lease_expire_time=pm.timestamp(result.lease_expire_time),
            cancel_requested=result.cancel_requested,
            pause_requested=result.pause_requested,
            deadline_time=pm.timestamp(result.deadline_time),
            input_revision=result.input_revision,
        )

    async def FinishAttempt(
        self, request: pb.FinishAttemptRequest, context: Context
    ) -> pb.FinishAttemptResponse:
        run, attempt = await self._leases.finish(
            request.fence.attempt_id,
            request.fence.lease_epoch,
            enum_name(
                enum_pb2.AttemptOutcome,
                "ATTEMPT_OUTCOME_",
                request.outcome,
                "outcome",
                required=True,
            ),
            error_class=enum_name(
                enum_pb2.ErrorClass, "ERROR_CLASS_", request.error.error_class, "error.error_class"
            ),
            error_message=request.error.message,
            result_summary=request.result_summary,
            output_ref=request.output_ref,
        )
        return pb.FinishAttemptResponse(run=pm.run(run), attempt=pm.attempt(attempt))

    async def BeginTurn(
        self, request: pb.BeginTurnRequest, context: Context
    ) -> pb.BeginTurnResponse:
        turn, inputs = await self._steps.begin_turn(
            request.fence.attempt_id, request.fence.lease_epoch, request.request_id
        )
        return pb.BeginTurnResponse(
            turn=pm.turn(turn, [i.id for i in inputs]),
            delivered_inputs=[pm.input_(i) for i in inputs],
        )

    async def EndTurn(self, request: pb.EndTurnRequest, context: Context) -> pb.EndTurnResponse:
        ended, following, inputs = await self._steps.end_turn(
            request.fence.attempt_id, request.fence.lease_epoch, request.turn_id
        )
        response = pb.EndTurnResponse(
            ended_turn=pm.turn(ended), delivered_inputs=[pm.input_(i) for i in inputs]
        )
        if following is not None:
            response.next_turn.CopyFrom(pm.turn(following, [i.id for i in inputs]))
        return response

    async def BeginStep(
        self, request: pb.BeginStepRequest, context: Context
    ) -> pb.BeginStepResponse:
        details = request.WhichOneof("details") or ""
        model, tool, check = request.model_call, request.tool_call, request.completion_check
        outcome = await self._steps.begin_step(
            StepRequest(
                attempt_id=request.fence.attempt_id,
                lease_epoch=request.fence.lease_epoch,
                turn_id=request.turn_id,
                type=enum_name(
                    enum_pb2.StepType, "STEP_TYPE_", request.type, "type", required=True
                ),
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
                details=details,
            )
        )
        response = pb.BeginStepResponse(
            step=pm.step(outcome.step),
            steer_inputs=[pm.input_(i) for i in outcome.steers],
            existing=outcome.existing,
        )
        if outcome.resolved is not None:
            response.resolved.CopyFrom(outcome.resolved)
        return response

    async def EndStep(self, request: pb.EndStepRequest, context: Context) -> pb.EndStepResponse:
        step = await self._steps.end_step(
            request.fence.attempt_id,
            request.fence.lease_epoch,
            request.step_id,
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
        return pb.EndStepResponse(step=pm.step(step))

    async def WriteCheckpoint(
        self, request: pb.WriteCheckpointRequest, context: Context
    ) -> pb.WriteCheckpointResponse:
        checkpoint = await self._steps.write_checkpoint(
            request.fence.attempt_id,
            request.fence.lease_epoch,
            request.state_ref,
            request.after_sequence,
            request.request_id,
        )
        return pb.WriteCheckpointResponse(checkpoint=pm.checkpoint(checkpoint))

    async def CreateArtifact(
        self, request: pb.CreateArtifactRequest, context: Context
    ) -> pb.CreateArtifactResponse:
        artifact = await self._steps.create_artifact(
            request.fence.attempt_id,
            request.fence.lease_epoch,
            request.step_id,
            request.name,
            request.blob_digest,
            request.media_type,
            dict(request.labels),
            request.request_id,
        )
        return pb.CreateArtifactResponse(artifact=pm.artifact(artifact))
