"""Canonical form and digests: the rules of docs/digest.md, example by example and as properties."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentrt_core import jcs
from agentrt_core.canonical import (
    AgentClosure,
    ResolvedEntry,
    agent_digest,
    agent_document,
    component_digest,
    component_document,
    tool_digests,
)
from agentrt_core.jcs import (
    CanonicalError,
    canonical_bytes,
    digest_bytes,
    digest_document,
    schema_digest,
)
from agentrt_core.refs import is_digest, is_valid_label, is_valid_name
from agentrt_core.specs import DECISIONS, ComponentKind, normalise_spec

D1, D2, D3, D4 = (digest_bytes(bytes([i])) for i in range(4))


def cbytes(kind: str, spec: dict[str, Any], name: str = "c") -> bytes:
    return canonical_bytes(component_document(kind, name, "1", "", spec))


# --------------------------------------------------------------------------------------------
# Digests and JCS
# --------------------------------------------------------------------------------------------


def test_digest_is_sha256_of_the_bytes_in_lowercase_hex() -> None:
    empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert digest_bytes(b"") == empty
    assert is_digest(empty)
    assert not is_digest(empty.upper().replace("SHA256", "sha256"))
    assert not is_digest(empty + "\n")
    assert not is_digest(empty[:-1])


def test_digest_document_hashes_the_jcs_bytes() -> None:
    doc = {"b": [1, 2.5, "x"], "a": {"z": None, "y": True}}
    expected = b'{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}'
    assert canonical_bytes(doc) == expected
    assert digest_document(doc) == "sha256:" + hashlib.sha256(expected).hexdigest()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1, "1"),
        (1.0, "1"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (1.5e-5, "0.000015"),
        (2.0**60, "1152921504606847000"),
        (2**53 - 1, "9007199254740991"),
        (-(2**53 - 1), "-9007199254740991"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (333333333.33333329, "333333333.3333333"),
    ],
)
def test_numbers_are_written_as_ecmascript_does(value: float, text: str) -> None:
    # Expected texts from RFC 8785 Appendix B and ECMAScript Number.prototype.toString.
    assert canonical_bytes({"n": value}) == b'{"n":' + text.encode() + b"}"


def test_object_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F600 is D83D DE00 in UTF-16, so it sorts before U+FB33 (code-point order says after).
    doc = {"\ufb33": 1, "\U0001f600": 2, "\u20ac": 3, "1": 4, "\r": 5, "\u00f6": 6, "\x80": 7}
    assert canonical_bytes(doc).decode() == (
        '{"\\r":5,"1":4,"\x80":7,"\u00f6":6,"\u20ac":3,"\U0001f600":2,"\ufb33":1}'
    )


def test_strings_are_kept_byte_exact_without_unicode_normalisation() -> None:
    nfc = "caf\u00e9"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    assert component_digest("PROMPT", "p", "1", "", {"text": nfc}) != component_digest(
        "PROMPT", "p", "1", "", {"text": nfd}
    )
    assert component_digest("PROMPT", "p", "1", nfc, {}) != component_digest(
        "PROMPT", "p", "1", nfd, {}
    )
    assert canonical_bytes({"s": "\U0001d11e\x7f\u2028\x1f\n"}) == (
        '{"s":"\U0001d11e\x7f\u2028\\u001f\\n"}'.encode()
    )


# --------------------------------------------------------------------------------------------
# Refusals name the field
# --------------------------------------------------------------------------------------------

REFUSED: list[tuple[str, Any, str]] = [
    (
        "TOOL",
        {"input_schema": {"properties": {"x": {"maximum": float("nan")}}}},
        "spec.input_schema.properties.x.maximum",
    ),
    ("TOOL", {"input_schema": {"a": [0, float("inf")]}}, "spec.input_schema.a[1]"),
    ("TOOL", {"input_schema": {"a": -float("inf")}}, "spec.input_schema.a"),
    ("TOOL", {"input_schema": {"big": 2**53}}, "spec.input_schema.big"),
    ("TOOL", {"input_schema": {"big": -(2**53)}}, "spec.input_schema.big"),
    ("TOOL", {"input_schema": {"x.y": {"\ud800": 1}}}, 'spec.input_schema["x.y"]["\ud800"]'),
    ("TOOL", {"input_schema": {"s": "ok\udfffok"}}, "spec.input_schema.s"),
    ("TOOL", {"input_schema": {1: "a"}}, "spec.input_schema"),
    ("TOOL", {"input_schema": {"b": b"bytes"}}, "spec.input_schema.b"),
    ("TOOL", {"input_schema": {"s": {1, 2}}}, "spec.input_schema.s"),
    ("TOOL", {}, "spec.input_schema"),
    ("TOOL", {"input_schema": []}, "spec.input_schema"),
    ("TOOL", {"input_schema": {}, "output_schema": True}, "spec.output_schema"),
    ("TOOL", {"input_schema": {}, "side_effects": "yes"}, "spec.side_effects"),
    ("TOOL", {"input_schema": {}, "side_effects": 1}, "spec.side_effects"),
    ("TOOL", {"input_schema": {}, "extra": 1}, "spec.extra"),
    ("PROMPT", {"text": 5}, "spec.text"),
    ("PROMPT", {"text": "lone \ud83d surrogate"}, "spec.text"),
    ("PROMPT", {"version": "1"}, "spec.version"),
    ("PROMPT", [], "spec"),
    ("SKILL", {"files": [{"path": "a"}, {"path": "a", "content": "x"}]}, "spec.files[1].path"),
    ("SKILL", {"files": [{"path": ""}]}, "spec.files[0].path"),
    ("SKILL", {"files": [{"content": "x"}]}, "spec.files[0].path"),
    ("SKILL", {"files": [{"path": "a", "mode": "0644"}]}, "spec.files[0].mode"),
    ("SKILL", {"files": {"path": "a"}}, "spec.files"),
    ("SKILL", {"files": ["a"]}, "spec.files[0]"),
    (
        "MODEL_POLICY",
        {"candidates": [{"max_context_tokens": -1}]},
        "spec.candidates[0].max_context_tokens",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"max_context_tokens": 1.5}]},
        "spec.candidates[0].max_context_tokens",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"max_context_tokens": True}]},
        "spec.candidates[0].max_context_tokens",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"max_context_tokens": 2**53}]},
        "spec.candidates[0].max_context_tokens",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"fallback_on": ["rate_limited"]}]},
        "spec.candidates[0].fallback_on[0]",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"fallback_on": ["UNSPECIFIED"]}]},
        "spec.candidates[0].fallback_on[0]",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"fallback_on": "RATE_LIMITED"}]},
        "spec.candidates[0].fallback_on",
    ),
    (
        "MODEL_POLICY",
        {"candidates": [{"parameters": {"t": float("nan")}}]},
        "spec.candidates[0].parameters.t",
    ),
    ("MODEL_POLICY", {"candidates": [{"model": "x"}]}, "spec.candidates[0].model"),
    (
        "PERMISSION_POLICY",
        {"rules": [{"tool": "a", "decision": "ALLOW"}, {"tool": "a", "decision": "DENY"}]},
        "spec.rules[1].tool",
    ),
    (
        "PERMISSION_POLICY",
        {"rules": [{"tool": "a", "decision": "MAYBE"}]},
        "spec.rules[0].decision",
    ),
    ("PERMISSION_POLICY", {"rules": [{"tool": "a"}]}, "spec.rules[0].decision"),
    (
        "PERMISSION_POLICY",
        {"rules": [{"tool": "a", "decision": "UNSPECIFIED"}]},
        "spec.rules[0].decision",
    ),
    ("PERMISSION_POLICY", {"rules": [{"decision": "ALLOW"}]}, "spec.rules[0].tool"),
    ("PERMISSION_POLICY", {"default_decision": "allow"}, "spec.default_decision"),
    ("COMPLETION_POLICY", {"checks": [{"name": "t"}, {"name": "t"}]}, "spec.checks[1].name"),
    ("COMPLETION_POLICY", {"checks": [{"name": "t", "weight": 1}]}, "spec.checks[0].weight"),
]


@pytest.mark.parametrize(("kind", "spec", "field"), REFUSED)
def test_refused_specs_raise_canonical_error_naming_the_field(
    kind: str, spec: Any, field: str
) -> None:
    with pytest.raises(CanonicalError) as info:
        component_document(kind, "c", "1", "", spec)
    assert info.value.field == field
    assert info.value.reason
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kind", "name", "version", "description", "field"),
    [
        ("AGENT", "c", "1", "", "kind"),
        ("tool", "c", "1", "", "kind"),
        ("TOOL", "Read_File", "1", "", "name"),
        ("TOOL", "read.file", "1", "", "name"),
        ("TOOL", "1tool", "1", "", "name"),
        ("TOOL", "-x", "1", "", "name"),
        ("TOOL", "x" * 65, "1", "", "name"),
        ("SKILL", 5, "1", "", "name"),
        ("TOOL", "sha256", "1", "", "name"),
        ("TOOL", "t", "", "", "version"),
        ("TOOL", "t", "1.0", "", "version"),
        ("TOOL", "t", "v1", "", "version"),
        ("TOOL", "t", "01", "", "version"),
        ("TOOL", "t", None, "", "version"),
        ("TOOL", "t", 1, "", "version"),
        ("TOOL", "t", "1", None, "description"),
        ("TOOL", "t", "1", 5, "description"),
        ("TOOL", "t", "1", "lone \udc00", "description"),
        # Only a PROMPT may be anonymous, and then with neither a name nor a version.
        ("TOOL", "", "", "", "name"),
        ("SKILL", "", "", "", "name"),
        ("TOOL", "", "1", "", "name"),
        ("PROMPT", "", "1", "", "name"),
        ("PROMPT", "p", "", "", "version"),
        ("PROMPT", "", None, "", "version"),
        ("PROMPT", None, "", "", "name"),
        ("PROMPT", "", "", None, "description"),
    ],
)
def test_refused_kinds_names_versions_and_descriptions(
    kind: Any, name: Any, version: Any, description: Any, field: str
) -> None:
    spec = {"input_schema": {}} if kind == "TOOL" else {}
    with pytest.raises(CanonicalError) as info:
        component_document(kind, name, version, description, spec)
    assert info.value.field == field
    assert info.value.reason


def test_name_errors_describe_the_grammar() -> None:
    with pytest.raises(CanonicalError, match="1-64 of a-z 0-9 _ -, starting with a letter"):
        component_document("TOOL", "read.file", "1", "", {"input_schema": {}})


def test_anonymous_prompt_has_no_name_or_version_member() -> None:
    doc = component_document("PROMPT", "", "", "", {"text": "Be brief."})
    assert doc == {
        "description": "",
        "kind": "PROMPT",
        "spec": {"text": "Be brief."},
        "type": "agentrt.component.v1",
    }
    assert canonical_bytes(doc) == (
        b'{"description":"","kind":"PROMPT","spec":{"text":"Be brief."},'
        b'"type":"agentrt.component.v1"}'
    )
    assert component_digest("PROMPT", "", "", "", {"text": "Be brief."}) == digest_bytes(
        rfc8785.dumps(doc)
    )
    # Anonymous and named are different components, even with the same text.
    assert component_digest("PROMPT", "", "", "", {"text": "x"}) != component_digest(
        "PROMPT", "p", "1", "", {"text": "x"}
    )


def test_canonical_bytes_refuses_non_objects_and_deep_or_circular_values() -> None:
    with pytest.raises(CanonicalError):
        canonical_bytes([1, 2])  # type: ignore[arg-type]
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(CanonicalError):
        canonical_bytes({"deep": deep})
    with pytest.raises(CanonicalError) as info:
        component_document("TOOL", "t", "1", "", {"input_schema": {"deep": deep}})
    assert info.value.field == "spec.input_schema"
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(CanonicalError):
        canonical_bytes(loop)


def test_integers_beyond_double_precision_are_refused_but_large_doubles_are_not() -> None:
    with pytest.raises(CanonicalError) as info:
        schema_digest({"n": 10**21})
    assert info.value.field == "schema.n"
    assert schema_digest({"n": 1e21}) == digest_bytes(b'{"n":1e+21}')


# --------------------------------------------------------------------------------------------
# Normalisation rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "sparse", "explicit"),
    [
        ("PROMPT", {}, {"text": ""}),
        ("PROMPT", {}, {"text": None}),
        (
            "TOOL",
            {"input_schema": {}},
            {"input_schema": {}, "description": "", "side_effects": False},
        ),
        ("TOOL", {"input_schema": {}}, {"input_schema": {}, "output_schema": None}),
        (
            "SKILL",
            {"files": [{"path": "a"}]},
            {"files": [{"path": "a", "content": ""}], "description": ""},
        ),
        ("SKILL", {}, {"files": []}),
        (
            "MODEL_POLICY",
            {"candidates": [{}]},
            {"candidates": [{"name": "", "max_context_tokens": 0, "fallback_on": []}]},
        ),
        (
            "MODEL_POLICY",
            {"candidates": [{"max_context_tokens": 8192}]},
            {"candidates": [{"max_context_tokens": 8192.0}]},
        ),
        ("PERMISSION_POLICY", {}, {"rules": [], "default_decision": "UNSPECIFIED"}),
        (
            "COMPLETION_POLICY",
            {"checks": [{"name": "t"}]},
            {"checks": [{"name": "t", "description": ""}]},
        ),
    ],
)
def test_absent_members_equal_their_proto3_default(
    kind: str, sparse: dict[str, Any], explicit: dict[str, Any]
) -> None:
    assert cbytes(kind, sparse) == cbytes(kind, explicit)


def test_free_form_json_is_kept_verbatim_even_when_empty() -> None:
    base: dict[str, Any] = {"input_schema": {}}
    assert cbytes("TOOL", base) != cbytes("TOOL", {**base, "output_schema": {}})
    assert cbytes("TOOL", {"input_schema": {"x": False}}) == (
        b'{"description":"","kind":"TOOL","name":"c","spec":{"input_schema":{"x":false}},'
        b'"type":"agentrt.component.v1","version":"1"}'
    )
    no_params = {"candidates": [{"name": "a"}]}
    empty_params = {"candidates": [{"name": "a", "parameters": {}}]}
    assert cbytes("MODEL_POLICY", no_params) != cbytes("MODEL_POLICY", empty_params)


def test_sets_are_sorted_and_ordered_lists_are_kept() -> None:
    spec = normalise_spec(
        "SKILL",
        {"files": [{"path": "\ufb33"}, {"path": "b"}, {"path": "\U0001f600"}, {"path": "a"}]},
    )
    assert [f["path"] for f in spec["files"]] == ["a", "b", "\U0001f600", "\ufb33"]
    policy = normalise_spec(
        "MODEL_POLICY",
        {"candidates": [{"name": "z", "fallback_on": ["B", "A", "B"]}, {"name": "a"}]},
    )
    assert [c["name"] for c in policy["candidates"]] == ["z", "a"]
    assert policy["candidates"][0]["fallback_on"] == ["A", "B"]
    swapped = {"candidates": [{"name": "a"}, {"name": "z", "fallback_on": ["A", "B"]}]}
    assert component_digest("MODEL_POLICY", "m", "1", "", policy) != component_digest(
        "MODEL_POLICY", "m", "1", "", swapped
    )


def test_kind_name_version_and_description_are_all_in_the_digest() -> None:
    spec = {"text": "hello"}
    doc = component_document("PROMPT", "greeting", "1.0.0", "Says hello.", spec)
    assert doc == {
        "description": "Says hello.",
        "kind": "PROMPT",
        "name": "greeting",
        "spec": {"text": "hello"},
        "type": "agentrt.component.v1",
        "version": "1.0.0",
    }
    # Members are inserted in JCS order, so the fast path can encode the document as it is.
    assert list(doc) == sorted(doc)
    base = component_digest("PROMPT", "greeting", "1.0.0", "Says hello.", spec)
    variants = [
        ("PROMPT", "other", "1.0.0", "Says hello.", spec),
        ("PROMPT", "greeting", "1.0.1", "Says hello.", spec),
        ("PROMPT", "greeting", "1.0.0+build.2", "Says hello.", spec),
        ("PROMPT", "greeting", "1.0.0", "Says hello!", spec),
        ("PROMPT", "greeting", "1.0.0", "", spec),
        ("SKILL", "greeting", "1.0.0", "Says hello.", {}),
    ]
    assert len({base, *(component_digest(*v) for v in variants)}) == len(variants) + 1


def test_description_is_always_present_and_kept_byte_exact() -> None:
    empty = component_document("PROMPT", "p", "1", "", {})
    assert empty["description"] == ""
    text = " Leading and trailing space \n\U0001f600 "
    assert component_document("PROMPT", "p", "1", text, {})["description"] == text


def test_schema_digest_is_the_digest_of_the_schema_alone() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"path": {"type": "string"}}}
    tool_a: dict[str, Any] = {"input_schema": schema, "description": "a"}
    tool_b: dict[str, Any] = {"input_schema": copy.deepcopy(schema), "description": "b"}
    assert schema_digest(schema) == digest_bytes(rfc8785.dumps(schema))
    assert component_digest("TOOL", "t", "1", "", tool_a) != component_digest(
        "TOOL", "t", "1", "", tool_b
    )
    assert schema_digest(tool_a["input_schema"]) == schema_digest(tool_b["input_schema"])


# --------------------------------------------------------------------------------------------
# Agents
# --------------------------------------------------------------------------------------------


def closure(**overrides: Any) -> AgentClosure:
    fields: dict[str, Any] = {
        "system_prompt": ResolvedEntry(ComponentKind.PROMPT, "prompt", "1", D1),
        "model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "models", "2.0.0", D2),
        "skills": (ResolvedEntry(ComponentKind.SKILL, "repo-debug", "2.1.0", D3),),
        "tools": (
            ResolvedEntry(ComponentKind.TOOL, "write_file", "1", D1, D2),
            ResolvedEntry(ComponentKind.TOOL, "read_file", "1", D3, D4),
        ),
    }
    fields.update(overrides)
    return AgentClosure(**fields)


INLINE = ResolvedEntry(ComponentKind.PROMPT, "", None, D1)


def test_agent_document_shape() -> None:
    doc = agent_document("coder", "agent_v7", "Fixes tests.", closure())
    assert doc["type"] == "agentrt.agent.v1"
    assert doc["agent_id"] == "coder"
    assert doc["version_label"] == "agent_v7"
    assert [t["name"] for t in doc["tools"]] == ["read_file", "write_file"]
    assert doc["tools"][0] == {
        "name": "read_file",
        "version": "1",
        "digest": D3,
        "schema_digest": D4,
    }
    assert "permission_policy" not in doc and "completion_policy" not in doc
    with_policy = closure(
        permission_policy=ResolvedEntry(ComponentKind.PERMISSION_POLICY, "safe", "4", D4)
    )
    assert agent_document("coder", "v1", "", with_policy)["permission_policy"]["name"] == "safe"


def test_agent_id_version_label_and_resolved_versions_are_in_the_digest() -> None:
    base = agent_digest("coder", "agent_v7", "", closure())
    assert agent_digest("other", "agent_v7", "", closure()) != base
    assert agent_digest("coder", "agent_v8", "", closure()) != base
    assert agent_digest("coder", "agent_v7", "x", closure()) != base
    bumped = closure(system_prompt=ResolvedEntry(ComponentKind.PROMPT, "prompt", "2", D1))
    assert agent_digest("coder", "agent_v7", "", bumped) != base
    reordered = closure(tools=tuple(reversed(closure().tools)))
    assert agent_digest("coder", "agent_v7", "", reordered) == base


def test_inline_system_prompt_entry_is_its_digest_alone() -> None:
    doc = agent_document("coder", "v1", "", closure(system_prompt=INLINE))
    assert doc["system_prompt"] == {"digest": D1}
    named = agent_document("coder", "v1", "", closure())
    assert named["system_prompt"] == {"name": "prompt", "version": "1", "digest": D1}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"system_prompt": ResolvedEntry(ComponentKind.SKILL, "p", "1", D1)}, "system_prompt.kind"),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "p", None, D1)},
            "system_prompt.version",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "", "1", D1)},
            "system_prompt.name",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "", "", D1)},
            "system_prompt.name",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "p", "", D1)},
            "system_prompt.version",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "", None, "sha256:x")},
            "system_prompt.digest",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "", None, D1, D2)},
            "system_prompt.schema_digest",
        ),
        (
            {"system_prompt": ResolvedEntry(ComponentKind.PROMPT, "x.system_prompt", "1", D1)},
            "system_prompt.name",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "m", None, D1)},
            "model_policy.version",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "", None, D1)},
            "model_policy.version",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "", "1", D1)},
            "model_policy.name",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "m", "v1", D1)},
            "model_policy.version",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "m", "1", "sha256:x")},
            "model_policy.digest",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "M", "1", D1)},
            "model_policy.name",
        ),
        (
            {"model_policy": ResolvedEntry(ComponentKind.MODEL_POLICY, "m", "1", D1, D2)},
            "model_policy.schema_digest",
        ),
        ({"tools": [ResolvedEntry(ComponentKind.TOOL, "t", "1", D1)]}, "tools[0].schema_digest"),
        ({"tools": [ResolvedEntry(ComponentKind.TOOL, "", None, D1, D2)]}, "tools[0].version"),
        (
            {
                "tools": [
                    ResolvedEntry(ComponentKind.TOOL, "t", "1", D1, D2),
                    ResolvedEntry(ComponentKind.TOOL, "t", "2", D3, D4),
                ]
            },
            "tools[1].name",
        ),
        ({"skills": ["repo-debug@2.1.0"]}, "skills[0]"),
        (
            {"completion_policy": ResolvedEntry(ComponentKind.COMPLETION_POLICY, "c", "1.0", D1)},
            "completion_policy.version",
        ),
    ],
)
def test_invalid_closures_are_refused(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(CanonicalError) as info:
        agent_document("coder", "v1", "", closure(**overrides))
    assert info.value.field == field


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("Coder", "v1", "", closure()), "agent_id"),
        (("coding.agent", "v1", "", closure()), "agent_id"),
        (("", "v1", "", closure()), "agent_id"),
        (("coder", "", "", closure()), "version_label"),
        (("coder", ".v1", "", closure()), "version_label"),
        (("coder", "a b", "", closure()), "version_label"),
        (("coder", "0" * 64, "", closure()), "version_label"),
        (("coder", "v" * 129, "", closure()), "version_label"),
        (("coder", None, "", closure()), "version_label"),
        (("coder", 7, "", closure()), "version_label"),
        (("coder", "v1", 5, closure()), "description"),
        (("coder", "v1", "\udc00", closure()), "description"),
        (("coder", "v1", "", {"system_prompt": None}), "closure"),
    ],
)
def test_invalid_agent_arguments_are_refused(args: tuple[Any, ...], field: str) -> None:
    with pytest.raises(CanonicalError) as info:
        agent_document(*args)
    assert info.value.field == field


def test_version_labels_use_the_tag_grammar_not_the_version_grammar() -> None:
    for label in ["agent_v7", "1", "2.1.0", "V1.x", "_x", "A" * 128]:
        assert is_valid_label(label)
        assert agent_document("coder", label, "", closure())["version_label"] == label


def test_closure_from_mapping() -> None:
    data: dict[str, Any] = {
        "system_prompt": {"name": "prompt", "version": "1", "digest": D1},
        "model_policy": {"name": "models", "version": "2.0.0", "digest": D2},
        "skills": [{"name": "repo-debug", "version": "2.1.0", "digest": D3}],
        "tools": [
            {"name": "write_file", "version": "1", "digest": D1, "schema_digest": D2},
            {"name": "read_file", "version": "1", "digest": D3, "schema_digest": D4},
        ],
    }
    assert AgentClosure.from_mapping(data) == closure()
    inline = {**data, "system_prompt": {"digest": D1}}
    assert AgentClosure.from_mapping(inline) == closure(system_prompt=INLINE)
    bad_closures: list[tuple[dict[str, Any], str]] = [
        ({**data, "system_prompt": None}, "closure.system_prompt"),
        ({**data, "model_policy": None}, "closure.model_policy"),
        ({**data, "extra": 1}, "closure.extra"),
        (
            {**data, "skills": [{"name": "s", "version": 1, "digest": D1}]},
            "closure.skills[0].version",
        ),
        ({**data, "tools": [{"name": "t", "tag": "prod"}]}, "closure.tools[0].tag"),
    ]
    for bad, field in bad_closures:
        with pytest.raises(CanonicalError) as info:
            AgentClosure.from_mapping(bad)
        assert info.value.field == field


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------

# Characters that stress the rules: escapes, non-BMP (surrogate pairs in UTF-16), the
# U+E000-U+FFFF block that sorts differently in UTF-16 and code-point order, combining marks.
SPECIAL_CHARS = [
    "a",
    "Z",
    "0",
    "\x00",
    "\x1f",
    '"',
    "\\",
    "\x7f",
    "\u00e9",
    "\u0301",
    "\u2028",
    "\ue000",
    "\ufb33",
    "\uffff",
    "\U00010000",
    "\U0001f600",
    "\U0010ffff",
]
texts = st.text(alphabet=st.sampled_from(SPECIAL_CHARS) | st.characters(codec="utf-8"), max_size=12)
keys = texts
tricky_floats = st.sampled_from(
    [
        0.0,
        -0.0,
        1e-4,
        9.999999999999999e-05,
        1e-7,
        1e-6,
        1e16,
        1e21,
        1e20,
        2.0**52,
        2.0**53,
        2.0**52 + 0.5,
        0.1,
        1 / 3,
        5e-324,
        1.7976931348623157e308,
        -1.5,
        123456789.125,
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53 - 1), 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    tricky_floats,
    texts,
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=16,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)

names = st.from_regex(r"[a-z][a-z0-9_-]{0,11}", fullmatch=True).filter(is_valid_name)
versions = st.one_of(
    st.integers(1, 10**6).map(str),
    st.builds(
        lambda major, minor, patch, pre: f"{major}.{minor}.{patch}{pre}",
        st.integers(0, 20),
        st.integers(0, 20),
        st.integers(0, 20),
        st.sampled_from(["", "-rc.1", "-0", "+build.5", "-beta.2+exp.sha.5114f85"]),
    ),
)
enum_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: s != "UNSPECIFIED"
)
decisions = st.sampled_from(sorted(DECISIONS))


def optional(**members: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=members)


SPEC_STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "PROMPT": optional(text=texts),
    "SKILL": optional(
        description=texts,
        instructions=texts,
        files=st.lists(
            st.fixed_dictionaries({"path": texts.filter(bool)}, optional={"content": texts}),
            max_size=4,
            unique_by=lambda f: f["path"],
        ),
    ),
    "TOOL": st.fixed_dictionaries(
        {"input_schema": json_objects},
        optional={
            "description": texts,
            "output_schema": json_objects,
            "side_effects": st.booleans(),
        },
    ),
    "MODEL_POLICY": optional(
        candidates=st.lists(
            optional(
                name=texts,
                provider=texts,
                model_id=texts,
                parameters=json_objects,
                max_context_tokens=st.integers(0, 2**53 - 1),
                fallback_on=st.lists(enum_names, max_size=4),
            ),
            max_size=3,
        )
    ),
    "PERMISSION_POLICY": optional(
        rules=st.lists(
            st.fixed_dictionaries({"tool": texts.filter(bool), "decision": decisions}),
            max_size=4,
            unique_by=lambda r: r["tool"],
        ),
        default_decision=decisions,
    ),
    "COMPLETION_POLICY": optional(
        checks=st.lists(
            st.fixed_dictionaries({"name": texts.filter(bool)}, optional={"description": texts}),
            max_size=4,
            unique_by=lambda c: c["name"],
        )
    ),
}
# (kind, name, version, description, spec); now and then an anonymous PROMPT.
components = st.sampled_from(sorted(SPEC_STRATEGIES)).flatmap(
    lambda kind: st.tuples(st.just(kind), names, versions, texts, SPEC_STRATEGIES[kind])
) | st.tuples(st.just("PROMPT"), st.just(""), st.just(""), texts, SPEC_STRATEGIES["PROMPT"])

# Which members of the spec structures are sets (may be permuted) and what their defaults are.
SETS = {"files", "rules", "checks", "fallback_on"}
FREE_FORM = {"input_schema", "output_schema", "parameters"}
DEFAULTS: dict[str, dict[str, Any]] = {
    "PROMPT": {"text": ""},
    "SKILL": {"description": "", "instructions": "", "files": []},
    "TOOL": {"description": "", "side_effects": False, "output_schema": None},
    "MODEL_POLICY": {"candidates": []},
    "PERMISSION_POLICY": {"rules": [], "default_decision": "UNSPECIFIED"},
    "COMPLETION_POLICY": {"checks": []},
}
ITEM_DEFAULTS: dict[str, dict[str, Any]] = {
    "files": {"content": ""},
    "candidates": {
        "name": "",
        "provider": "",
        "model_id": "",
        "max_context_tokens": 0,
        "fallback_on": [],
    },
    "checks": {"description": ""},
}


def shuffled_json(value: Any, rnd: random.Random) -> Any:
    """Same JSON value: keys reordered, integral numbers switched between int and float."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled_json(v, rnd) for k, v in items}
    if isinstance(value, list):
        out = [shuffled_json(v, rnd) for v in value]
        return tuple(out) if rnd.random() < 0.3 else out
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53 - 1:
        return int(value) if rnd.random() < 0.5 else value
    if type(value) is int and rnd.random() < 0.5:
        return float(value)
    return value


