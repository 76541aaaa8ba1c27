"""gRPC adapter of ``agentrt.runtime.v1.WorkerService``: proto in, use case, proto out.

Turns, steps, checkpoints and artifacts belong to a later issue and answer UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import Any

from agentrt.runtime.v1 import enum_pb2, message_pb2, worker_service_pb2_grpc
from agentrt.runtime.v1 import worker_service_pb2 as pb
from runtime_service import proto_map as pm
from runtime_service.servicers.convert import duration_or_none, enum_name
from runtime_service.services.context import Runtime
from runtime_service.services.leases import LeasesService

Context = Any


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime: Runtime) -> None:
        self._leases = LeasesService(runtime)

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
        if acquired.attempt.resume_from_checkpoint_id:
            response.resume_from.id = acquired.attempt.resume_from_checkpoint_id
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
