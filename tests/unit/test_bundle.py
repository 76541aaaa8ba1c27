"""Bundle files: loading the examples, enum and version handling, clear refusals, offline digests.

That the offline digest equals what a server computes is checked end to end in
tests/e2e/test_registry_cli.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrt.registry.v1 import enum_pb2
from agentrt_core import bundle
from agentrt_core.bundle import BundleError
from agentrt_core.canonical import ComponentKind
from agentrt_core.errors import InvalidArgument, NotFound
from runtime_service.cli.client import ci_provenance

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V7 = EXAMPLES / "coding_agent.yaml"
V8 = EXAMPLES / "coding_agent_v8.yaml"

AGENT: dict[str, Any] = {
    "agent_id": "a",
    "version_label": "v1",
    "system_prompt": {"text": "hi"},
    "model_policy": "m@1",
}
MODEL_POLICY: dict[str, Any] = {
    "kind": "MODEL_POLICY",
    "name": "m",
    "version": 1,
    "spec": {"candidates": [{"name": "p", "provider": "x", "model_id": "y"}]},
}


def tool(**overrides: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "TOOL",
        "name": "t",
        "version": 1,
        "spec": {"description": "d", "input_schema": {"type": "object"}},
    }
    item.update(overrides)
    return item


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bundle.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# -- the examples ----------------------------------------------------------------------------


def test_v7_example_loads_in_file_order_with_string_versions() -> None:
    loaded = bundle.load(V7)
    assert [c.ref for c in loaded.components] == [
        "repo-debug@2.1.0",
        "read_file@1",
        "apply_patch@2",
        "run_tests@1",
        "workspace-safe@4",
        "test-and-diff@3",
        "coding-balanced@3",
    ]
    assert [c.where for c in loaded.components][:2] == ["components[0]", "components[1]"]
    agent, definition = loaded.require_agent()
    assert agent.version_label == "agent_v7"
    assert definition.skills == ("repo-debug@^2.1",)
    assert definition.tools == ("read_file@1", "apply_patch@2", "run_tests@1")
    assert definition.system_prompt_text is not None
    assert definition.system_prompt_ref is None


def test_enums_gain_their_proto_prefix_on_the_wire_and_lose_it_in_the_domain() -> None:
    loaded = bundle.load(V7)
    by_name = {c.draft.name: c for c in loaded.components}
    policy = by_name["coding-balanced"]
    primary = policy.proto.spec.model_policy.candidates[0]
    assert list(primary.fallback_on) == [
        enum_pb2.ERROR_CLASS_RATE_LIMITED,
        enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT,
    ]
    assert primary.max_context_tokens == 200000
    assert policy.draft.spec["candidates"][0]["fallback_on"] == ["RATE_LIMITED", "PROVIDER_TIMEOUT"]
    assert policy.proto.kind == enum_pb2.COMPONENT_KIND_MODEL_POLICY
    permissions = by_name["workspace-safe"].draft.spec
    assert permissions["default_decision"] == "DENY"
    assert {r["tool"]: r["decision"] for r in permissions["rules"]} == {
        "read_file": "ALLOW",
        "run_tests": "ALLOW",
        "apply_patch": "REQUIRE_APPROVAL",
    }
    assert by_name["apply_patch"].draft.spec["side_effects"] is True
    assert by_name["apply_patch"].draft.kind is ComponentKind.TOOL


def test_prefixed_enum_names_are_accepted_and_digest_the_same() -> None:
    def digest(fallback: str, decision: str) -> str:
        data = {
            "components": [
                {
                    **MODEL_POLICY,
                    "spec": {
                        "candidates": [
                            {
                                "name": "p",
                                "provider": "x",
                                "model_id": "y",
                                "fallback_on": [fallback],
                            }
                        ]
                    },
                },
                {
                    "kind": "COMPONENT_KIND_PERMISSION_POLICY",
                    "name": "pp",
                    "version": 1,
                    "spec": {"default_decision": decision},
                },
                tool(),
            ],
            "agent": {**AGENT, "tools": ["t@1"], "permission_policy": "pp@1"},
        }
        return bundle.digest_bundle(bundle.parse(data)).digest

    assert digest("RATE_LIMITED", "DENY") == digest(
        "ERROR_CLASS_RATE_LIMITED", "PERMISSION_DECISION_DENY"
    )


def test_offline_digest_of_the_example_is_stable_and_order_independent() -> None:
    loaded = bundle.load(V7)
    first = bundle.digest_bundle(loaded)
    assert first.digest.startswith("sha256:") and len(first.digest) == 71
    assert bundle.digest_bundle(bundle.load(V7)).digest == first.digest
    data = yaml.safe_load(V7.read_text())
    data["components"].reverse()
    data["agent"]["tools"].reverse()
    assert bundle.digest_bundle(bundle.parse(data)).digest == first.digest
    slots = [e.slot for e in first.closure]
    assert slots[:3] == ["system_prompt", "model_policy", "skills[repo-debug]"]
    skill = next(e for e in first.closure if e.slot == "skills[repo-debug]")
    assert (skill.version, skill.requested_ref) == ("2.1.0", "repo-debug@^2.1")


def test_v8_needs_the_v7_components_and_then_differs_only_by_apply_patch() -> None:
    v8 = bundle.load(V8)
    assert [c.ref for c in v8.components] == ["apply_patch@3"]
    with pytest.raises(NotFound) as caught:
        bundle.digest_bundle(v8)
    assert caught.value.metadata["field"] == "agent.model_policy"
    assert caught.value.resource_name == "coding-balanced@3"
    v7 = bundle.load(V7)
    digested = bundle.digest_bundle(v8, [v7])
    baseline = bundle.digest_bundle(v7)
    assert digested.digest != baseline.digest
    different = {e.slot for e in digested.closure} - {e.slot for e in baseline.closure}
    assert different == set()
    changed = {e.slot for e in digested.closure if e not in set(baseline.closure)}
    assert changed == {"tools[apply_patch]"}


def test_a_fallback_source_is_asked_for_what_the_files_do_not_declare() -> None:
    v7 = bundle.load(V7)
    published = bundle.FileComponentSource()
    for component, digested in zip(v7.components, bundle.digest_components(v7), strict=True):
        published.add(digested, component.where)
    assert bundle.digest_bundle(bundle.load(V8), fallback=published).digest == (
        bundle.digest_bundle(bundle.load(V8), [v7]).digest
    )


# -- versions --------------------------------------------------------------------------------


def test_integer_versions_become_strings() -> None:
    agent: dict[str, Any] = {**AGENT, "version_label": 7}
    loaded = bundle.parse({"components": [tool(version=12)], "agent": agent})
    assert loaded.components[0].draft.version == "12"
    assert loaded.agent is not None and loaded.agent.version_label == "7"


@pytest.mark.parametrize("version", [2.1, 1.10, 3.0])
def test_float_versions_are_refused_with_advice_to_quote(version: float) -> None:
    with pytest.raises(
        BundleError, match=r"components\[0\] \(t@.*\): version: .*quote the version"
    ):
        bundle.parse({"components": [tool(version=version)]}, "f.yaml")


def test_float_version_label_is_refused() -> None:
    with pytest.raises(BundleError, match=r"agent\.version_label: 7\.1 .*quote"):
        bundle.parse({"agent": {**AGENT, "version_label": 7.1}})


def test_boolean_version_is_not_version_one() -> None:
    with pytest.raises(BundleError, match="version: expected a string, got a boolean"):
        bundle.parse({"components": [tool(version=True)]})


# -- refusals, one line each -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"component": []}, "unknown top-level key 'component'"),
        ([1, 2], "expected a mapping"),
        ({"components": {"a": 1}}, "components: expected a list"),
        ({"components": [tool(color="red")]}, r"components\[0\] \(t@1\): unknown field 'color'"),
        ({"components": [tool(kind="WIDGET")]}, "kind: 'WIDGET' is not one of PROMPT, SKILL"),
        ({"components": [tool(spec=None)]}, "spec: required"),
        (
            {"components": [tool(spec={"description": "d", "input_schemaa": {}})]},
            r"spec\.input_schemaa: unknown field \(ToolSpec has: description, input_schema",
        ),
        (
            {"components": [tool(spec={"description": "d", "input_schema": "object"})]},
            r"spec\.input_schema: expected a mapping",
        ),
        (
            {"components": [tool(spec={"description": "d", "side_effects": "yes"})]},
            r"spec\.side_effects: expected true or false, got a string",
        ),
        (
            {"components": [{**MODEL_POLICY, "spec": {"candidates": [{"fallback_on": ["SLOW"]}]}}]},
            r"spec\.candidates\[0\]\.fallback_on\[0\]: 'SLOW' is not one of PROVIDER_TIMEOUT",
        ),
        (
            {
                "components": [
                    {**MODEL_POLICY, "spec": {"candidates": [{"max_context_tokens": "1k"}]}}
                ]
            },
            r"spec\.candidates\[0\]\.max_context_tokens: expected an integer",
        ),
        ({"agent": {**AGENT, "tool": ["x@1"]}}, r"agent\.tool: unknown field \(AgentDefinition"),
        ({"agent": {**AGENT, "tools": "x@1"}}, r"agent\.tools: expected a list"),
        (
            {"agent": {**AGENT, "system_prompt": {"text": "a", "ref": "p@1"}}},
            "agent.system_prompt: give either 'text' or 'ref', not both",
        ),
    ],
)
def test_malformed_bundles_are_refused_with_one_line_naming_the_place(
    data: Any, message: str
) -> None:
    with pytest.raises(BundleError, match=message) as caught:
        bundle.parse(data, "f.yaml")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("f.yaml: ")


def test_missing_file_and_bad_yaml_and_duplicate_keys(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"cannot read .*nope\.yaml: No such file"):
        bundle.load(tmp_path / "nope.yaml")
    with pytest.raises(BundleError, match=r"bundle\.yaml:2:\d+: not valid YAML"):
        bundle.load(write(tmp_path, "agent: {agent_id: a\n"))
    duplicated = """\
        agent:
          agent_id: a
          agent_id: b
        """
    with pytest.raises(BundleError, match=r"bundle\.yaml:3:\d+: .*duplicate key 'agent_id'"):
        bundle.load(write(tmp_path, duplicated))


def test_unquoted_decimal_version_in_a_file_is_refused(tmp_path: Path) -> None:
    text = """\
        components:
          - kind: SKILL
            name: s
            version: 1.10
            spec: {description: d, instructions: i}
        """
    with pytest.raises(BundleError, match=r'version: 1\.1 was read as a number.*"1\.1"'):
        bundle.load(write(tmp_path, text))


def test_require_agent_names_the_file() -> None:
    with pytest.raises(BundleError, match=r"f\.yaml: no 'agent:' section"):
        bundle.parse({"components": [tool()]}, "f.yaml").require_agent()


def test_registry_rule_violations_use_paths_in_the_file() -> None:
    broken = tool(spec={"description": "d", "input_schema": {"type": "objectx"}})
    with pytest.raises(InvalidArgument) as caught:
        bundle.digest_components(bundle.parse({"components": [MODEL_POLICY, broken]}))
    assert caught.value.violations[0].field.startswith("components[1].spec.input_schema")


def test_same_label_declared_twice_with_different_content_is_refused() -> None:
    other = tool(spec={"description": "other", "input_schema": {"type": "object"}})
    data = {
        "components": [MODEL_POLICY, tool(), other],
        "agent": {**AGENT, "tools": ["t@1"], "permission_policy": ""},
    }
    with pytest.raises(InvalidArgument, match=r"t@1 is also declared at components\[1\]"):
        bundle.digest_bundle(bundle.parse(data))


def test_a_name_declared_with_two_kinds_is_refused() -> None:
    data = {
        "components": [MODEL_POLICY, {**tool(), "name": "m", "version": 2}],
        "agent": AGENT,
    }
    with pytest.raises(InvalidArgument, match="'m' is a MODEL_POLICY at components"):
        bundle.digest_bundle(bundle.parse(data))


# -- provenance from CI variables ------------------------------------------------------------


def test_github_actions_provenance() -> None:
    found = ci_provenance(
        {
            "GITHUB_REPOSITORY": "acme/agents",
            "GITHUB_SERVER_URL": "https://github.example",
            "GITHUB_SHA": "abc123",
            "GITHUB_RUN_ID": "42",
            "GITHUB_ACTOR": "release-bot",
        }
    )
    assert found == {
        "source_repo": "https://github.example/acme/agents",
        "pipeline_url": "https://github.example/acme/agents/actions/runs/42",
        "commit": "abc123",
        "publisher": "release-bot",
    }


def test_gitlab_ci_provenance() -> None:
    found = ci_provenance(
        {
            "CI_PROJECT_URL": "https://gitlab.example/acme/agents",
            "CI_COMMIT_SHA": "def456",
            "CI_PIPELINE_URL": "https://gitlab.example/acme/agents/-/pipelines/7",
        }
    )
    assert found == {
        "source_repo": "https://gitlab.example/acme/agents",
        "commit": "def456",
        "pipeline_url": "https://gitlab.example/acme/agents/-/pipelines/7",
    }
    assert ci_provenance({}) == {}
