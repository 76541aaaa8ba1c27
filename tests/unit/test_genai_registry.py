"""The GenAI conventions checker (tests/genai_registry.py) can fail: each kind of problem it
exists to find is reported, naming the attribute or metric, and well-formed telemetry passes.
Its input is the vendored YAML in third_party/otel-semconv-genai/, read as it is upstream."""

from __future__ import annotations

import pytest

from tests import genai_registry as registry

GOOD_CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4",
    "gen_ai.request.temperature": 0.2,
    "gen_ai.request.stream": False,
    "gen_ai.request.stop_sequences": ("forest", "lived"),
    "gen_ai.response.finish_reasons": ["stop"],
    "gen_ai.usage.input_tokens": 100,
    "gen_ai.usage.output_tokens": 180,
    "gen_ai.tool.call.arguments": '{"location": "Paris"}',
    "server.port": "not gen_ai, so not looked at",
}


def test_the_vendored_files_load_and_hold_what_the_checks_rely_on() -> None:
    assert registry.REGISTRY_RELEASE
    assert len(registry.attribute_names()) > 50
    assert {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "gen_ai.invoke_agent.duration",
        "gen_ai.execute_tool.duration",
    } <= set(registry.metric_names())
    assert {"gen_ai.inference.client", "gen_ai.invoke_agent.internal"} <= set(registry.span_types())


def test_well_formed_attributes_pass() -> None:
    assert registry.attribute_problems(GOOD_CHAT) == []
    assert registry.attribute_problems(GOOD_CHAT, closed_enums=True) == []


def test_a_misspelled_name_is_undefined() -> None:
    (problem,) = registry.attribute_problems({"gen_ai.request.modle": "gpt-4"})
    assert problem.startswith("gen_ai.request.modle: not defined")


@pytest.mark.parametrize(
    ("name", "value", "declared"),
    [
        ("gen_ai.usage.input_tokens", "100", "int"),
        ("gen_ai.usage.input_tokens", True, "int"),  # bool is an int in Python, not on the wire
        ("gen_ai.request.temperature", 1, "double"),  # would be sent as an OTLP int_value
        ("gen_ai.request.model", 4, "string"),
        ("gen_ai.request.stream", 1, "boolean"),
        ("gen_ai.request.stop_sequences", "stop", "string[]"),
        ("gen_ai.request.stop_sequences", ("stop", 1), "string[]"),
        ("gen_ai.provider.name", 7, "string"),  # an enum's members are strings
    ],
)
def test_a_value_of_the_wrong_type_is_reported(name: str, value: object, declared: str) -> None:
    (problem,) = registry.attribute_problems({name: value})
    assert problem.startswith(f"{name}: declared {declared}, got {type(value).__name__}")


def test_a_deprecated_name_is_reported_with_its_replacement() -> None:
    problems = registry.attribute_problems({"gen_ai.system": "openai", "gen_ai.prompt": "hi"})
    assert problems == [
        "gen_ai.prompt: deprecated (Removed, no replacement at this time.)",
        "gen_ai.system: deprecated (renamed to gen_ai.provider.name)",
    ]
    found = registry.defined_attribute("gen_ai.usage.prompt_tokens")
    assert found is not None and found.deprecated == "renamed to gen_ai.usage.input_tokens"


def test_an_enum_value_outside_the_well_known_ones_is_allowed_unless_closed() -> None:
    custom = {"gen_ai.operation.name": "invoke-agent"}  # the spec allows system-specific values
    assert registry.attribute_problems(custom) == []
    (problem,) = registry.attribute_problems(custom, closed_enums=True)
    assert problem.startswith("gen_ai.operation.name: 'invoke-agent' is not a well-known value")


def test_a_lookup_gives_the_declared_type() -> None:
    found = registry.defined_attribute("gen_ai.operation.name")
    assert found is not None
    assert found.type == "string" and "invoke_agent" in found.members and not found.deprecated
    assert registry.defined_attribute("gen_ai.nope") is None


TOKEN_USAGE = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4",
    "gen_ai.token.type": "input",
}


def test_a_well_formed_metric_passes() -> None:
    assert (
        registry.metric_problems("gen_ai.client.token.usage", "histogram", "{token}", TOKEN_USAGE)
        == []
    )
    assert (
        registry.metric_problems(
            "gen_ai.execute_tool.duration",
            "histogram",
            "s",
            {"gen_ai.tool.name": "search", "error.type": "timeout"},
        )
        == []
    )


def test_a_metric_with_the_wrong_name_instrument_or_unit_is_reported() -> None:
    (problem,) = registry.metric_problems("gen_ai.client.token_usage", "histogram", "{token}", {})
    assert problem.startswith("metric gen_ai.client.token_usage: not defined")
    assert registry.metric_problems(
        "gen_ai.client.token.usage", "counter", "tokens", TOKEN_USAGE
    ) == [
        "metric gen_ai.client.token.usage: instrument counter, defined as histogram",
        "metric gen_ai.client.token.usage: unit 'tokens', defined as '{token}'",
    ]


def test_a_metric_missing_a_required_attribute_or_with_a_foreign_one_is_reported() -> None:
    attributes = {**TOKEN_USAGE, "agentrt.run_id": "r1"}
    del attributes["gen_ai.token.type"]
    assert registry.metric_problems(
        "gen_ai.client.token.usage", "histogram", "{token}", attributes
    ) == [
        "metric gen_ai.client.token.usage: attribute agentrt.run_id is not one of the metric's",
        "metric gen_ai.client.token.usage: required attribute gen_ai.token.type is missing",
    ]


def test_a_metric_attribute_of_the_wrong_type_is_reported() -> None:
    problems = registry.metric_problems(
        "gen_ai.execute_tool.duration", "histogram", "s", {"gen_ai.tool.name": 3}
    )
    assert problems == [
        "metric gen_ai.execute_tool.duration: gen_ai.tool.name: declared string, got int 3"
    ]


def test_a_span_missing_a_required_attribute_is_reported() -> None:
    assert registry.span_problems("gen_ai.inference.client", GOOD_CHAT) == []
    problems = registry.span_problems(
        "gen_ai.execute_tool.internal", {"gen_ai.tool.name": "search"}
    )
    assert problems == [
        "span gen_ai.execute_tool.internal: required attribute gen_ai.operation.name is missing"
    ]