def equivalent_spec(kind: str, spec: dict[str, Any], rnd: random.Random) -> dict[str, Any]:
    """A spec that must have the same digest: shuffled, sets permuted, defaults spelled out."""

    def struct(value: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in FREE_FORM:
                out[k] = shuffled_json(v, rnd)
            elif isinstance(v, list):
                items = [
                    struct(i, ITEM_DEFAULTS.get(k, {})) if isinstance(i, dict) else i for i in v
                ]
                if k in SETS:
                    rnd.shuffle(items)
                    if k == "fallback_on" and items:
                        items.append(rnd.choice(items))  # repetition means nothing in a set
                out[k] = items
            else:
                out[k] = v
        for k, default in defaults.items():
            if k not in out and rnd.random() < 0.5:
                out[k] = default if rnd.random() < 0.7 else None
        members = list(out.items())
        rnd.shuffle(members)
        return dict(members)

    return struct(spec, DEFAULTS[kind])


@given(components, st.randoms(use_true_random=False))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_equivalent_specs_have_the_same_digest(component: Any, rnd: random.Random) -> None:
    kind, name, version, description, spec = component
    digest = component_digest(kind, name, version, description, spec)
    variant = equivalent_spec(kind, spec, rnd)
    assert component_digest(kind, name, version, description, variant) == digest
    # JSON re-formatted (a round trip through text) changes nothing either.
    text = json.dumps(variant, indent=rnd.choice([None, 1, 4]), ensure_ascii=rnd.random() < 0.5)
    assert component_digest(kind, name, version, description, json.loads(text)) == digest


@given(components)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_normalised_spec_is_a_fixed_point_and_both_digest_paths_agree(component: Any) -> None:
    kind, name, version, description, spec = component
    doc = component_document(kind, name, version, description, spec)
    assert component_document(kind, name, version, description, doc["spec"]) == doc
    assert list(doc) == sorted(doc)  # JCS order, which the fast path relies on
    expected = digest_bytes(rfc8785.dumps(doc))
    assert component_digest(kind, name, version, description, spec) == expected
    assert digest_document(doc) == expected


@given(names, versions, texts, SPEC_STRATEGIES["TOOL"])
def test_tool_digests_equal_the_separate_digests(
    name: str, version: str, description: str, spec: dict[str, Any]
) -> None:
    assert tool_digests(name, version, description, spec) == (
        component_digest("TOOL", name, version, description, spec),
        schema_digest(spec["input_schema"]),
    )


def string_leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in string_leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in string_leaves(v, (*path, i))]
    return [path] if isinstance(value, str) else []


