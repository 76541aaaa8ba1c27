"""gRPC adapter of ``agentrt.runtime.v1.WorkerService``: proto in, use case, proto out."""

from __future__ import annotations

from typing import Any

from agentrt.runtime.v1 import enum_pb2, message_pb2, worker_service_pb2_grpc
from agentrt.runtime.v1 import worker_service_pb2 as pb
from agentrt_base.access import VISIBLE
from agentrt_core.proto_json import duration_or_none, enum_name
from runtime_service import proto_map as pm
from runtime_service.servicers.step_messages import begin_step_response, end_step_response
from runtime_service.services.bound import BoundAgents
from runtime_service.services.checkpoints import CheckpointsService
from runtime_service.services.context import Runtime
from runtime_service.services.leases import LeasesService
from runtime_service.services.steps import StepsService
from runtime_service.services.turns import TurnsService
from runtime_service.step_process import BEGIN_STEP, END_STEP, StepProcess
from runtime_service.step_wire import fence_of, step_end_of, step_request

Context = Any


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self, runtime: Runtime, bound: BoundAgents, step_process: StepProcess | None = None
    ) -> None:
        self._leases = LeasesService(runtime, bound)
        self._steps = StepsService(runtime, bound)
        self._turns = TurnsService(runtime)
        self._checkpoints = CheckpointsService(runtime)
        self._database = runtime.database
        # BeginStep and EndStep go to it when there is one: it runs the same step engine, off
        # this process's GIL. It answers None only when it cannot take the call (it is
        # restarting, or the call broke its code): this process's engine then takes it.
        self._step_process = step_process

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
            VISIBLE.get(),
        )
        if acquired is None:
            return pb.AcquireRunResponse()
        response = pb.AcquireRunResponse(
            run=pm.run(acquired.run),
            attempt=pm.attempt(acquired.attempt),
            fence=message_pb2.Fence(
                attempt_id=acquired.attempt.id,
                lease_epoch=acquired.attempt.lease_epoch,
                lease_token=acquired.lease_token,
            ),
            agent=message_pb2.BoundAgent(
                agent_digest=acquired.run.agent_digest,
                agent_id=acquired.run.agent_id,
                version_label=acquired.run.agent_version_label,
                definition_json=acquired.agent_json,
                tool_names=acquired.tool_names,
                skill_names=acquired.skill_names,
                completion_checks=acquired.completion_checks,
                runtime_checks=acquired.runtime_checks,
            ),
        )
        if acquired.checkpoint is not None:
            response.resume_from.CopyFrom(pm.checkpoint(acquired.checkpoint))
        return response

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        result = await self._leases.heartbeat(fence_of(request.fence))
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
            fence_of(request.fence),
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
        turn, inputs = await self._turns.begin_turn(fence_of(request.fence), request.request_id)
        return pb.BeginTurnResponse(
            turn=pm.turn(turn, [i.id for i in inputs]),
            delivered_inputs=[pm.input_(i) for i in inputs],
        )

    async def EndTurn(self, request: pb.EndTurnRequest, context: Context) -> pb.EndTurnResponse:
        ended, following, inputs = await self._turns.end_turn(
            fence_of(request.fence), request.turn_id
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
        begun = None
        if self._step_process is not None:
            # The step writer process writes it: the same transaction, in another process.
            with self._database.traced("write"):
                begun = await self._step_process.call(BEGIN_STEP, request.SerializeToString())
        if begun is None:
            begun = await self._steps.begin_step(step_request(request))
        else:
            begun = await self._steps.settle_begin(begun)
        bound = await self._steps.definition(begun.agent_digest)
        return begin_step_response(begun, bound)

    async def EndStep(self, request: pb.EndStepRequest, context: Context) -> pb.EndStepResponse:
        ended = None
        if self._step_process is not None:
            with self._database.traced("write"):
                ended = await self._step_process.call(END_STEP, request.SerializeToString())
        if ended is None:
            step = await self._steps.end_step(
                fence_of(request.fence),
                request.step_id,
                step_end_of(request),
            )
        else:
            step = await self._steps.settle_end(ended)
        return end_step_response(step)

    async def WriteCheckpoint(
        self, request: pb.WriteCheckpointRequest, context: Context
    ) -> pb.WriteCheckpointResponse:
        checkpoint = await self._checkpoints.write_checkpoint(
            fence_of(request.fence),
            request.state_ref,
            request.after_sequence,
            request.request_id,
        )
        return pb.WriteCheckpointResponse(checkpoint=pm.checkpoint(checkpoint))

    async def CreateArtifact(
        self, request: pb.CreateArtifactRequest, context: Context
    ) -> pb.CreateArtifactResponse:
        artifact = await self._checkpoints.create_artifact(
            fence_of(request.fence),
            request.step_id,
            request.name,
            request.blob_digest,
            request.media_type,
            dict(request.labels),
            request.request_id,
        )
        return pb.CreateArtifactResponse(artifact=pm.artifact(artifact))
