"""Threads, runs, inputs and approvals: ``RuntimeService`` calls for backends and operators."""

from __future__ import annotations

import builtins
import datetime as dt
import getpass
import socket
from collections.abc import Iterable, Mapping

from google.protobuf import struct_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_core.proto_json import to_timestamp
from agentrt_sdk.paging import collect
from agentrt_sdk.transport import Connection


def default_actor() -> str:
    """``user@host`` of this process: the label recorded beside the caller's principal when
    the caller gives none."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _struct(data: Mapping[str, object] | None) -> struct_pb2.Struct | None:
    if data is None:
        return None
    value = struct_pb2.Struct()
    value.update(dict(data))  # type: ignore[arg-type]  # JSON-like values, checked by protobuf
    return value


class Threads:
    """Conversations: a thread holds messages and the runs made in it."""

    def __init__(self, connection: Connection) -> None:
        self._c = connection

    async def create(
        self,
        title: str = "",
        *,
        namespace: str = "",
        metadata: Mapping[str, str] | None = None,
        concurrency_policy: int = enum_pb2.CONCURRENCY_POLICY_UNSPECIFIED,
        request_id: str = "",
    ) -> message_pb2.Thread:
        """Create a thread. ``request_id`` (generated when empty) makes a retry return the
        same thread."""
        response = await self._c.unary(
            "runtime",
            "CreateThread",
            pb.CreateThreadRequest(
                title=title,
                namespace=namespace,
                metadata=metadata,
                concurrency_policy=concurrency_policy,  # type: ignore[arg-type]
                request_id=request_id,
            ),
            pb.CreateThreadResponse,
        )
        return response.thread

    async def get(self, thread_id: str) -> message_pb2.Thread:
        response = await self._c.unary(
            "runtime", "GetThread", pb.GetThreadRequest(thread_id=thread_id), pb.GetThreadResponse
        )
        return response.thread

    async def list(
        self,
        *,
        namespace: str = "",
        metadata: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> builtins.list[message_pb2.Thread]:
        return await collect(
            self._c,
            "runtime",
            "ListThreads",
            pb.ListThreadsRequest(namespace=namespace, metadata=metadata),
            "threads",
            limit,
        )

    async def append_message(
        self,
        thread_id: str,
        content: str,
        *,
        role: int = enum_pb2.MESSAGE_ROLE_USER,
        data: Mapping[str, object] | None = None,
        run_id: str = "",
        request_id: str = "",
    ) -> message_pb2.Message:
        response = await self._c.unary(
            "runtime",
            "AppendMessage",
            pb.AppendMessageRequest(
                thread_id=thread_id,
                role=role,  # type: ignore[arg-type]
                content=content,
                data=_struct(data),
                run_id=run_id,
                request_id=request_id,
            ),
            pb.AppendMessageResponse,
        )
        return response.message

    async def messages(
        self, thread_id: str, *, run_id: str = "", limit: int | None = None
    ) -> builtins.list[message_pb2.Message]:
        return await collect(
            self._c,
            "runtime",
            "ListMessages",
            pb.ListMessagesRequest(thread_id=thread_id, run_id=run_id),
            "messages",
            limit,
        )


class Runs:
    """Runs: one goal executed by one bound agent definition, over attempts."""

    def __init__(self, connection: Connection) -> None:
        self._c = connection

    async def create(
        self,
        thread_id: str,
        agent_ref: str,
        objective: str,
        *,
        scope: Iterable[str] = (),
        acceptance_criteria: Iterable[str] = (),
        budget: message_pb2.Budget | None = None,
        deadline: dt.datetime | None = None,
        priority: int = 0,
        max_attempts: int = 0,
        labels: Mapping[str, str] | None = None,
        permission_ceiling: int = enum_pb2.PERMISSION_CEILING_UNSPECIFIED,
        parent_run_id: str = "",
        derived_from_run_id: str = "",
        request_id: str = "",
    ) -> message_pb2.Run:
        """Queue a run of ``agent_ref`` (``agent:tag``, ``agent@label`` or a digest), bound
        once and for good to the digest the reference names now."""
        response = await self._c.unary(
            "runtime",
            "CreateRun",
            pb.CreateRunRequest(
                thread_id=thread_id,
                agent_ref=agent_ref,
                goal=message_pb2.Goal(
                    objective=objective,
                    scope=list(scope),
                    acceptance_criteria=list(acceptance_criteria),
                ),
                budget=budget,
                # A naive deadline is local time, as datetime.astimezone() reads it (and as this
                # call always read it); aware ones keep their zone.
                deadline_time=None if deadline is None else to_timestamp(deadline.astimezone()),
                priority=priority,
                max_attempts=max_attempts,
                labels=labels,
                permission_ceiling=permission_ceiling,  # type: ignore[arg-type]
                parent_run_id=parent_run_id,
                derived_from_run_id=derived_from_run_id,
                request_id=request_id,
            ),
            pb.CreateRunResponse,
        )
        return response.run

    async def get(self, run_id: str) -> message_pb2.Run:
        response = await self._c.unary(
            "runtime", "GetRun", pb.GetRunRequest(run_id=run_id), pb.GetRunResponse
        )
        return response.run

    async def list(
        self,
        *,
        thread_id: str = "",
        statuses: Iterable[int] = (),
        agent_id: str = "",
        namespace: str = "",
        agent_digest: str = "",
        agent_tag: str = "",
        created_from: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        limit: int | None = None,
    ) -> builtins.list[message_pb2.Run]:
        """The runs matching every filter given, newest first: of a thread, in one of
        ``statuses``, of an agent, in a namespace, bound to a definition's digest, created
        through a tag, created from ``created_from`` (inclusive) to ``created_before``
        (exclusive; aware datetimes)."""
        request = pb.ListRunsRequest(
            thread_id=thread_id,
            statuses=list(statuses),  # type: ignore[arg-type]
            agent_id=agent_id,
            namespace=namespace,
            agent_digest=agent_digest,
            agent_tag=agent_tag,
        )
        if created_from is not None:
            request.create_time_start.FromDatetime(created_from)
        if created_before is not None:
            request.create_time_end.FromDatetime(created_before)
        return await collect(self._c, "runtime", "ListRuns", request, "runs", limit)

    async def cancel(self, run_id: str, reason: str = "", *, actor: str = "") -> message_pb2.Run:
        """Ask the run to stop; ``actor`` is a display label for who asked (the server
        records the authenticated principal beside it), as for pause and resume."""
        response = await self._c.unary(
            "runtime",
            "CancelRun",
            pb.CancelRunRequest(run_id=run_id, reason=reason, actor=actor),
            pb.CancelRunResponse,
        )
        return response.run

    async def pause(self, run_id: str, reason: str = "", *, actor: str = "") -> message_pb2.Run:
        response = await self._c.unary(
            "runtime",
            "PauseRun",
            pb.PauseRunRequest(run_id=run_id, reason=reason, actor=actor),
            pb.PauseRunResponse,
        )
        return response.run

    async def resume(self, run_id: str, reason: str = "", *, actor: str = "") -> message_pb2.Run:
        response = await self._c.unary(
            "runtime",
            "ResumeRun",
            pb.ResumeRunRequest(run_id=run_id, reason=reason, actor=actor),
            pb.ResumeRunResponse,
        )
        return response.run

    async def amend(
        self,
        run_id: str,
        amendment: message_pb2.Amendment,
        *,
        expected_input_revision: int = 0,
        request_id: str = "",
    ) -> message_pb2.Run:
        response = await self._c.unary(
            "runtime",
            "AmendRun",
            pb.AmendRunRequest(
                run_id=run_id,
                amendment=amendment,
                expected_input_revision=expected_input_revision,
                request_id=request_id,
            ),
            pb.AmendRunResponse,
        )
        return response.run

    async def send(
        self,
        run_id: str,
        content: str,
        *,
        kind: int = enum_pb2.INPUT_KIND_FOLLOW_UP,
        data: Mapping[str, object] | None = None,
        sender: str = "",
        request_id: str = "",
    ) -> message_pb2.Input:
        """Send an input: a follow-up (the next turn) or a steer (the next model call).
        ``sender`` is a display label; the server records the authenticated principal."""
        response = await self._c.unary(
            "runtime",
            "SendInput",
            pb.SendInputRequest(
                run_id=run_id,
                kind=kind,  # type: ignore[arg-type]
                content=content,
                data=_struct(data),
                sender=sender,
                request_id=request_id,
            ),
            pb.SendInputResponse,
        )
        return response.input

    async def steer(self, run_id: str, content: str, *, sender: str = "") -> message_pb2.Input:
        return await self.send(run_id, content, kind=enum_pb2.INPUT_KIND_STEER, sender=sender)

    async def follow_up(self, run_id: str, content: str, *, sender: str = "") -> message_pb2.Input:
        return await self.send(run_id, content, kind=enum_pb2.INPUT_KIND_FOLLOW_UP, sender=sender)

    async def resolve_approval(
        self,
        run_id: str,
        step_id: str,
        *,
        approve: bool,
        approver: str | None = None,
        comment: str = "",
        request_id: str = "",
    ) -> pb.ResolveApprovalResponse:
        """Approve or deny the approval step ``step_id``; the run is queued again.

        ``approver`` is the label recorded beside the authenticated principal (default: this
        process's ``user@host``)."""
        decision = (
            enum_pb2.APPROVAL_DECISION_APPROVE if approve else enum_pb2.APPROVAL_DECISION_DENY
        )
        return await self._c.unary(
            "runtime",
            "ResolveApproval",
            pb.ResolveApprovalRequest(
                run_id=run_id,
                step_id=step_id,
                decision=decision,
                approver=approver or default_actor(),
                comment=comment,
                request_id=request_id,
            ),
            pb.ResolveApprovalResponse,
        )

    async def attempts(self, run_id: str) -> builtins.list[message_pb2.Attempt]:
        return await collect(
            self._c, "runtime", "ListAttempts", pb.ListAttemptsRequest(run_id=run_id), "attempts"
        )

    async def steps(
        self, run_id: str, *, attempt_id: str = "", turn_id: str = ""
    ) -> builtins.list[message_pb2.Step]:
        request = pb.ListStepsRequest(run_id=run_id, attempt_id=attempt_id, turn_id=turn_id)
        return await collect(self._c, "runtime", "ListSteps", request, "steps")

    async def step(self, step_id: str) -> message_pb2.Step:
        response = await self._c.unary(
            "runtime", "GetStep", pb.GetStepRequest(step_id=step_id), pb.GetStepResponse
        )
        return response.step

    async def artifacts(
        self, *, run_id: str = "", thread_id: str = ""
    ) -> builtins.list[message_pb2.Artifact]:
        request = pb.ListArtifactsRequest(run_id=run_id, thread_id=thread_id)
        return await collect(self._c, "runtime", "ListArtifacts", request, "artifacts")
