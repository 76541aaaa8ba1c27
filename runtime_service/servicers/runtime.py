"""gRPC adapter of ``agentrt.runtime.v1.RuntimeService``: proto in, use case, proto out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentrt.runtime.v1 import enum_pb2, message_pb2, runtime_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.access import VISIBLE, check_namespace
from agentrt_base.tracing import call_traceparent
from agentrt_core.errors import InvalidArgument
from agentrt_core.event_chain import StoredEvent
from agentrt_core.lru import LruCache
from agentrt_core.proto_json import (
    enum_name,
    enum_value,
    message_json,
    struct_to_json,
    time_or_none,
)
from runtime_service import proto_map as pm
from runtime_service.services.approvals import ApprovalsService
from runtime_service.services.blobs import BlobHeader, BlobService
from runtime_service.services.bound import BoundAgents
from runtime_service.services.checkpoints import CheckpointsService
from runtime_service.services.context import Runtime
from runtime_service.services.inputs import InputsService
from runtime_service.services.run_filters import RunFilter
from runtime_service.services.runs import RunSpec, RunsService
from runtime_service.services.steps import StepsService
from runtime_service.services.views import SavedView, ViewsService
from runtime_service.services.watch import WatchService

Context = Any


class RuntimeServicer(runtime_service_pb2_grpc.RuntimeServiceServicer):
    def __init__(self, runtime: Runtime, bound: BoundAgents) -> None:
        self._runs = RunsService(runtime)
        self._watch = WatchService(runtime)
        self._steps = StepsService(runtime, bound)
        self._inputs = InputsService(runtime)
        self._approvals = ApprovalsService(runtime)
        self._checkpoints = CheckpointsService(runtime)
        self._blobs = BlobService(runtime)
        self._views = ViewsService(runtime)
        # Events never change, and many watchers of one run receive the same ones: convert
        # each once and hand the same (never mutated) message to every stream.
        self._event_responses: LruCache[str, pb.WatchRunResponse] = LruCache(4096)

    def _run_response(self, event: StoredEvent) -> pb.WatchRunResponse:
        response = self._event_responses.get(event.id)
        if response is None:
            response = pb.WatchRunResponse(event=pm.event(event))
            self._event_responses.put(event.id, response)
        return response

    async def SendInput(
        self, request: pb.SendInputRequest, context: Context
    ) -> pb.SendInputResponse:
        item = await self._inputs.send_input(
            request.run_id,
            enum_name(enum_pb2.InputKind, "INPUT_KIND_", request.kind, "kind", required=True),
            request.content,
            struct_to_json(request.data),
            request.sender,
            request.request_id,
        )
        return pb.SendInputResponse(input=pm.input_(item))

    async def ResolveApproval(
        self, request: pb.ResolveApprovalRequest, context: Context
    ) -> pb.ResolveApprovalResponse:
        step, run = await self._approvals.resolve_approval(
            request.run_id,
            request.step_id,
            enum_name(
                enum_pb2.ApprovalDecision,
                "APPROVAL_DECISION_",
                request.decision,
                "decision",
                required=True,
            ),
            request.approver,
            request.comment,
        )
        return pb.ResolveApprovalResponse(step=pm.step(step), run=pm.run(run))

    async def ListSteps(
        self, request: pb.ListStepsRequest, context: Context
    ) -> pb.ListStepsResponse:
        steps, token = await self._steps.list_steps(
            request.run_id,
            request.attempt_id,
            request.turn_id,
            request.page_size,
            request.page_token,
        )
        return pb.ListStepsResponse(steps=[pm.step(s) for s in steps], next_page_token=token)

    async def GetStep(self, request: pb.GetStepRequest, context: Context) -> pb.GetStepResponse:
        return pb.GetStepResponse(step=pm.step(await self._steps.get_step(request.step_id)))

    async def ListArtifacts(
        self, request: pb.ListArtifactsRequest, context: Context
    ) -> pb.ListArtifactsResponse:
        artifacts, token = await self._checkpoints.list_artifacts(
            request.run_id, request.thread_id, request.page_size, request.page_token
        )
        return pb.ListArtifactsResponse(
            artifacts=[pm.artifact(a) for a in artifacts], next_page_token=token
        )

    async def PutBlob(
        self, request_iterator: AsyncIterator[pb.PutBlobRequest], context: Context
    ) -> pb.PutBlobResponse:
        first = await anext(aiter(request_iterator), None)
        header = None
        if first is not None and first.WhichOneof("content") == "header":
            header = BlobHeader(
                first.header.media_type,
                first.header.size,
                first.header.expected_digest,
                check_namespace(first.header.namespace, "header.namespace"),
            )

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("content") != "chunk":
                    raise InvalidArgument.for_field("header", "only the first message is a header")
                yield message.chunk

        row, created = await self._blobs.put(header, chunks())
        return pb.PutBlobResponse(blob=pm.blob(row), created=created)

    async def GetBlob(
        self, request: pb.GetBlobRequest, context: Context
    ) -> AsyncIterator[pb.GetBlobResponse]:
        row, chunks = await self._blobs.get(
            check_namespace(request.namespace, "namespace"), request.digest
        )
        yield pb.GetBlobResponse(blob=pm.blob(row))
        async for chunk in chunks:
            yield pb.GetBlobResponse(chunk=chunk)

    async def CreateThread(
        self, request: pb.CreateThreadRequest, context: Context
    ) -> pb.CreateThreadResponse:
        thread = await self._runs.create_thread(
            check_namespace(request.namespace, "namespace"),
            request.title,
            dict(request.metadata),
            enum_name(
                enum_pb2.ConcurrencyPolicy,
                "CONCURRENCY_POLICY_",
                request.concurrency_policy,
                "concurrency_policy",
            ),
            request.request_id,
        )
        return pb.CreateThreadResponse(thread=pm.thread(thread))

    async def GetThread(
        self, request: pb.GetThreadRequest, context: Context
    ) -> pb.GetThreadResponse:
        return pb.GetThreadResponse(
            thread=pm.thread(await self._runs.get_thread(request.thread_id))
        )

    async def ListThreads(
        self, request: pb.ListThreadsRequest, context: Context
    ) -> pb.ListThreadsResponse:
        threads, token = await self._runs.list_threads(
            dict(request.metadata),
            request.namespace,
            VISIBLE.get(),
            request.page_size,
            request.page_token,
        )
        return pb.ListThreadsResponse(
            threads=[pm.thread(t) for t in threads], next_page_token=token
        )

    async def AppendMessage(
        self, request: pb.AppendMessageRequest, context: Context
    ) -> pb.AppendMessageResponse:
        message = await self._runs.append_message(
            request.thread_id,
            enum_name(enum_pb2.MessageRole, "MESSAGE_ROLE_", request.role, "role", required=True),
            request.content,
            struct_to_json(request.data),
            request.run_id,
            request.request_id,
        )
        return pb.AppendMessageResponse(message=pm.message(message))

    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: Context
    ) -> pb.ListMessagesResponse:
        messages, token = await self._runs.list_messages(
            request.thread_id,
            request.run_id,
            request.newest_first,
            request.page_size,
            request.page_token,
        )
        return pb.ListMessagesResponse(
            messages=[pm.message(m) for m in messages], next_page_token=token
        )

    async def CreateRun(
        self, request: pb.CreateRunRequest, context: Context
    ) -> pb.CreateRunResponse:
        spec = RunSpec(
            thread_id=request.thread_id,
            agent_ref=request.agent_ref,
            goal=message_json(request.goal),
            max_steps=request.budget.max_steps,
            max_model_tokens=request.budget.max_model_tokens,
            max_cost_usd=request.budget.max_cost_usd,
            deadline_time=time_or_none(request, "deadline_time"),
            priority=request.priority,
            max_attempts=request.max_attempts,
            parent_run_id=request.parent_run_id,
            derived_from_run_id=request.derived_from_run_id,
            permission_ceiling=enum_name(
                enum_pb2.PermissionCeiling,
                "PERMISSION_CEILING_",
                request.permission_ceiling,
                "permission_ceiling",
            ),
            concurrency_policy=enum_name(
                enum_pb2.ConcurrencyPolicy,
                "CONCURRENCY_POLICY_",
                request.concurrency_policy,
                "concurrency_policy",
            ),
            labels=dict(request.labels),
            request_id=request.request_id,
            traceparent=call_traceparent(context),
        )
        return pb.CreateRunResponse(run=pm.run(await self._runs.create_run(spec)))

    async def GetRun(self, request: pb.GetRunRequest, context: Context) -> pb.GetRunResponse:
        return pb.GetRunResponse(run=pm.run(await self._runs.get_run(request.run_id)))

    async def ListRuns(self, request: pb.ListRunsRequest, context: Context) -> pb.ListRunsResponse:
        where = _run_filter(request)
        runs, token = await self._runs.list_runs(
            where, VISIBLE.get(), request.page_size, request.page_token
        )
        return pb.ListRunsResponse(runs=[pm.run(r) for r in runs], next_page_token=token)

    async def SaveView(self, request: pb.SaveViewRequest, context: Context) -> pb.SaveViewResponse:
        where = _run_filter(request.view.query, "view.query.")
        view, created = await self._views.save(request.view.name, where)
        return pb.SaveViewResponse(view=_saved_view(view), created=created)

    async def ListViews(
        self, request: pb.ListViewsRequest, context: Context
    ) -> pb.ListViewsResponse:
        found, token = await self._views.list(request.page_size, request.page_token)
        return pb.ListViewsResponse(views=[_saved_view(v) for v in found], next_page_token=token)

    async def DeleteView(
        self, request: pb.DeleteViewRequest, context: Context
    ) -> pb.DeleteViewResponse:
        await self._views.delete(request.name)
        return pb.DeleteViewResponse()

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: Context
    ) -> pb.CancelRunResponse:
        run = await self._runs.cancel_run(request.run_id, request.reason, request.actor)
        return pb.CancelRunResponse(run=pm.run(run))

    async def PauseRun(self, request: pb.PauseRunRequest, context: Context) -> pb.PauseRunResponse:
        run = await self._runs.pause_run(request.run_id, request.reason, request.actor)
        return pb.PauseRunResponse(run=pm.run(run))

    async def ResumeRun(
        self, request: pb.ResumeRunRequest, context: Context
    ) -> pb.ResumeRunResponse:
        run = await self._runs.resume_run(request.run_id, request.reason, request.actor)
        return pb.ResumeRunResponse(run=pm.run(run))

    async def AmendRun(self, request: pb.AmendRunRequest, context: Context) -> pb.AmendRunResponse:
        amendment = message_json(request.amendment)
        for server_side in ("input_revision", "actor", "create_time"):
            amendment.pop(server_side, None)
        run = await self._runs.amend_run(
            request.run_id,
            amendment,
            request.expected_input_revision,
            request.actor,
            request.request_id,  # fix: was dropped, so retries amended twice
        )
        return pb.AmendRunResponse(run=pm.run(run))

    async def ListAttempts(
        self, request: pb.ListAttemptsRequest, context: Context
    ) -> pb.ListAttemptsResponse:
        attempts, token = await self._runs.list_attempts(
            request.run_id, request.page_size, request.page_token
        )
        return pb.ListAttemptsResponse(
            attempts=[pm.attempt(a) for a in attempts], next_page_token=token
        )

    async def WatchRun(
        self, request: pb.WatchRunRequest, context: Context
    ) -> AsyncIterator[pb.WatchRunResponse]:
        if request.after_sequence < 0:
            raise InvalidArgument.for_field("after_sequence", "must not be negative")
        types = _event_types(request.event_types)
        async for event in self._watch.watch_run(request.run_id, request.after_sequence):
            if not types or event.event_type in types:
                yield self._run_response(event)

    async def WatchThread(
        self, request: pb.WatchThreadRequest, context: Context
    ) -> AsyncIterator[pb.WatchThreadResponse]:
        types = _event_types(request.event_types)
        async for event in self._watch.watch_thread(
            request.thread_id, request.after_cursor, request.live_only
        ):
            if not types or event.event_type in types:
                yield pb.WatchThreadResponse(event=pm.event(event), cursor=str(event.thread_cursor))


def _event_types(values: Any) -> set[str]:
    names = set()
    for i, value in enumerate(values):
        name = enum_name(
            enum_pb2.EventType, "EVENT_TYPE_", value, f"event_types[{i}]", required=True
        )
        head, _, tail = name.lower().partition("_")
        names.add(f"{head}.{tail}")
    return names


def _run_filter(query: pb.ListRunsRequest | message_pb2.RunsQuery, prefix: str = "") -> RunFilter:
    """A runs filter from ListRuns's request or a saved view's query (the same fields);
    ``prefix``: where the fields are in the request, for the errors."""
    statuses = [
        enum_name(enum_pb2.RunStatus, "RUN_STATUS_", s, f"{prefix}statuses[{i}]", required=True)
        for i, s in enumerate(query.statuses)
    ]
    return RunFilter(
        thread_id=query.thread_id,
        statuses=tuple(statuses),
        agent_id=query.agent_id,
        namespace=query.namespace,
        agent_digest=query.agent_digest,
        agent_tag=query.agent_tag,
        created_from=time_or_none(query, "create_time_start"),
        created_before=time_or_none(query, "create_time_end"),
    )


def _saved_view(view: SavedView) -> message_pb2.SavedView:
    where = view.where
    return message_pb2.SavedView(
        name=view.name,
        query=message_pb2.RunsQuery(
            thread_id=where.thread_id,
            statuses=[enum_value(enum_pb2.RunStatus, "RUN_STATUS_", s) for s in where.statuses],
            agent_id=where.agent_id,
            namespace=where.namespace,
            agent_digest=where.agent_digest,
            agent_tag=where.agent_tag,
            create_time_start=pm.timestamp(where.created_from),
            create_time_end=pm.timestamp(where.created_before),
        ),
        principal=view.principal,
        create_time=pm.timestamp(view.create_time),
        update_time=pm.timestamp(view.update_time),
    )
