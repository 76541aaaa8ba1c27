"""A model adapter for any OpenAI-compatible chat-completions endpoint, on the ``openai`` package.

Configuration (constructor arguments win over the environment)::

    OPENAI_BASE_URL   the endpoint, e.g. https://api.deepseek.com/v1 (default: OpenAI's)
    OPENAI_API_KEY    the key the endpoint expects

DeepSeek, for instance: ``OPENAI_BASE_URL=https://api.deepseek.com``,
``OPENAI_API_KEY=<your DeepSeek key>``, and a model policy candidate with
``model_id: deepseek-v4-flash`` (its ``parameters`` may carry DeepSeek's own
``thinking: {type: enabled}``: they are sent as they are). A local server (vLLM, Ollama,
llama.cpp) works the same way with its ``.../v1`` URL and any key it accepts.

The request: the system prompt as a ``system`` message, then ``ModelRequest.messages`` as they
are; the tools as ``function`` tools; ``ModelRequest.parameters`` merged into the request body
unchanged (whatever the endpoint accepts: ``temperature``, ``max_tokens``, a vendor's own
extensions), except that a whole-number float is sent as an integer (the number rule of
:mod:`agentrt_core.proto_json`), because ``google.protobuf.Struct``
(``ResolvedModel.parameters``) carries every number as a double and endpoints refuse
``"max_tokens": 8192.0``. Nothing is dropped: a parameter the endpoint refuses
comes back as its 400, reported as ``ERROR_CLASS_PROVIDER_ERROR``, which says more than a
silently different request would. The keys the adapter owns (``model``, ``messages``, ``tools``,
``stream``, ``n``) are refused with a ``ValueError``: the adapter reads one whole choice.

The client's own retries are off (``max_retries=0``): a 429 is reported, not hidden, because
retries and fallback belong to the run's model policy. Failures map to error classes:

=====================================================  ===============================  =========
what happened                                          error class                      retryable
=====================================================  ===============================  =========
429 (``retry_after`` from ``Retry-After``)             RATE_LIMITED                     yes
429 with code ``insufficient_quota``                   RATE_LIMITED                     no
request timed out, or a 408                            PROVIDER_TIMEOUT                 yes
no connection, a 409, a 5xx                            PROVIDER_ERROR                   yes
400 with code ``context_length_exceeded``              CONTEXT_LENGTH_EXCEEDED          no
400 with code ``content_filter`` or
``content_policy_violation``; finish ``content_filter``  CONTENT_FILTERED                 no
any other 4xx, a body that is not a completion         PROVIDER_ERROR                   no
tool-call arguments that are not a JSON object         INVALID_OUTPUT                   yes
=====================================================  ===============================  =========
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any, cast

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from agentrt.runtime.v1 import enum_pb2
from agentrt_core.proto_json import json_numbers
from agentrt_sdk.models.base import ModelError, ModelRequest, ModelResponse, ToolCall

#: Request keys the adapter sets itself; a model policy's parameters may not override them.
RESERVED_PARAMETERS = frozenset({"model", "messages", "tools", "stream", "n"})

_CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})


class OpenAICompatibleModel:
    """A :class:`~agentrt_sdk.models.base.ModelAdapter` for OpenAI-compatible chat completions.

    Args:
        base_url: The endpoint's base URL (``.../v1``); default ``OPENAI_BASE_URL``, then
            OpenAI's.
        api_key: The key; default ``OPENAI_API_KEY``. The ``openai`` client refuses to start
            without one (a local server that ignores keys takes any string).
        timeout: Seconds a request may take before it fails as ``PROVIDER_TIMEOUT``; default
            the ``openai`` client's.
        default_headers: Headers sent with every request (an organisation, a gateway's key).

    The adapter holds a connection pool: close it with :meth:`aclose` (or ``async with``).
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        # Left out, the openai client's own default timeout applies.
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        self._client = openai.AsyncOpenAI(
            # The openai client reads the same variables; reading them here as well makes the
            # documented precedence (argument, then environment) this module's, not a version's.
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or None,
            max_retries=0,
            default_headers=default_headers,
            **options,
        )

    @property
    def base_url(self) -> str:
        """The endpoint requests go to."""
        return str(self._client.base_url)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.close()

    async def __aenter__(self) -> OpenAICompatibleModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Make one chat completion; see the module docstring for what is sent and raised.

        Raises:
            ModelError: The call failed; ``error_class`` says how.
            ValueError: ``request.parameters`` names a key the adapter sets itself.
        """
        reserved = sorted(RESERVED_PARAMETERS.intersection(request.parameters))
        if reserved:
            raise ValueError(
                f"model parameters may not set {', '.join(reserved)}: the adapter sets them"
            )
        messages: list[dict[str, Any]] = []
        if request.system_prompt:
            messages.append({"role": "system", "content": request.system_prompt})
        messages.extend(dict(message) for message in request.messages)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(tool.input_schema),
                },
            }
            for tool in request.tools
        ]
        try:
            completion = await self._client.chat.completions.create(
                model=request.model_id,
                # The caller's messages are OpenAI chat format by contract; the client's
                # TypedDicts describe the same JSON.
                messages=cast(list[ChatCompletionMessageParam], messages),
                tools=cast(list[ChatCompletionToolUnionParam], tools) if tools else openai.omit,
                extra_body=json_numbers(dict(request.parameters)),
            )
        except openai.OpenAIError as error:
            raise _classify(error) from error
        except json.JSONDecodeError as error:
            # The client parses a JSON-typed body without wrapping a decoding failure.
            raise ModelError(
                enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
                f"the provider's answer is not JSON: {error}",
                retryable=False,
            ) from error
        return _response(completion)


def _response(completion: object) -> ModelResponse:
    # The openai client builds its models from the body without validating them (so a
    # compatible server's own finish reasons get through), hence a body of another shape
    # arrives here as a str, a list or a model with fields missing: check what is read.
    choices = (
        getattr(completion, "choices", None) if isinstance(completion, ChatCompletion) else None
    )
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = getattr(choice, "message", None)
    if not isinstance(completion, ChatCompletion) or not isinstance(message, ChatCompletionMessage):
        raise ModelError(
            enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
            f"the provider's answer is not a chat completion with a message: {completion!r:.200}",
            retryable=False,
        )
    finish_reason = getattr(choice, "finish_reason", None) or ""
    if finish_reason == "content_filter":
        raise ModelError(
            enum_pb2.ERROR_CLASS_CONTENT_FILTERED,
            "the provider's content filter withheld the output (finish_reason content_filter)",
            retryable=False,
        )
    # An endpoint that reports no usage is counted as zero rather than refused: the answer is
    # still good, and the step records what the provider said.
    usage = getattr(completion, "usage", None)
    return ModelResponse(
        model_id=getattr(completion, "model", None) or "",
        content=message.content or "",
        tool_calls=[_tool_call(call) for call in message.tool_calls or ()],
        input_tokens=getattr(usage, "prompt_tokens", None) or 0,
        output_tokens=getattr(usage, "completion_tokens", None) or 0,
        finish_reason=finish_reason,
    )


def _tool_call(call: object) -> ToolCall:
    # Only function tools are offered, so a custom-tool call is output the worker cannot use.
    function = getattr(call, "function", None)
    call_id, name = getattr(call, "id", None), getattr(function, "name", None)
    text = getattr(function, "arguments", None)
    if not isinstance(call, ChatCompletionMessageFunctionToolCall) or not (
        isinstance(call_id, str) and isinstance(name, str) and isinstance(text, str)
    ):
        raise _invalid_output(f"a tool call that is not a function call with an id: {call!r:.200}")
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as error:
        raise _invalid_output(
            f"tool call {call_id} ({name}): arguments are not JSON: {error}"
        ) from error
    if not isinstance(arguments, dict):
        raise _invalid_output(
            f"tool call {call_id} ({name}): arguments are a JSON {type(arguments).__name__}, "
            "not an object"
        )
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _invalid_output(message: str) -> ModelError:
    # Sampling again may well produce a usable call, hence retryable.
    return ModelError(enum_pb2.ERROR_CLASS_INVALID_OUTPUT, message, retryable=True)


def _classify(error: openai.OpenAIError) -> ModelError:
    """The error class of a failed request (the table in the module docstring)."""
    # APITimeoutError is an APIConnectionError: test it first.
    if isinstance(error, openai.APITimeoutError):
        return ModelError(
            enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT,
            "the provider did not answer in time",
            retryable=True,
        )
    if isinstance(error, openai.APIConnectionError):
        return ModelError(
            enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
            f"could not reach the provider: {error.__cause__ or error}",
            retryable=True,
        )
    if not isinstance(error, openai.APIStatusError):
        return ModelError(enum_pb2.ERROR_CLASS_PROVIDER_ERROR, str(error), retryable=False)
    status, code = error.status_code, error.code
    message = f"HTTP {status}" + (f" ({code})" if code else "") + f": {error.message}"
    retry_after = _retry_after(error.response.headers)
    if status == 429:
        # An exhausted quota is a 429 too, but waiting does not end it; another candidate may.
        return ModelError(
            enum_pb2.ERROR_CLASS_RATE_LIMITED,
            message,
            retryable=code != "insufficient_quota",
            retry_after=retry_after,
        )
    if status == 408:
        return ModelError(enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT, message, retryable=True)
    if code == "context_length_exceeded":
        return ModelError(enum_pb2.ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, message, retryable=False)
    if code in _CONTENT_FILTER_CODES:
        return ModelError(enum_pb2.ERROR_CLASS_CONTENT_FILTERED, message, retryable=False)
    # A conflict or a server fault may pass; any other 4xx is the same answer next time.
    return ModelError(
        enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
        message,
        retryable=status == 409 or status >= 500,
        retry_after=retry_after,
    )


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI's), then ``Retry-After`` (RFC 9110:
    seconds or an HTTP date); None when neither says."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    value = headers.get("retry-after")
    if value is not None:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            # An HTTP date is in GMT; "-0000" parses as naive, which timestamp() reads as local.
            when = when.replace(tzinfo=datetime.UTC)
        return max(0.0, when.timestamp() - time.time())
    return None