@given(components, st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_changed_value_changes_the_digest(component: Any, data: st.DataObject) -> None:
    kind, name, version, description, spec = component
    normalised = normalise_spec(kind, spec)
    leaves = string_leaves(normalised)
    assume(leaves)
    path = data.draw(st.sampled_from(leaves))
    changed = copy.deepcopy(normalised)
    target = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] += "X"  # still a valid enum value name, path, tool or check name
    try:
        digest = component_digest(kind, name, version, description, changed)
    except CanonicalError:
        assume(False)  # e.g. "ALLOWX" is no decision, or "a" became a duplicate of "aX"
    assert digest != component_digest(kind, name, version, description, normalised)


@given(json_objects)
def test_fast_encoder_path_is_byte_identical_to_the_reference_library(doc: dict[str, Any]) -> None:
    expected = rfc8785.dumps(doc)
    assert canonical_bytes(doc) == expected
    try:
        fast = jcs._fast_jcs(doc)
    except jcs.Unusual:
        return
    assert fast == expected


def test_ordinary_documents_take_the_fast_path() -> None:
    # The 20 ms/MB budget depends on this; a change that sends everything to the library
    # would still be correct, so only this test would notice.
    schema = {
        "type": "object",
        "properties": {"t": {"type": "number", "minimum": 0.5, "maximum": 2}},
    }
    assert jcs._fast_jcs({"spec": schema, "text": "caf\u00e9 \U0001f600"})


