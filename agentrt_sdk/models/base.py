"""The one interface between a worker's agent logic and a model provider.

A worker step resolves *which* model to call (``BeginStep`` answers a ``ResolvedModel``: provider,
model id, parameters); an adapter makes the call. Everything an adapter needs travels in a
:class:`ModelRequest`, everything the ledger records comes back in a :class:`ModelResponse`, and
every failure the model policy can act on is a :class:`ModelError` carrying the
``agentrt.runtime.v1.ErrorClass`` the step is ended with. A :class:`ModelAdapter` is any object
with ``async def complete(request) -> ModelResponse``.

What an adapter does not do: retry or fall back. Both are the run's model policy's decision (a
candidate's ``fallback_on`` names error classes), taken by the worker SDK from the error class an
adapter reports, so an adapter reports each failure once, as it happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentrt.runtime.v1 import enum_pb2


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: the pinned tool version's name, description and JSON schema."""

    name: str
    description: str
    #: The JSON schema (an object schema) the call's arguments must satisfy.
    input_schema: Mapping[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """One chat completion to make.

    Attributes:
        provider: ``ResolvedModel.provider`` from ``BeginStep`` (picks the adapter).
        model_id: ``ResolvedModel.model_id``: the model the request names.
        parameters: ``ResolvedModel.parameters`` (temperature, max_tokens ...), passed to the
            provider as they are; each adapter documents what it does with them.
        system_prompt: The system prompt, assembled by the caller (the agent's system prompt
            text, then its skills' instructions). Empty: no system message.
        messages: The conversation in OpenAI chat format
            (``{"role": "user" | "assistant" | "tool", "content": ..., ...}``), without the
            system prompt.
        tools: The tools the model may call; empty: none.
    """

    provider: str
    model_id: str
    parameters: Mapping[str, Any]
    system_prompt: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[ToolSpec] = ()


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for.

    Attributes:
        id: The provider's id for the call; a ``tool`` message answering it names this id.
        name: The tool's name.
        arguments: The call's arguments, a JSON object parsed (never validated against the
            schema: that is the runtime's job when the tool call is recorded).
    """

    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ModelResponse:
    """What the provider answered.

    Attributes:
        model_id: The model id the provider reported (recorded as the step's
            ``reported_model_id``), which may differ from the one requested (an alias resolved
            to a dated version).
        content: The assistant message's text; empty when the model only called tools.
        tool_calls: The tool calls the model asked for, in the provider's order.
        input_tokens: Prompt tokens as the provider counted them.
        output_tokens: Completion tokens as the provider counted them.
        finish_reason: Why the model stopped, as the provider said it (``stop``,
            ``tool_calls``, ``length`` ...).
    """

    model_id: str
    content: str
    tool_calls: Sequence[ToolCall]
    input_tokens: int
    output_tokens: int
    finish_reason: str


class ModelError(Exception):
    """A model call failed in a way the run's model policy can act on.

    Attributes:
        error_class: The ``agentrt.runtime.v1.ErrorClass`` value the step is ended with
            (``enum_pb2.ERROR_CLASS_RATE_LIMITED`` ...); a model policy's ``fallback_on`` names
            these classes.
        retryable: Whether the same request to the same model may succeed later (a rate limit
            or a timeout may; a content filter or an exhausted quota will not).
        retry_after: Seconds the provider asked the caller to wait before retrying, if it said.
        message: What went wrong, for people.
    """

    def __init__(
        self,
        error_class: enum_pb2.ErrorClass.ValueType,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.retryable = retryable
        self.retry_after = retry_after
        self.message = message

    @property
    def error_class_name(self) -> str:
        """The error class's proto name (``ERROR_CLASS_RATE_LIMITED``), for logs and messages."""
        return enum_pb2.ErrorClass.Name(self.error_class)

    def __repr__(self) -> str:
        return (
            f"ModelError({self.error_class_name}, {self.message!r}, retryable={self.retryable}, "
            f"retry_after={self.retry_after})"
        )


class ModelAdapter(Protocol):
    """Anything that turns a :class:`ModelRequest` into a :class:`ModelResponse`.

    ``complete`` raises :class:`ModelError` for every failure it can classify; anything else it
    raises is a bug in the worker (recorded as ``ERROR_CLASS_WORKER_ERROR``).
    """

    async def complete(self, request: ModelRequest) -> ModelResponse: ...
