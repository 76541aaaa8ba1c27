"""The normalised spec of each kind of registry component: what a component document holds.

Normalisation decides which inputs mean the same thing, so that they hash the same: a member
with its default value is the same as an absent one (the proto3 rule), lists that are sets are
sorted (and a repeated key refused), and free-form JSON (schemas, model parameters) is kept
verbatim. It refuses members it does not know, so that a misspelt member is an error, not a
silently different digest. The rules are written out in ``docs/digest.md``; this module and
:mod:`agentrt_core.canonical` (the documents and digests) are their reference implementation.

:class:`Struct`, :func:`keyed_set`, :func:`parse_kind` and :func:`read_spec` are not in
``__all__``: :mod:`agentrt_core.canonical` reads an agent's closure with the same rules.

The module is pure: no I/O, no storage, no protobuf. Callers turn protobuf messages into plain
JSON-like mappings (field names in lower_snake case, enum values as bare upper-case names
without their prefix) before calling it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final

from agentrt_core.jcs import (
    MAX_SAFE_INTEGER,
    TOO_DEEP,
    CanonicalError,
    Unusual,
    careful_copy,
    check_text,
    fast_copy,
    key_path,
    type_name,
    utf16_key,
)

__all__ = [
    "COMPLETION_CONDITIONS",
    "DECISIONS",
    "ComponentKind",
    "normalise_spec",
]

DECISIONS: Final = frozenset({"ALLOW", "REQUIRE_APPROVAL", "DENY"})
"""The permission decisions a rule or a policy default may name."""
COMPLETION_CONDITIONS: Final = frozenset(
    {"ARTIFACT_EXISTS", "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", "NO_OPEN_STEPS"}
)
"""A completion check the runtime evaluates from the ledger (absent: the worker attests it)."""

# The proto enum's zero value, spelled without its prefix. It means "not set", so a default
# that says UNSPECIFIED is the same as no default at all.
_UNSPECIFIED: Final = "UNSPECIFIED"
_ENUM_VALUE_RE: Final = re.compile(r"[A-Z][A-Z0-9_]*")


class ComponentKind(StrEnum):
    """The kinds of registry component; the value is what appears in the document."""

    PROMPT = "PROMPT"
    SKILL = "SKILL"
    TOOL = "TOOL"
    MODEL_POLICY = "MODEL_POLICY"
    PERMISSION_POLICY = "PERMISSION_POLICY"
    COMPLETION_POLICY = "COMPLETION_POLICY"


class Struct:
    """Reads the members of one spec structure, refusing members it was not told about."""

    def __init__(self, value: object, path: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(value, Mapping):
            raise CanonicalError(path, f"must be an object, not {type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError(path, f"member name {key!r} is not a string")
            if key not in allowed:
                raise CanonicalError(
                    key_path(path, key),
                    f"unknown member (allowed here: {', '.join(allowed)})",
                )
        self.value: Mapping[str, object] = value
        self.path = path
        self.out: dict[str, Any] = {}
        # Whether every free-form value took the fast path, so the result can go straight to
        # the JSON encoder (see component_digest).
        self.fast = True

    def result(self) -> dict[str, Any]:
        """The normalised structure, members in JCS order (our member names are ASCII)."""
        return {k: self.out[k] for k in sorted(self.out)}

    def at(self, key: str) -> str:
        return key_path(self.path, key)

    def get(self, key: str) -> object:
        # null is treated as absent: protobuf has no null for a field, and JSON encoders
        # often write null for "not set".
        return self.value.get(key)

    def put(self, key: str, value: object) -> None:
        # The proto3 rule: a default value cannot be told apart from an absent one on the
        # wire, so it is not written at all.
        if value not in ("", 0, False, [], {}):
            self.out[key] = value

    def string(self, key: str, *, required: bool = False) -> str:
        value = self.get(key)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise CanonicalError(self.at(key), f"must be a string, not {type_name(value)}")
        if required and not value:
            raise CanonicalError(self.at(key), "is required and must not be empty")
        check_text(value, self.at(key))
        self.put(key, value)
        return value

    def boolean(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            value = False
        if not isinstance(value, bool):
            raise CanonicalError(self.at(key), f"must be a boolean, not {type_name(value)}")
        self.put(key, value)

    def count(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            value = 0
        # An integral float is accepted: in JSON, and so in JCS, 8192.0 is the number 8192.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CanonicalError(self.at(key), f"must be an integer, not {type_name(value)}")
        if not 0 <= value <= MAX_SAFE_INTEGER:
            raise CanonicalError(self.at(key), f"must be between 0 and 2**53 - 1, not {value}")
        self.put(key, value)

    def enum(self, key: str, allowed: frozenset[str] | None, *, required: bool) -> None:
        value = self.get(key)
        if value is None or value == _UNSPECIFIED:
            if required:
                raise CanonicalError(self.at(key), "is required")
            return
        _check_enum(value, self.at(key), allowed)
        self.out[key] = value

    def json_object(self, key: str, *, required: bool = False) -> None:
        value = self.get(key)
        if value is None:
            if required:
                raise CanonicalError(self.at(key), "is required")
            return
        if not isinstance(value, Mapping):
            raise CanonicalError(self.at(key), f"must be a JSON object, not {type_name(value)}")
        # Free-form JSON is kept verbatim, even when empty: `{}` is a meaningful schema.
        try:
            self.out[key] = fast_copy(value)
        except Unusual:
            self.out[key] = careful_copy(value, self.at(key))
            self.fast = False
        except RecursionError:
            raise CanonicalError(self.at(key), TOO_DEEP) from None

    def items(self, key: str) -> list[tuple[str, object]]:
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise CanonicalError(self.at(key), f"must be a list, not {type_name(value)}")
        return [(f"{self.at(key)}[{i}]", item) for i, item in enumerate(value)]


def _check_enum(value: object, path: str, allowed: frozenset[str] | None) -> str:
    if not isinstance(value, str):
        raise CanonicalError(path, f"must be an enum value name, not {type_name(value)}")
    if value == _UNSPECIFIED:
        raise CanonicalError(path, "UNSPECIFIED is not allowed here; name a value")
    if allowed is not None and value not in allowed:
        raise CanonicalError(path, f"{value!r} is not one of {', '.join(sorted(allowed))}")
    if not _ENUM_VALUE_RE.fullmatch(value):
        raise CanonicalError(
            path, f"{value!r} is not an enum value name (bare UPPER_CASE, without prefix)"
        )
    return value


def keyed_set(
    items: list[dict[str, Any]], paths: list[str], key: str, what: str
) -> list[dict[str, Any]]:
    """Sort a list that is a set keyed by ``key``; a repeated key is an error, not a merge."""
    seen: dict[str, str] = {}
    for item, path in zip(items, paths, strict=True):
        k = item[key]
        if k in seen:
            raise CanonicalError(f"{path}.{key}", f"duplicate {what} {k!r} (also at {seen[k]})")
        seen[k] = path
    return sorted(items, key=lambda item: utf16_key(item[key]))


def _prompt_spec(s: Struct) -> None:
    s.string("text")


def _skill_spec(s: Struct) -> None:
    s.string("description")
    s.string("instructions")
    files, paths = [], []
    for path, value in s.items("files"):
        f = Struct(value, path, ("path", "content"))
        f.string("path", required=True)
        f.string("content")
        files.append(f.result())
        paths.append(path)
    s.put("files", keyed_set(files, paths, "path", "file path"))


def _tool_spec(s: Struct) -> None:
    s.string("description")
    s.json_object("input_schema", required=True)
    s.json_object("output_schema")
    s.boolean("side_effects")


def _model_policy_spec(s: Struct) -> None:
    candidates = []
    for path, value in s.items("candidates"):
        c = Struct(
            value,
            path,
            ("name", "provider", "model_id", "parameters", "max_context_tokens", "fallback_on"),
        )
        c.string("name")
        c.string("provider")
        c.string("model_id")
        c.json_object("parameters")
        c.count("max_context_tokens")
        # A set of conditions: order and repetition carry no meaning.
        reasons = {_check_enum(v, p, None) for p, v in c.items("fallback_on")}
        c.put("fallback_on", sorted(reasons, key=utf16_key))
        # Candidate order is significant (the first is the primary), so it is kept.
        candidates.append(c.result())
        s.fast = s.fast and c.fast
    s.put("candidates", candidates)


def _permission_policy_spec(s: Struct) -> None:
    rules, paths = [], []
    for path, value in s.items("rules"):
        r = Struct(value, path, ("tool", "decision"))
        r.string("tool", required=True)
        r.enum("decision", DECISIONS, required=True)
        rules.append(r.result())
        paths.append(path)
    s.put("rules", keyed_set(rules, paths, "tool", "rule for tool"))
    s.enum("default_decision", DECISIONS, required=False)


def _completion_policy_spec(s: Struct) -> None:
    checks, paths = [], []
    for path, value in s.items("checks"):
        c = Struct(value, path, ("name", "description", "condition", "artifact_kind", "tool"))
        c.string("name", required=True)
        c.string("description")
        # Absent (a worker-attested check) in every document written before conditions
        # existed, so their digests do not change.
        c.enum("condition", COMPLETION_CONDITIONS, required=False)
        c.string("artifact_kind")
        c.string("tool")
        checks.append(c.result())
        paths.append(path)
    s.put("checks", keyed_set(checks, paths, "name", "check name"))


_KINDS: Final = frozenset(k.value for k in ComponentKind)
_SPECS: Final[dict[ComponentKind, tuple[tuple[str, ...], Callable[[Struct], None]]]] = {
    ComponentKind.PROMPT: (("text",), _prompt_spec),
    ComponentKind.SKILL: (("description", "instructions", "files"), _skill_spec),
    ComponentKind.TOOL: (
        ("description", "input_schema", "output_schema", "side_effects"),
        _tool_spec,
    ),
    ComponentKind.MODEL_POLICY: (("candidates",), _model_policy_spec),
    ComponentKind.PERMISSION_POLICY: (("rules", "default_decision"), _permission_policy_spec),
    ComponentKind.COMPLETION_POLICY: (("checks",), _completion_policy_spec),
}


def parse_kind(kind: object, path: str) -> ComponentKind:
    if isinstance(kind, str) and kind in _KINDS:
        return ComponentKind(kind)
    raise CanonicalError(path, f"{kind!r} is not a component kind ({', '.join(ComponentKind)})")


def normalise_spec(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Return the normalised spec of a component (what its document holds under ``spec``).

    Args:
        kind: A :class:`ComponentKind` value.
        spec: The component's spec as a JSON-like mapping.

    Returns:
        A new dict: default-valued members omitted, sets sorted, free-form JSON copied.

    Raises:
        CanonicalError: Unknown kind or member, wrong type, missing required member,
            duplicate set key, or an unrepresentable JSON value.
    """
    return read_spec(parse_kind(kind, "kind"), spec)[0]


def read_spec(kind: ComponentKind, spec: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Return the normalised spec and whether every free-form value in it took the fast path.

    When it did, the document built around the spec can go straight to
    :data:`agentrt_core.jcs.JSON_ENCODER` (see :func:`agentrt_core.canonical.component_digest`).
    """
    allowed, read = _SPECS[kind]
    s = Struct(spec, "spec", allowed)
    read(s)
    return s.result(), s.fast
