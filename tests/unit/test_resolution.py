"""Pure tests of version resolution: model candidate choice, permission decisions under the
run's ceiling, tool-argument validation against the pinned schema."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt_core import resolution
from agentrt_core.errors import FailedPrecondition
from agentrt_core.resolution import BoundDefinition, Pinned

POLICY: dict[str, Any] = {
    "candidates": [
        {
            "name": "primary",
            "model_id": "big",
            "max_context_tokens": 1000,
            "fallback_on": ["RATE_LIMITED", "PROVIDER_TIMEOUT"],
        },
        {"name": "wide", "model_id": "wide", "max_context_tokens": 5000, "fallback_on": []},
        {"name": "last", "model_id": "last"},  # no limit
    ]
}


def choose(tokens: int = 0, error: str = "", previous: str = "") -> tuple[str, str]:
    choice = resolution.choose_model(
        POLICY,
        estimated_input_tokens=tokens,
        previous_error_class=error,
        previous_candidate=previous,
    )
    return choice.candidate["name"], choice.reason


@pytest.mark.parametrize(
    ("tokens", "error", "previous", "expected"),
    [
        (0, "", "", ("primary", "PRIMARY")),
        (1000, "", "", ("primary", "PRIMARY")),  # the limit is inclusive
        (1001, "", "", ("wide", "CONTEXT_LENGTH_ROUTE")),
        (10**9, "", "", ("last", "CONTEXT_LENGTH_ROUTE")),
        (10, "RATE_LIMITED", "primary", ("wide", "FALLBACK_AFTER_ERROR")),
        (10, "PROVIDER_TIMEOUT", "primary", ("wide", "FALLBACK_AFTER_ERROR")),
        # The next candidate must fit the context too.
        (6000, "RATE_LIMITED", "primary", ("last", "FALLBACK_AFTER_ERROR")),
        # An error the failed candidate does not fall back on: retry the same one.
        (10, "PROVIDER_ERROR", "primary", ("primary", "PRIMARY")),
        (10, "RATE_LIMITED", "wide", ("wide", "FALLBACK_AFTER_ERROR")),
        # ... unless it no longer fits: route by context from the top.
        (2000, "PROVIDER_ERROR", "primary", ("wide", "CONTEXT_LENGTH_ROUTE")),
        # An unknown previous candidate is taken as the primary.
        (10, "RATE_LIMITED", "gone", ("wide", "FALLBACK_AFTER_ERROR")),
    ],
)
def test_choose_model(tokens: int, error: str, previous: str, expected: tuple[str, str]) -> None:
    assert choose(tokens, error, previous) == expected


def test_choose_model_refuses_when_nothing_is_left() -> None:
    tight = {"candidates": [c for c in POLICY["candidates"] if "max_context_tokens" in c]}
    with pytest.raises(FailedPrecondition) as info:
        resolution.choose_model(
            tight, estimated_input_tokens=9000, previous_error_class="", previous_candidate=""
        )
    assert info.value.reason == "NO_MODEL_CANDIDATE"
    assert info.value.metadata["estimated_input_tokens"] == "9000"
    with pytest.raises(FailedPrecondition) as info:
        resolution.choose_model(
            tight,
            estimated_input_tokens=6000,
            previous_error_class="RATE_LIMITED",
            previous_candidate="primary",
        )
    assert info.value.reason == "NO_MODEL_CANDIDATE"
    assert info.value.metadata["previous_candidate"] == "primary"
    with pytest.raises(FailedPrecondition):
        resolution.choose_model(
            {"candidates": []},
            estimated_input_tokens=0,
            previous_error_class="",
            previous_candidate="",
        )


def pinned(name: str, spec: dict[str, Any], schema_digest: str = "") -> Pinned:
    return Pinned(name, "1", f"sha256:{name}", spec, schema_digest)


def definition(rules: dict[str, str] | None, default: str = "DENY") -> BoundDefinition:
    policy = None
    if rules is not None:
        policy = pinned(
            "perms",
            {
                "rules": [{"tool": t, "decision": d} for t, d in rules.items()],
                "default_decision": default,
            },
        )
    return BoundDefinition(
        digest="sha256:agent",
        agent_id="a",
        version_label="v1",
        system_prompt=pinned("prompt", {"text": "hi"}),
        model_policy=pinned("models", POLICY),
        tools={
            "read": pinned("read", {"side_effects": False}),
            "write": pinned("write", {"side_effects": True}),
            "shell": pinned("shell", {"side_effects": True}),
        },
        permission_policy=policy,
    )


@pytest.mark.parametrize(
    ("tool", "ceiling", "expected"),
    [
        ("read", "FULL", "ALLOW"),
        ("write", "FULL", "ALLOW"),
        ("shell", "FULL", "REQUIRE_APPROVAL"),
        ("read", "APPROVE_SIDE_EFFECTS", "ALLOW"),
        ("write", "APPROVE_SIDE_EFFECTS", "REQUIRE_APPROVAL"),
        ("shell", "APPROVE_SIDE_EFFECTS", "REQUIRE_APPROVAL"),
        ("read", "READ_ONLY", "ALLOW"),
        ("write", "READ_ONLY", "DENY"),
        ("shell", "READ_ONLY", "DENY"),
        ("nope", "FULL", "DENY"),  # not in the definition
    ],
)
def test_permission_meets_the_ceiling(tool: str, ceiling: str, expected: str) -> None:
    bound = definition({"read": "ALLOW", "write": "ALLOW", "shell": "REQUIRE_APPROVAL"})
    assert resolution.permission(bound, tool, ceiling) == expected


def test_permission_default_and_missing_policy() -> None:
    bound = definition({"read": "ALLOW"}, default="REQUIRE_APPROVAL")
    assert resolution.permission(bound, "write", "FULL") == "REQUIRE_APPROVAL"  # the default
    assert resolution.permission(bound, "write", "READ_ONLY") == "DENY"  # ceiling is stricter
    denying = definition({"write": "DENY"}, default="ALLOW")
    # A ceiling never loosens a rule.
    assert resolution.permission(denying, "write", "APPROVE_SIDE_EFFECTS") == "DENY"
    assert resolution.permission(denying, "read", "FULL") == "ALLOW"
    assert resolution.permission(definition(None), "read", "FULL") == "DENY"


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "integer"}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer", "minimum": 0}}},
    },
    "required": ["path"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "path", "words"),
    [
        ({"path": "a"}, None, ""),
        ({"path": "a", "lines": [1, 2], "opts": {"depth": 0}}, None, ""),
        ({}, "$", "required"),
        ({"path": 3}, "$.path", "string"),
        ({"path": "a", "lines": [1, "x"]}, "$.lines[1]", "integer"),
        ({"path": "a", "opts": {"depth": -1}}, "$.opts.depth", "minimum"),
        ({"path": "a", "extra": True}, "$", "additional"),
    ],
)
def test_argument_errors_name_the_schema_path(
    arguments: dict[str, Any], path: str | None, words: str
) -> None:
    tool = pinned("read", {"input_schema": SCHEMA}, schema_digest="sha256:unit-schema-1")
    errors = resolution.argument_errors(tool, arguments)
    if path is None:
        assert errors == []
        return
    [error] = errors
    assert error.json_path == path
    assert words in error.message.lower()


def test_argument_errors_are_every_violation_with_its_own_path() -> None:
    tool = pinned("read", {"input_schema": SCHEMA}, schema_digest="sha256:unit-schema-1")
    # Numbers as a Struct carries them: every one a double.
    arguments = {"path": 3.0, "lines": [1.0, "x", 2.5], "opts": {"depth": -1.0}, "x": True}
    found = [(e.json_path, e.message) for e in resolution.argument_errors(tool, arguments)]
    # In the order of their locations, whatever the order of the schema's keywords.
    assert found == [
        ("$", "Additional properties are not allowed ('x' was unexpected)"),
        ("$.lines[1]", "'x' is not of type 'integer'"),
        ("$.lines[2]", "2.5 is not of type 'integer'"),
        ("$.opts.depth", "-1 is less than the minimum of 0"),
        ("$.path", "3 is not of type 'string'"),
    ]


def test_argument_paths_quote_keys_that_are_not_identifiers() -> None:
    violation = resolution.ArgumentViolation(("a.b", 0, "ok", "два слова"), "bad")
    assert violation.json_path == '$["a.b"][0].ok["два слова"]'
    assert violation.field("tool_call.arguments") == (
        'tool_call.arguments["a.b"][0].ok["два слова"]'
    )


def test_argument_validators_are_per_schema() -> None:
    strict = pinned("a", {"input_schema": {"type": "object", "required": ["x"]}})
    loose = pinned("b", {"input_schema": {"type": "object"}})
    # Neither has a schema digest: each must still be checked against its own schema.
    assert resolution.argument_errors(strict, {}) != []
    assert resolution.argument_errors(loose, {}) == []
    assert resolution.argument_errors(strict, {"x": 1}) == []
    # No schema at all accepts anything.
    assert resolution.argument_errors(pinned("c", {}, "sha256:unit-empty"), {"any": 1}) == []


def test_bound_definition_from_the_acquired_document() -> None:
    def entry(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "version": "1", "digest": f"sha256:{name}", **extra}

    checks = {"checks": [{"name": "tests-pass"}, {"name": "reviewed"}]}
    document = {
        "type": "agentrt.bound_agent.v1",
        "agent_digest": "sha256:agent",
        "agent": {
            "agent_id": "a",
            "version_label": "v1",
            "system_prompt": {"digest": "sha256:inline"},
            "model_policy": entry("models"),
            "skills": [entry("debug")],
            "tools": [entry("read", schema_digest="sha256:s"), entry("write")],
            "completion_policy": entry("done"),
        },
        "components": {
            "sha256:inline": {"spec": {"text": "hi"}},
            "sha256:models": {"spec": {}},
            "sha256:debug": {"spec": {}},
            "sha256:read": {"spec": {"side_effects": True}},
            "sha256:write": {"spec": {}},
            "sha256:done": {"spec": checks},
        },
    }
    bound = resolution.bound_definition(document)
    assert (bound.digest, bound.agent_id, bound.version_label) == ("sha256:agent", "a", "v1")
    assert (bound.system_prompt.name, bound.system_prompt.spec) == ("", {"text": "hi"})
    assert set(bound.skills) == {"debug"} and set(bound.tools) == {"read", "write"}
    assert bound.tools["read"].schema_digest == "sha256:s"
    assert bound.tools["read"].spec == {"side_effects": True}
    assert bound.tools["write"].schema_digest == ""
    assert bound.permission_policy is None
    assert bound.completion_checks == ["tests-pass", "reviewed"]


def test_a_model_call_is_handed_every_skill_unless_the_spec_names_some() -> None:
    def pinned(name: str) -> Pinned:
        return Pinned(name, "1", f"sha256:{name}", {})

    bound = BoundDefinition(
        digest="sha256:agent",
        agent_id="a",
        version_label="v1",
        system_prompt=pinned("prompt"),
        model_policy=pinned("models"),
        skills={"search": pinned("search"), "debug": pinned("debug")},
    )
    assert resolution.skills_for_call(bound, []) == ("debug", "search")
    assert resolution.skills_for_call(bound, ["search", "search"]) == ("search",)
    none = BoundDefinition(
        digest="sha256:b",
        agent_id="b",
        version_label="v1",
        system_prompt=pinned("prompt"),
        model_policy=pinned("models"),
    )
    assert resolution.skills_for_call(none, []) == ()
