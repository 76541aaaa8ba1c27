"""The scripted model plays its script deterministically; the provider router picks adapters."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk.models import (
    Fail,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProviderRouter,
    Reply,
    ScriptedModel,
    ScriptExhaustedError,
    ToolCall,
    ToolSpec,
    count_tokens,
)


def request(model_id: str = "claude-sonnet-4", **changes: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "provider": "anthropic",
        "model_id": model_id,
        "parameters": {},
        "system_prompt": "Be careful.",
        "messages": [{"role": "user", "content": "login returns 500"}],
    }
    fields.update(changes)
    return ModelRequest(**fields)


def play(model: Any, *requests: ModelRequest) -> list[ModelResponse | ModelError]:
    async def calls() -> list[ModelResponse | ModelError]:
        out: list[ModelResponse | ModelError] = []
        for each in requests:
            try:
                out.append(await model.complete(each))
            except ModelError as error:
                out.append(error)
        return out

    return asyncio.run(calls())


def test_rate_limited_once_then_an_answer():
    model = ScriptedModel(
        [Fail(enum_pb2.ERROR_CLASS_RATE_LIMITED, retry_after=2.0), Reply("Fixed the handler.")]
    )
    first, second = play(model, request(), request("gpt-4.1"))

    assert isinstance(first, ModelError)
    assert (first.error_class, first.retryable, first.retry_after) == (
        enum_pb2.ERROR_CLASS_RATE_LIMITED,
        True,
        2.0,
    )
    assert first.message == "scripted ERROR_CLASS_RATE_LIMITED"
    assert second == ModelResponse(
        model_id="gpt-4.1",
        content="Fixed the handler.",
        tool_calls=(),
        # "Be careful." + "login returns 500": 2 + 3 words; "Fixed the handler.": 3.
        input_tokens=5,
        output_tokens=3,
        finish_reason="stop",
    )
    assert [each.model_id for each in model.requests] == ["claude-sonnet-4", "gpt-4.1"]


def test_token_counts_cover_the_whole_request_and_tool_calls_and_repeat_exactly():
    call = ToolCall(id="c1", name="read_file", arguments={"path": "app/login.py"})
    spec = ToolSpec("read_file", "Read a file.", {"type": "object"})
    conversation = request(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "see the log"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "grep", "arguments": '{"q": "500"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c0", "content": "login.py:12 raise"},
        ],
        tools=(spec,),
    )
    script = [Reply(tool_calls=[call]), Reply(tool_calls=[call])]
    first = play(ScriptedModel(script), conversation)[0]
    again = play(ScriptedModel(script), conversation)[0]

    assert first == again
    assert isinstance(first, ModelResponse)
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == (call,)
    function_json = '{"arguments": "{\\"q\\": \\"500\\"}", "name": "grep"}'
    expected_input = sum(
        count_tokens(text)
        for text in (
            "Be careful.",
            "see the log",
            function_json,
            "login.py:12 raise",
            "read_file",
            "Read a file.",
            '{"type": "object"}',
        )
    )
    assert first.input_tokens == expected_input
    assert first.output_tokens == count_tokens('read_file {"path": "app/login.py"}') == 3


def test_a_reply_may_fix_what_is_reported():
    model = ScriptedModel(
        [
            Reply(
                "cut",
                model_id="gpt-4.1-2025-04-14",
                input_tokens=1000,
                output_tokens=8192,
                finish_reason="length",
            )
        ]
    )
    [response] = play(model, request("gpt-4.1"))
    assert response == ModelResponse("gpt-4.1-2025-04-14", "cut", (), 1000, 8192, "length")


def test_a_script_may_be_a_function_of_the_request_and_the_call_index():
    def by_model(req: ModelRequest, index: int) -> Reply | Fail:
        if req.model_id == "claude-sonnet-4":
            return Fail(enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT, "slow")
        return Reply(f"answer {index}")

    timeout, answer = play(ScriptedModel(by_model), request(), request("gpt-4.1"))
    assert isinstance(timeout, ModelError)
    assert (timeout.error_class, timeout.message, timeout.retryable) == (
        enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT,
        "slow",
        True,
    )
    assert isinstance(answer, ModelResponse) and answer.content == "answer 1"


@pytest.mark.parametrize(
    ("error_class", "retryable"),
    [
        (enum_pb2.ERROR_CLASS_PROVIDER_ERROR, True),
        (enum_pb2.ERROR_CLASS_INVALID_OUTPUT, True),
        (enum_pb2.ERROR_CLASS_CONTENT_FILTERED, False),
        (enum_pb2.ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, False),
    ],
)
def test_a_failures_retryable_defaults_by_class_and_can_be_set(error_class, retryable):
    assert Fail(error_class).error().retryable is retryable
    assert Fail(error_class, retryable=not retryable).error().retryable is (not retryable)


def test_each_played_failure_is_a_new_exception():
    step = Fail(enum_pb2.ERROR_CLASS_RATE_LIMITED)
    first, second = play(ScriptedModel([step, step]), request(), request())
    assert first is not second


def test_a_call_past_the_end_of_the_script_says_so():
    model = ScriptedModel([Reply("one")])
    play(model, request())
    with pytest.raises(ScriptExhaustedError, match=r"call 2 to 'gpt-4\.1'.*1 step"):
        play(model, request("gpt-4.1"))


def test_the_router_sends_each_provider_to_its_adapter():
    anthropic = ScriptedModel([Fail(enum_pb2.ERROR_CLASS_RATE_LIMITED)])
    openai = ScriptedModel([Reply("from openai")])
    router = ProviderRouter({"anthropic": anthropic, "openai": openai})

    limited, answer = play(router, request(), request("gpt-4.1", provider="openai"))
    assert isinstance(limited, ModelError)
    assert limited.error_class == enum_pb2.ERROR_CLASS_RATE_LIMITED
    assert isinstance(answer, ModelResponse) and answer.content == "from openai"
    assert (len(anthropic.requests), len(openai.requests)) == (1, 1)


def test_the_router_refuses_a_provider_it_has_no_adapter_for_unless_there_is_a_default():
    [refused] = play(ProviderRouter({"openai": ScriptedModel([])}), request())
    assert isinstance(refused, ModelError)
    assert (refused.error_class, refused.retryable) == (enum_pb2.ERROR_CLASS_WORKER_ERROR, False)
    assert "'anthropic'" in refused.message and "openai" in refused.message

    default = ScriptedModel([Reply("default")])
    [answer] = play(ProviderRouter({}, default=default), request())
    assert isinstance(answer, ModelResponse) and answer.content == "default"


def test_a_model_error_names_its_class():
    error = ModelError(
        enum_pb2.ERROR_CLASS_RATE_LIMITED, "slow down", retryable=True, retry_after=1.5
    )
    assert error.error_class_name == "ERROR_CLASS_RATE_LIMITED"
    assert str(error) == "slow down"
    assert "ERROR_CLASS_RATE_LIMITED" in repr(error) and "1.5" in repr(error)


def test_the_package_exports_exactly_its_public_names():
    import agentrt_sdk.models as models

    public = {
        name
        for name, value in vars(models).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith(models.__name__)
    }
    # Imported on first use (the openai package is slow to import), so not yet in vars().
    lazy = {"OpenAICompatibleModel"}
    assert set(models.__all__) == public | lazy
    for name in lazy:
        assert getattr(models, name).__module__.startswith(models.__name__)