junk_leaves = st.one_of(
    scalars,
    st.integers(),
    st.floats(),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2),
    st.binary(max_size=2),
    st.sets(st.integers(), max_size=2),
    st.just(object()),
    st.just(ComponentKind.TOOL),
    st.sampled_from([*sorted(DECISIONS), "UNSPECIFIED", "rate_limited"]),
)
junk = st.recursive(
    junk_leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children)
        | st.dictionaries(st.one_of(texts, st.integers(), st.none()), children, max_size=3)
    ),
    max_leaves=10,
)
ALL_MEMBERS = [
    "text",
    "description",
    "instructions",
    "files",
    "path",
    "content",
    "input_schema",
    "output_schema",
    "side_effects",
    "candidates",
    "name",
    "provider",
    "model_id",
    "parameters",
    "max_context_tokens",
    "fallback_on",
    "rules",
    "tool",
    "decision",
    "default_decision",
    "checks",
]
junk_structs: st.SearchStrategy[Any] = st.recursive(
    junk,
    lambda children: (
        st.dictionaries(st.sampled_from(ALL_MEMBERS), children, max_size=4)
        | st.lists(children, max_size=3)
    ),
    max_leaves=12,
)


def only_canonical_errors(fn: Callable[[], object]) -> None:
    try:
        fn()
    except CanonicalError as e:
        assert isinstance(e.field, str) and e.reason
        assert type(e) is CanonicalError


