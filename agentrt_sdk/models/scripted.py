"""A deterministic model for tests and the demo: it answers from a script.

A script is either a sequence of steps, played one per call (the n-th call gets the n-th step;
a call past the end raises :class:`ScriptExhaustedError`), or a function of the request and the
call's index (from 0) that returns a step. A step is a :class:`Reply` (what the model says) or a
:class:`Fail` (the :class:`~agentrt_sdk.models.base.ModelError` to raise), so "rate limited once,
then an answer" is::

    ScriptedModel([Fail(enum_pb2.ERROR_CLASS_RATE_LIMITED, retry_after=1.0), Reply("done")])

Everything reported is a function of the request and the script: the model id is the requested
one unless the reply names another, and token counts (unless the reply gives them) are
:func:`count_tokens` of the text sent and the text answered, so two runs record the same usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk.models.base import ModelError, ModelRequest, ModelResponse, ToolCall


@dataclass(frozen=True)
class Reply:
    """A scripted answer.

    Attributes:
        content: The assistant text.
        tool_calls: Tool calls to make.
        finish_reason: Default ``tool_calls`` when there are tool calls, else ``stop``.
        model_id: The model id to report; default the requested one.
        input_tokens: Default :func:`count_tokens` of the request's text.
        output_tokens: Default :func:`count_tokens` of the reply's text.
    """

    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    finish_reason: str | None = None
    model_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class Fail:
    """A scripted failure: the call raises a fresh ``ModelError`` with these fields.

    ``retryable`` defaults to what a provider's failure of that class usually is: a rate limit,
    a timeout, a provider error and invalid output may pass; the other classes will not.
    """

    error_class: enum_pb2.ErrorClass.ValueType
    message: str = ""
    retryable: bool | None = None
    retry_after: float | None = None

    def error(self) -> ModelError:
        """The ``ModelError`` this step raises (a new one each time it is played)."""
        retryable = self.retryable
        if retryable is None:
            retryable = self.error_class in _TRANSIENT
        name = enum_pb2.ErrorClass.Name(self.error_class)
        return ModelError(
            self.error_class,
            self.message or f"scripted {name}",
            retryable=retryable,
            retry_after=self.retry_after,
        )


_TRANSIENT = frozenset(
    {
        enum_pb2.ERROR_CLASS_RATE_LIMITED,
        enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT,
        enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
        enum_pb2.ERROR_CLASS_INVALID_OUTPUT,
    }
)

Step = Reply | Fail
Script = Sequence[Step] | Callable[[ModelRequest, int], Step]


class ScriptExhaustedError(RuntimeError):
    """The model was called more times than its script has steps: the test's script is short."""


class ScriptedModel:
    """A :class:`~agentrt_sdk.models.base.ModelAdapter` that plays a script.

    Args:
        script: The steps, or a function ``(request, call_index) -> step``.

    Attributes:
        requests: Every request received, in order (what a test asserts on).
    """

    def __init__(self, script: Script) -> None:
        self._script = script
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Play the next step of the script for ``request``.

        Raises:
            ModelError: The step is a :class:`Fail`.
            ScriptExhaustedError: The script has no step for this call.
        """
        index = len(self.requests)
        self.requests.append(request)
        if callable(self._script):
            step = self._script(request, index)
        elif index < len(self._script):
            step = self._script[index]
        else:
            raise ScriptExhaustedError(
                f"call {index + 1} to {request.model_id!r}, but the script has "
                f"{len(self._script)} step(s)"
            )
        if isinstance(step, Fail):
            raise step.error()
        return ModelResponse(
            model_id=step.model_id if step.model_id is not None else request.model_id,
            content=step.content,
            tool_calls=tuple(step.tool_calls),
            input_tokens=(
                step.input_tokens if step.input_tokens is not None else _request_tokens(request)
            ),
            output_tokens=(
                step.output_tokens if step.output_tokens is not None else _reply_tokens(step)
            ),
            finish_reason=step.finish_reason or ("tool_calls" if step.tool_calls else "stop"),
        )


def count_tokens(text: str) -> int:
    """The scripted model's token count: whitespace-separated words. Deterministic and easy to
    work out by hand, which is all a test needs; no real tokenizer counts this way."""
    return len(text.split())


def _request_tokens(request: ModelRequest) -> int:
    texts = [request.system_prompt]
    for message in request.messages:
        texts.extend(_message_texts(message))
    for tool in request.tools:
        texts.extend((tool.name, tool.description, _json(tool.input_schema)))
    return sum(count_tokens(text) for text in texts)


def _message_texts(message: Mapping[str, object]) -> Iterable[str]:
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        # Content parts: only text parts carry words.
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield str(part["text"])
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, Mapping):
            yield _json(call.get("function"))


def _reply_tokens(reply: Reply) -> int:
    texts = [reply.content]
    for call in reply.tool_calls:
        texts.extend((call.name, _json(call.arguments)))
    return sum(count_tokens(text) for text in texts)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)
