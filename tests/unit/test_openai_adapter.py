"""The OpenAI-compatible adapter against a loopback OpenAI-compatible server: real HTTP, the real
``openai`` client. What the server received and what the adapter reported are both checked."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk.models import ModelError, ModelRequest, OpenAICompatibleModel, ToolCall, ToolSpec
from tests.openai_server import Answer, OpenAIServer, completion, error, tool_call

READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file of the workspace.",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)


def request(**changes: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "provider": "openai",
        "model_id": "gpt-4.1",
        "parameters": {"temperature": 0.2, "max_tokens": 8192.0},
        "system_prompt": "You are a careful coding agent.",
        "messages": [{"role": "user", "content": "login returns 500"}],
        "tools": (READ_FILE,),
    }
    fields.update(changes)
    return ModelRequest(**fields)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


def complete(server: OpenAIServer, model_request: ModelRequest, **options: Any) -> Any:
    async def call() -> Any:
        async with OpenAICompatibleModel(
            base_url=server.base_url, api_key="sk-test", **options
        ) as adapter:
            return await adapter.complete(model_request)

    return asyncio.run(call())


def failure(server: OpenAIServer, model_request: ModelRequest, **options: Any) -> ModelError:
    with pytest.raises(ModelError) as raised:
        complete(server, model_request, **options)
    return raised.value


def test_a_completion_sends_the_request_and_reports_the_providers_answer(server):
    server.queue(
        Answer(
            body=completion(
                "Reading the handler first.",
                model="gpt-4.1-2025-04-14",
                tool_calls=[tool_call("call_1", "read_file", {"path": "app/login.py"})],
                prompt_tokens=321,
                completion_tokens=45,
            )
        )
    )
    response = complete(server, request())

    assert response.model_id == "gpt-4.1-2025-04-14"
    assert response.content == "Reading the handler first."
    assert response.tool_calls == [
        ToolCall(id="call_1", name="read_file", arguments={"path": "app/login.py"})
    ]
    assert (response.input_tokens, response.output_tokens) == (321, 45)
    assert response.finish_reason == "tool_calls"

    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "gpt-4.1"
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "login returns 500"},
    ]
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the workspace.",
                "parameters": dict(READ_FILE.input_schema),
            },
        }
    ]
    # Parameters travel as they are, a Struct's whole-number double as an integer.
    assert sent.body["temperature"] == 0.2
    assert sent.body["max_tokens"] == 8192 and isinstance(sent.body["max_tokens"], int)
    assert "stream" not in sent.body and "n" not in sent.body


def test_a_conversation_with_tool_results_is_sent_as_given_and_no_tools_means_no_tools_key(
    server,
):
    messages = [
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("call_1", "read_file", {"path": "a.py"})],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "def login(): ..."},
    ]
    server.queue(Answer(body=completion("Patched.", model="deepseek-chat")))
    response = complete(
        server,
        request(
            system_prompt="", messages=messages, tools=(), parameters={"vendor": {"top_k": 4.0}}
        ),
    )

    assert (response.content, response.tool_calls, response.finish_reason) == (
        "Patched.",
        [],
        "stop",
    )
    [sent] = server.requests
    assert sent.body["messages"] == messages
    assert "tools" not in sent.body
    assert sent.body["vendor"] == {"top_k": 4}


def test_the_key_and_endpoint_come_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.queue(Answer(body=completion("hi")))

    async def call() -> Any:
        async with OpenAICompatibleModel() as adapter:
            assert adapter.base_url.rstrip("/") == server.base_url
            return await adapter.complete(request())

    assert asyncio.run(call()).content == "hi"
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


def test_a_429_is_rate_limited_with_retry_after_and_sent_exactly_once(server):
    server.queue(error(429, "rate_limit_exceeded", "slow down", headers={"Retry-After": "7"}))
    raised = failure(server, request())

    assert raised.error_class == enum_pb2.ERROR_CLASS_RATE_LIMITED
    assert raised.retryable is True
    assert raised.retry_after == 7.0
    assert "slow down" in raised.message
    # The client's own retries are off: the policy, not the library, decides what happens next.
    assert server.count() == 1


def test_retry_after_ms_wins_over_retry_after(server):
    server.queue(
        error(429, "rate_limit_exceeded", headers={"retry-after-ms": "1500", "Retry-After": "9"})
    )
    assert failure(server, request()).retry_after == 1.5


def test_retry_after_as_an_http_date_in_the_past_means_now(server):
    server.queue(
        error(429, "rate_limit_exceeded", headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    )
    assert failure(server, request()).retry_after == 0.0


def test_an_unreadable_retry_after_is_left_out(server):
    server.queue(error(429, "rate_limit_exceeded", headers={"Retry-After": "soon"}))
    assert failure(server, request()).retry_after is None


def test_an_exhausted_quota_is_rate_limited_but_not_worth_retrying(server):
    server.queue(error(429, "insufficient_quota", "You exceeded your current quota"))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable, raised.retry_after) == (
        enum_pb2.ERROR_CLASS_RATE_LIMITED,
        False,
        None,
    )
    assert server.count() == 1


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_server_error_is_a_retryable_provider_error_sent_once(server, status):
    server.queue(error(status, None, "upstream broke", error_type="server_error"))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_PROVIDER_ERROR, True)
    assert server.count() == 1


@pytest.mark.parametrize("code", ["content_filter", "content_policy_violation"])
def test_a_400_content_filter_is_content_filtered(server, code):
    server.queue(error(400, code, "The prompt was filtered"))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_CONTENT_FILTERED, False)


def test_a_finish_reason_content_filter_is_content_filtered(server):
    server.queue(Answer(body=completion("partial", finish_reason="content_filter")))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_CONTENT_FILTERED, False)


def test_a_context_length_400_is_context_length_exceeded(server):
    server.queue(error(400, "context_length_exceeded", "maximum context length is 128000"))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (
        enum_pb2.ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED,
        False,
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "invalid_request_error"), (401, "invalid_api_key"), (404, "model_not_found")],
)
def test_other_client_errors_are_provider_errors_not_worth_retrying(server, status, code):
    server.queue(error(status, code))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_PROVIDER_ERROR, False)
    assert f"HTTP {status}" in raised.message


def test_no_answer_in_time_is_a_provider_timeout(server):
    server.queue(Answer(hang=True))
    raised = failure(server, request(), timeout=0.5)
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT, True)
    assert server.count() == 1


def test_no_server_is_a_retryable_provider_error():
    # A bound socket that does not listen: connections are refused, and no other process can
    # take the port meanwhile.
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{bound.getsockname()[1]}/v1"

        async def call() -> None:
            async with OpenAICompatibleModel(base_url=base_url, api_key="sk-test") as adapter:
                await adapter.complete(request())

        with pytest.raises(ModelError) as raised:
            asyncio.run(call())
    assert (raised.value.error_class, raised.value.retryable) == (
        enum_pb2.ERROR_CLASS_PROVIDER_ERROR,
        True,
    )


@pytest.mark.parametrize(
    "arguments", ['{"path": "a.py"', "[1, 2]", '"a.py"'], ids=["truncated", "array", "string"]
)
def test_tool_call_arguments_that_are_not_a_json_object_are_invalid_output(server, arguments):
    server.queue(
        Answer(body=completion(None, tool_calls=[tool_call("c1", "read_file", arguments)]))
    )
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_INVALID_OUTPUT, True)
    assert "c1" in raised.message and "read_file" in raised.message


@pytest.mark.parametrize(
    "body",
    [b"not json", {}, [1], {"choices": []}, {"model": "m", "choices": [{"index": 0}]}],
    ids=["text", "empty-object", "array", "no-choices", "no-message"],
)
def test_a_body_that_is_not_a_completion_is_a_provider_error(server, body):
    server.queue(Answer(body=body))
    raised = failure(server, request())
    assert (raised.error_class, raised.retryable) == (enum_pb2.ERROR_CLASS_PROVIDER_ERROR, False)


def test_usage_left_out_counts_zero_and_the_reported_model_is_kept(server):
    body = completion("ok", model="deepseek-chat-v3")
    del body["usage"]
    server.queue(Answer(body=body))
    response = complete(server, request(model_id="deepseek-chat"))
    assert (response.model_id, response.input_tokens, response.output_tokens) == (
        "deepseek-chat-v3",
        0,
        0,
    )


@pytest.mark.parametrize("key", ["model", "messages", "tools", "stream", "n"])
def test_parameters_may_not_override_what_the_adapter_sets(server, key):
    with pytest.raises(ValueError, match=key):
        complete(server, request(parameters={key: True}))
    assert server.count() == 0