@given(
    st.sampled_from([*ComponentKind, "AGENT", 3]),
    st.one_of(names, st.just(""), junk),
    st.one_of(versions, st.just(""), junk),
    st.one_of(texts, junk),
    junk_structs,
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_input_either_digests_or_raises_canonical_error(
    kind: Any, name: Any, version: Any, description: Any, spec: Any
) -> None:
    only_canonical_errors(lambda: component_digest(kind, name, version, description, spec))
    only_canonical_errors(lambda: tool_digests(name, version, description, spec))
    only_canonical_errors(lambda: canonical_bytes(spec))
    only_canonical_errors(lambda: schema_digest(spec))


ENTRY_MEMBERS = [
    "name",
    "version",
    "digest",
    "schema_digest",
    "system_prompt",
    "model_policy",
    "skills",
    "tools",
    "permission_policy",
    "completion_policy",
]
entry_values = st.one_of(names, st.sampled_from([D1, "1", "1.0.0", "", None]), junk)
junk_closures: st.SearchStrategy[Any] = st.recursive(
    entry_values,
    lambda children: (
        st.dictionaries(st.sampled_from(ENTRY_MEMBERS), children, max_size=5)
        | st.lists(children, max_size=3)
    ),
    max_leaves=16,
)


labels = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,15}", fullmatch=True)


@given(
    st.one_of(names, junk),
    st.one_of(labels, versions, junk),
    st.one_of(texts, junk),
    junk_closures,
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_closure_either_digests_or_raises_canonical_error(
    agent_id: Any, version_label: Any, description: Any, data: Any
) -> None:
    only_canonical_errors(
        lambda: agent_digest(agent_id, version_label, description, AgentClosure.from_mapping(data))
    )
