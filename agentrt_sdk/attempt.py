"""What the agent logic sees while it works on one attempt: the bound definition, the state
it resumes from, and steps as context managers that record themselves.

Every step the logic takes is keyed (``BeginStep.idempotency_key``) by what it is and how
many of its kind came before it (``tool:read_file:0``, ``model:2``), and an attempt starts
where the last checkpoint left the run: the logic's :attr:`Attempt.state` and the SDK's
step counters are both restored from it (from nothing, without one). Logic that runs again
from that point asks for the keys it asked for before, so a step that already succeeded is
handed back as recorded (``existing``: its output read from its blob, not made again), a
step that failed is tried again, and a tool call an approver decided is answered with the
decision — the way Temporal replays a workflow's commands against its history. As there, the
logic must be deterministic: the same inputs and step results lead it to the same steps.

Only :meth:`Attempt.checkpoint` moves the resume point. The worker writes none of its own
when an attempt stops for an approval or a pause: the next attempt replays from the last
checkpoint the logic wrote, and its recorded steps make the replay cheap.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core import resolution
from agentrt_core.errors import FailedPrecondition
from agentrt_core.proto_json import short_name
from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.models.base import (
    ModelAdapter,
    ModelError,
    ModelResponse,
    ToolCall,
)
from agentrt_sdk.retry import ModelRetryPolicy, RetriesExhausted
from agentrt_sdk.step_handles import ModelCall, ToolCallStep, ToolResult
from agentrt_sdk.tracing import Tracer, step_span, tracer_for

_log = logging.getLogger("agentrt_sdk.worker")

#: The key under which the SDK keeps its own bookkeeping in a checkpoint's state.
_SDK_STATE = "__agentrt__"
_JSON = "application/json"


class AttemptStopped(Exception):
    """Raised inside agent logic when the attempt must stop (cancel, pause, lease lost, or
    a tool call waiting for approval). The worker catches it; agent logic should let it
    propagate (``finally`` blocks still run)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class ApprovalPending(AttemptStopped):
    """A tool call needs a human's decision: the worker finishes the attempt
    WAITING_APPROVAL; the run continues in a new attempt once it is decided, which replays
    the logic from the last checkpoint and receives the decision for the same call."""

    def __init__(self, step: message_pb2.Step) -> None:
        super().__init__(f"tool call {step.operation} waits for approval (step {step.id})")
        self.step = step


def _response_json(response: ModelResponse) -> bytes:
    return json.dumps(
        {
            "model_id": response.model_id,
            "content": response.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
                for c in response.tool_calls
            ],
            "input_tokens": response.input_tokens,
            "output_tokens": response.output_tokens,
            "finish_reason": response.finish_reason,
        },
        sort_keys=True,
    ).encode()


def _response_from_json(data: Mapping[str, Any]) -> ModelResponse:
    return ModelResponse(
        model_id=data["model_id"],
        content=data["content"],
        tool_calls=[ToolCall(c["id"], c["name"], c["arguments"]) for c in data["tool_calls"]],
        input_tokens=data["input_tokens"],
        output_tokens=data["output_tokens"],
        finish_reason=data["finish_reason"],
    )


