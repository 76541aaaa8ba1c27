"""The handles agent logic holds while a step is in progress, and a tool call's outcome.

``async with attempt.model_call() as call`` yields a :class:`ModelCall` (the resolved model,
tools and steers, and the response to set), ``async with attempt.tool_call(...) as call`` a
:class:`ToolCallStep` (the arguments, and the output to set), and ``await attempt.tool(...)``
returns a :class:`ToolResult`. They are plain values: what a step does when it begins and
ends, replays or stops is :class:`agentrt_sdk.attempt.Attempt`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrt.runtime.v1 import message_pb2
from agentrt_core.proto_json import struct_to_json
from agentrt_sdk.models.base import ModelAdapter, ModelRequest, ModelResponse, ToolSpec

__all__ = ["ModelCall", "ToolCallStep", "ToolResult"]


@dataclass
class ToolResult:
    """A tool call's outcome as the agent sees it.

    Attributes:
        output: what the tool returned (JSON), or None when denied.
        denied: the approver, the permission policy or the run's ceiling refused the call;
            a denial is the tool's answer for the agent, not a failure.
        reused: the call was already made in an earlier attempt; its recorded output is
            returned and the tool was not run again.
        step: the TOOL_CALL step as recorded.
    """

    output: Any
    denied: bool
    reused: bool
    step: message_pb2.Step


@dataclass
class ModelCall:
    """A MODEL_CALL step in progress (``async with attempt.model_call() as call``).

    Set :attr:`response` (or call :meth:`complete`) inside the block; on leaving it the step
    ends SUCCEEDED with the response's usage and reported model id. An exception leaving the
    block ends it FAILED with the exception's error class (a :class:`ModelError`'s, else
    WORKER_ERROR) and propagates.
    """

    step: message_pb2.Step
    resolved: message_pb2.ResolvedVersions
    #: Steers delivered at this model call, oldest first: :meth:`request` appends them.
    steers: Sequence[message_pb2.Input]
    existing: bool
    model: ModelAdapter | None
    #: Each tool's description, from the bound definition (BeginStep hands out schemas).
    tool_descriptions: Mapping[str, str] = field(default_factory=dict)
    response: ModelResponse | None = None

    @property
    def model_id(self) -> str:
        return self.resolved.model.model_id

    @property
    def candidate(self) -> str:
        return self.resolved.model.candidate_name

    @property
    def system_prompt(self) -> str:
        """The system prompt text with the handed-out skills' instructions appended."""
        parts = [self.resolved.system_prompt_text]
        parts += [f"## Skill: {s.name}\n{s.instructions}" for s in self.resolved.skills]
        return "\n\n".join(p for p in parts if p)

    @property
    def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                t.name,
                self.tool_descriptions.get(t.name, ""),
                struct_to_json(t.input_schema),
            )
            for t in self.resolved.tools
        ]

    def request(self, messages: Sequence[Mapping[str, Any]]) -> ModelRequest:
        """The model request: ``messages``, then the steers delivered at this call (an
        operator's ``agentrt send --steer`` reaches the model here)."""
        model = self.resolved.model
        steered = [{"role": "user", "content": s.content} for s in self.steers]
        return ModelRequest(
            provider=model.provider,
            model_id=model.model_id,
            parameters=struct_to_json(model.parameters),
            system_prompt=self.system_prompt,
            messages=[*messages, *steered],
            tools=self.tools,
        )

    async def complete(self, messages: Sequence[Mapping[str, Any]]) -> ModelResponse:
        """Call the worker's model adapter with the resolved model and keep the response."""
        if self.model is None:
            raise RuntimeError("this worker has no model adapter: pass model= to Worker")
        self.response = await self.model.complete(self.request(messages))
        return self.response


@dataclass
class ToolCallStep:
    """A TOOL_CALL step in progress (``async with attempt.tool_call(...) as call``).

    Set :attr:`output` inside the block; on leaving it the output is stored as a blob and the
    step ends SUCCEEDED. An exception ends it FAILED (TOOL_ERROR) and propagates."""

    step: message_pb2.Step
    tool: message_pb2.ResolvedTool
    arguments: Mapping[str, Any]
    output: Any = None
    #: The call was decided before the block: denied, or reused from an earlier attempt.
    done: bool = False
    denied: bool = False
    reused: bool = False