@dataclass
class Attempt:
    """One attempt of one run, handed to the agent function.

    Attributes:
        run: the run as acquired (its goal, its binding to a digest).
        attempt: the attempt (number, reason, resume point).
        agent: the bound definition (``definition_json`` holds its prompt and policies).
        resume_from: the checkpoint this attempt resumes from, if any.
        state: the agent's own state, JSON-serialisable: restored from ``resume_from`` and
            saved by :meth:`checkpoint`.
        inputs: the inputs (follow-ups, steers) delivered when the current turn opened.
    """

    client: AgentrtClient
    run: message_pb2.Run
    attempt: message_pb2.Attempt
    fence: message_pb2.Fence
    agent: message_pb2.BoundAgent
    resume_from: message_pb2.Checkpoint | None
    model: ModelAdapter | None
    tools: Mapping[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    inputs: list[message_pb2.Input] = field(default_factory=list)
    turn_id: str = ""
    stop_reason: str = ""
    #: How :meth:`generate` retries a failed model call, and when it gives up.
    retry: ModelRetryPolicy = field(default_factory=ModelRetryPolicy)
    #: Retries :meth:`generate` made in this attempt (``maximum_retries_per_attempt``).
    retries: int = 0
    #: The tracer of the worker's spans (``agentrt_sdk.tracing``; the global one's).
    tracer: Tracer = field(default_factory=lambda: tracer_for(None))
    _counters: dict[str, int] = field(default_factory=dict)
    _last_sequence: int = 0

    @functools.cached_property
    def definition(self) -> resolution.BoundDefinition:
        """The bound definition, parsed by the runtime's own reader of ``definition_json``:
        the prompt, the policies, each skill's and tool's pinned spec."""
        return resolution.bound_definition(json.loads(self.agent.definition_json))

    # -- the worker's side ------------------------------------------------------------------

    async def _restore(self) -> None:
        if self.resume_from is None or not self.resume_from.state_ref:
            return
        _, content = await self.client.blobs.get(
            self.resume_from.state_ref, namespace=self.run.namespace
        )
        saved = json.loads(content)
        sdk = saved.pop(_SDK_STATE, {})
        self._counters = {k: int(v) for k, v in sdk.get("counters", {}).items()}
        self._last_sequence = self.resume_from.after_sequence
        self.state = saved

    async def _worker(self, method: str, request: Any, answer: type[Any]) -> Any:
        self.check_stop()
        return await self.client.connection.unary("worker", method, request, answer)

    def check_stop(self) -> None:
        """Raise :class:`AttemptStopped` if the run was cancelled or paused or the lease lost;
        every SDK call checks it, long-running agent code may call it too."""
        if self.stop_reason:
            raise AttemptStopped(self.stop_reason)

    def _key(self, kind: str, name: str = "") -> str:
        base = f"{kind}:{name}" if name else kind
        n = self._counters.get(base, 0)
        self._counters[base] = n + 1
        return f"{base}:{n}"

    def _seen(self, step: message_pb2.Step) -> None:
        self._last_sequence = max(self._last_sequence, step.sequence)

    async def _put_json(self, value: Any) -> str:
        blob = await self.client.blobs.put(
            json.dumps(value, sort_keys=True).encode(),
            media_type=_JSON,
            namespace=self.run.namespace,
        )
        return blob.digest

    async def _get_json(self, digest: str) -> Any:
        _, content = await self.client.blobs.get(digest, namespace=self.run.namespace)
        return json.loads(content)

    async def _end(self, step_id: str, **fields: Any) -> message_pb2.Step:
        request = wpb.EndStepRequest(fence=self.fence, step_id=step_id, **fields)
        # Ending a step is idempotent: the transport retries it on UNAVAILABLE.
        response = await self.client.connection.unary(
            "worker", "EndStep", request, wpb.EndStepResponse
        )
        self._seen(response.step)
        return response.step

    async def _fail(self, step_id: str, exc: BaseException, *, tool_error: bool = False) -> None:
        if isinstance(exc, ModelError):
            error_class, retryable = exc.error_class, exc.retryable
        elif tool_error and isinstance(exc, Exception) and not isinstance(exc, AttemptStopped):
            error_class, retryable = enum_pb2.ERROR_CLASS_TOOL_ERROR, False
        elif isinstance(exc, asyncio.CancelledError | AttemptStopped):
            await self._end(
                step_id,
                status=enum_pb2.STEP_STATUS_CANCELLED,
                error_class=enum_pb2.ERROR_CLASS_CANCELLED,
                error_message=str(exc)[:1000],
            )
            return
        else:
            error_class, retryable = enum_pb2.ERROR_CLASS_WORKER_ERROR, False
        await self._end(
            step_id,
            status=enum_pb2.STEP_STATUS_FAILED,
            error_class=error_class,
            error_message=f"{type(exc).__name__}: {exc}"[:1000],
            retryable=retryable,
        )

    # -- steps ------------------------------------------------------------------------------

    @asynccontextmanager
    async def model_call(
        self,
        *,
        skills: Sequence[str] = (),
        tools: Sequence[str] | None = None,
        estimated_input_tokens: int = 0,
        key: str | None = None,
        retry_of_step_id: str = "",
    ) -> AsyncIterator[ModelCall]:
        """A MODEL_CALL step: the runtime resolves the model (following the policy's fallback
        after a failed call), prompt, skills and tools; the block calls the model.

        ``tools`` default to every tool of the definition; ``skills`` to every skill."""
        request = wpb.BeginStepRequest(
            fence=self.fence,
            turn_id=self.turn_id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key=key or self._key("model"),
            retry_of_step_id=retry_of_step_id,
            model_call=message_pb2.ModelCallSpec(
                estimated_input_tokens=estimated_input_tokens,
                skills=list(skills),
                tools=list(self.agent.tool_names if tools is None else tools),
            ),
        )
        begun = await self._worker("BeginStep", request, wpb.BeginStepResponse)
        self._seen(begun.step)
        call = ModelCall(
            begun.step,
            begun.resolved,
            list(begun.steer_inputs),
            begun.existing,
            self.model,
            {name: str(t.spec.get("description", "")) for name, t in self.definition.tools.items()},
        )
        if begun.existing and begun.step.status == enum_pb2.STEP_STATUS_SUCCEEDED:
            call.response = _response_from_json(await self._get_json(begun.step.output_ref))
            yield call
            return
        try:
            with step_span(self.tracer, begun.step, f"agentrt.worker.model_call {call.model_id}"):
                yield call
        except BaseException as exc:
            await self._fail(begun.step.id, exc)
            raise
        if call.response is None:
            raise RuntimeError("a model_call block must set call.response (or call complete)")
        response = call.response
        output_ref = (
            await self.client.blobs.put(
                _response_json(response), media_type=_JSON, namespace=self.run.namespace
            )
        ).digest
        await self._end(
            begun.step.id,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            output_ref=output_ref,
            summary=(response.content or ", ".join(c.name for c in response.tool_calls))[:200],
            usage=message_pb2.Usage(
                input_tokens=response.input_tokens, output_tokens=response.output_tokens
            ),
            reported_model_id=response.model_id,
        )

    async def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        skills: Sequence[str] = (),
        tools: Sequence[str] | None = None,
        estimated_input_tokens: int = 0,
    ) -> ModelResponse:
        """Call the model the policy resolves; after a failure, record it and call again
        while that can help: the runtime then resolves the policy's fallback candidate (when
        the failed one lists the error class in ``fallback_on``), called at once, or the same
        one, called after :attr:`retry`'s backoff (at least the provider's ``retry_after``).
        Each retry is logged (logger ``agentrt_sdk.worker``, WARNING).

        Raises:
            ModelError: the failure, when calling again cannot help: the same candidate would
                be called and the error is not retryable, or the policy has no candidate left.
            RetriesExhausted: :attr:`retry` allows no more tries (of this call, or in this
                attempt); the worker fails the attempt with it.
        """
        key = self._key("model")
        retry_of = ""
        tries = same_retries = 0
        started = time.monotonic()
        while True:
            try:
                async with self.model_call(
                    skills=skills,
                    tools=tools,
                    estimated_input_tokens=estimated_input_tokens,
                    key=key,
                    retry_of_step_id=retry_of,
                ) as call:
                    if call.response is None:
                        await call.complete(messages)
                    assert call.response is not None
                    return call.response
            except ModelError as exc:
                following = self._next_candidate(call.candidate, exc, estimated_input_tokens)
                same = following == call.candidate
                if following is None or (same and not exc.retryable):
                    raise
                tries += 1
                limit = self.retry.limit_reached(tries, self.retries)
                if limit:
                    raise RetriesExhausted(exc, tries, time.monotonic() - started, limit) from exc
                self.retries += 1
                retry_of = call.step.id
                # A provider's retry_after is honoured up to the policy's longest wait.
                asked = min(exc.retry_after or 0.0, self.retry.per_call.max_backoff)
                wait = self.retry.per_call.delay(same_retries, asked) if same else 0.0
                same_retries += same
                _log.warning(
                    "run %s: model call to %s failed (%s: %s); %s (try %d of %d)",
                    self.run.id,
                    call.candidate or call.model_id,
                    short_name(enum_pb2.ErrorClass, "ERROR_CLASS_", exc.error_class, "error_class"),
                    exc.message,
                    f"retrying in {wait:.1f} s" if same else f"falling back to {following}",
                    tries + 1,
                    self.retry.per_call.attempts,
                )
                if wait:
                    await asyncio.sleep(wait)

    def _next_candidate(
        self, failed: str, exc: ModelError, estimated_input_tokens: int
    ) -> str | None:
        """The candidate the runtime will resolve after ``failed`` failed with ``exc`` (None:
        none is left), by the runtime's own rule (``resolution.choose_model``), so the worker
        and the ledger cannot disagree about the fallback."""
        try:
            choice = resolution.choose_model(
                self.definition.model_policy.spec,
                estimated_input_tokens=estimated_input_tokens,
                previous_error_class=short_name(
                    enum_pb2.ErrorClass, "ERROR_CLASS_", exc.error_class, "error_class"
                ),
                previous_candidate=failed,
            )
        except FailedPrecondition:  # NO_MODEL_CANDIDATE
            return None
        return str(choice.candidate.get("name", ""))

    @asynccontextmanager
    async def tool_call(
        self, tool: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> AsyncIterator[ToolCallStep]:
        """A TOOL_CALL step whose block runs the tool and sets ``call.output``, unless
        ``call.done`` says the call was already decided (denied by the approver, or made in an
        earlier attempt: its recorded output is in ``call.output``). :meth:`tool` does this
        with the worker's registered tool functions.

        Raises:
            ApprovalPending: the permission policy requires approval; the attempt stops here
                and the worker finishes it WAITING_APPROVAL.
            InvalidArgumentError: the arguments break the tool's pinned schema (recorded as
                a FAILED step first; ``field_violations`` hold the JSON paths).
            PermissionDeniedError: the tool is outside the definition, or the policy or the
                run's ceiling denies it (recorded as a DENIED step first)."""
        args = struct_pb2.Struct()
        args.update(dict(arguments))
        request = wpb.BeginStepRequest(
            fence=self.fence,
            turn_id=self.turn_id,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key=key or self._key("tool", tool),
            tool_call=message_pb2.ToolCallSpec(tool=tool, arguments=args),
        )
        begun = await self._worker("BeginStep", request, wpb.BeginStepResponse)
        step = begun.step
        self._seen(step)
        resolved = begun.resolved.tools[0] if begun.resolved.tools else message_pb2.ResolvedTool()
        call = ToolCallStep(step, resolved, arguments)
        if step.status == enum_pb2.STEP_STATUS_WAITING_APPROVAL:
            raise ApprovalPending(step)
        if step.status == enum_pb2.STEP_STATUS_DENIED:
            call.denied = call.done = True
            yield call
            return
        if begun.existing and step.status == enum_pb2.STEP_STATUS_SUCCEEDED:
            call.output = await self._get_json(step.output_ref) if step.output_ref else None
            call.reused = call.done = True
            yield call
            return
        try:
            with step_span(self.tracer, step, f"agentrt.worker.tool_call {tool}"):
                yield call
        except BaseException as exc:
            await self._fail(step.id, exc, tool_error=True)
            raise
        call.step = await self._end(
            step.id,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            output_ref=await self._put_json(call.output),
            summary=f"{tool} ok",
            side_effect=resolved.side_effect,
        )

    async def tool(
        self, name: str, arguments: Mapping[str, Any], *, key: str | None = None
    ) -> ToolResult:
        """Call tool ``name`` with the function the worker registered for it, recorded as a
        TOOL_CALL step (see :meth:`tool_call` for what is raised)."""
        async with self.tool_call(name, arguments, key=key) as call:
            if not call.done:
                function = self.tools.get(name)
                if function is None:
                    raise RuntimeError(f"this worker has no function for tool {name!r}")
                call.output = await function(dict(arguments))
        return ToolResult(call.output, call.denied, call.reused, call.step)

    async def check(self, name: str, passed: bool, summary: str = "") -> message_pb2.Step:
        """Attest completion check ``name`` (a COMPLETION_CHECK step, SUCCEEDED if it passed,
        FAILED not retryable otherwise)."""
        request = wpb.BeginStepRequest(
            fence=self.fence,
            turn_id=self.turn_id,
            type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
            idempotency_key=self._key("check", name),
            completion_check=message_pb2.CompletionCheckSpec(check=name),
        )
        begun = await self._worker("BeginStep", request, wpb.BeginStepResponse)
        self._seen(begun.step)
        if begun.existing and begun.step.status != enum_pb2.STEP_STATUS_STARTED:
            return begun.step  # type: ignore[no-any-return]
        if passed:
            return await self._end(
                begun.step.id, status=enum_pb2.STEP_STATUS_SUCCEEDED, summary=summary or "passed"
            )
        return await self._end(
            begun.step.id,
            status=enum_pb2.STEP_STATUS_FAILED,
            summary=summary or "failed",
            error_class=enum_pb2.ERROR_CLASS_TOOL_ERROR,
            error_message=summary or f"check {name} failed",
        )

    async def checkpoint(self) -> message_pb2.Checkpoint:
        """Save :attr:`state` (and the SDK's step counters) as the point a later attempt
        resumes from: logic resuming there must skip what the state says is done."""
        self.check_stop()
        saved = {**self.state, _SDK_STATE: {"counters": dict(self._counters)}}
        request = wpb.WriteCheckpointRequest(
            fence=self.fence,
            state_ref=await self._put_json(saved),
            after_sequence=self._last_sequence,
        )
        response = await self.client.connection.unary(
            "worker", "WriteCheckpoint", request, wpb.WriteCheckpointResponse
        )
        return response.checkpoint

    async def artifact(
        self,
        name: str,
        content: bytes,
        *,
        step_id: str,
        media_type: str = "application/octet-stream",
        labels: Mapping[str, str] | None = None,
    ) -> message_pb2.Artifact:
        """Store ``content`` as a blob and record it as artifact ``name`` of ``step_id``."""
        blob = await self.client.blobs.put(
            content, media_type=media_type, namespace=self.run.namespace
        )
        request = wpb.CreateArtifactRequest(
            fence=self.fence,
            step_id=step_id,
            name=name,
            blob_digest=blob.digest,
            media_type=media_type,
            labels=labels,
            request_id=f"{self.attempt.id}:artifact:{name}:{step_id}",
        )
        response = await self._worker("CreateArtifact", request, wpb.CreateArtifactResponse)
        return response.artifact  # type: ignore[no-any-return]
