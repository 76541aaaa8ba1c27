"""Canonical form and content digests of registry objects.

A digest is ``sha256:<64 lowercase hex>`` of the RFC 8785 (JSON Canonicalization Scheme, JCS)
serialisation of a *normalised document*. Normalisation is what this module adds on top of JCS:
it decides which inputs mean the same thing (absent and default members, the order of lists
that are sets) so that they hash the same, and it refuses inputs whose meaning two
implementations could disagree on (unknown members, integers a double cannot hold, NaN, lone
surrogates). The rules are written out, with test vectors, in ``docs/digest.md``; this module
is their reference implementation and must stay in step with that file.

The module is pure: no I/O, no storage, no protobuf. Callers turn protobuf messages into plain
JSON-like mappings (field names in lower_snake case, enum values as bare upper-case names
without their prefix) before calling it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import rfc8785

from agentrt_core.refs import DIGEST_RE, is_digest, is_valid_label, is_valid_name, is_valid_version

__all__ = [
    "AGENT_DOCUMENT_TYPE",
    "COMPLETION_CONDITIONS",
    "COMPONENT_DOCUMENT_TYPE",
    "DECISIONS",
    "DIGEST_RE",
    "MAX_SAFE_INTEGER",
    "AgentClosure",
    "CanonicalError",
    "ComponentKind",
    "ResolvedEntry",
    "agent_digest",
    "agent_document",
    "canonical_bytes",
    "component_digest",
    "component_document",
    "digest_bytes",
    "digest_document",
    "is_digest",
    "normalise_spec",
    "schema_digest",
    "tool_digests",
]

COMPONENT_DOCUMENT_TYPE: Final = "agentrt.component.v1"
"""The ``type`` member of a component document (bumped if the rules ever change)."""
AGENT_DOCUMENT_TYPE: Final = "agentrt.agent.v1"
"""The ``type`` member of an agent document."""
MAX_SAFE_INTEGER: Final = 2**53 - 1
"""The largest integer an IEEE-754 double holds exactly (ECMAScript ``Number.MAX_SAFE_INTEGER``)."""
DECISIONS: Final = frozenset({"ALLOW", "REQUIRE_APPROVAL", "DENY"})
#: A completion check the runtime evaluates from the ledger (absent: the worker attests it).
COMPLETION_CONDITIONS: Final = frozenset(
    {"ARTIFACT_EXISTS", "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", "NO_OPEN_STEPS"}
)
"""The permission decisions a rule or a policy default may name."""

# The proto enum's zero value, spelled without its prefix. It means "not set", so a default
# that says UNSPECIFIED is the same as no default at all.
_UNSPECIFIED: Final = "UNSPECIFIED"
_ENUM_VALUE_RE: Final = re.compile(r"[A-Z][A-Z0-9_]*")
_PLAIN_KEY_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ComponentKind(StrEnum):
    """The kinds of registry component; the value is what appears in the document."""

    PROMPT = "PROMPT"
    SKILL = "SKILL"
    TOOL = "TOOL"
    MODEL_POLICY = "MODEL_POLICY"
    PERMISSION_POLICY = "PERMISSION_POLICY"
    COMPLETION_POLICY = "COMPLETION_POLICY"


class CanonicalError(ValueError):
    """An input that has no canonical form.

    Attributes:
        field: Where the problem is, as a path such as ``spec.input_schema.properties.x.maximum``
            or ``spec.files[2].path`` (suitable for ``BadRequest.FieldViolation.field``).
        reason: What is wrong, without the path.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Bytes and digests
# --------------------------------------------------------------------------------------------


def digest_bytes(data: bytes) -> str:
    """Return the digest of ``data``: ``sha256:`` and the lowercase hex SHA-256."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_bytes(document: Mapping[str, Any], *, path: str = "") -> bytes:
    """Return the RFC 8785 (JCS) serialisation of a JSON object.

    Args:
        document: A JSON object made of mappings with string keys, lists or tuples, strings,
            booleans, ``None``, ints and floats.
        path: A prefix for the ``field`` of errors (e.g. ``"schema"``).

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        CanonicalError: ``document`` is not a JSON object, or holds a value JCS cannot
            represent faithfully (see :func:`_json_value`); ``field`` names the member.
    """
    if not isinstance(document, Mapping):
        raise CanonicalError(path, f"must be a JSON object, not {_type_name(document)}")
    try:
        return _fast_jcs(document)
    except _Unusual:
        pass
    except RecursionError:
        raise CanonicalError(path, _TOO_DEEP) from None
    # The reference path: check everything with locations, then let the library serialise.
    checked = _careful_copy(document, path)
    try:
        return rfc8785.dumps(checked)
    except rfc8785.CanonicalizationError as e:  # pragma: no cover - _json_value refuses first
        raise CanonicalError(path, str(e)) from e


def digest_document(document: Mapping[str, Any]) -> str:
    """Return the digest of a JSON object: SHA-256 of its JCS bytes.

    Args:
        document: A JSON object (normally from :func:`component_document` or
            :func:`agent_document`).

    Raises:
        CanonicalError: See :func:`canonical_bytes`.
    """
    return digest_bytes(canonical_bytes(document))


def schema_digest(schema: Mapping[str, Any]) -> str:
    """Return the digest of a tool's input JSON Schema on its own.

    The schema is hashed as given (JCS only, nothing omitted): in JSON Schema an empty ``{}``
    or a ``false`` is meaningful. A tool's ``schema_digest`` therefore stays the same across
    tool versions that change only the description, which is what audits by schema want.

    Raises:
        CanonicalError: ``schema`` is not a JSON object or holds an unrepresentable value;
            ``field`` starts with ``schema``.
    """
    return digest_bytes(canonical_bytes(schema, path="schema"))


# --------------------------------------------------------------------------------------------
# Free-form JSON values
# --------------------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return type(value).__name__


def _key_path(path: str, key: str) -> str:
    if _PLAIN_KEY_RE.fullmatch(key):
        return f"{path}.{key}" if path else key
    # Keys with dots, spaces or quotes would make a dotted path ambiguous.
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'{path}["{escaped}"]'


def _check_text(s: str, path: str) -> None:
    # Python strings hold code points, so a correctly paired non-BMP character is one code
    # point; anything in D800-DFFF is a lone surrogate, which has no UTF-8 form and which
    # JCS implementations handle inconsistently (RFC 8785 §3.2.2.2 asks to reject it).
    if not s.isascii():
        try:
            s.encode("utf-8")  # a few times faster than a regex search for D800-DFFF
        except UnicodeEncodeError:
            raise CanonicalError(
                path, "contains a lone UTF-16 surrogate (not valid Unicode text)"
            ) from None


class _Unusual(Exception):
    """Raised by the fast path for anything it does not handle; the reference path takes over."""


_JSON_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)


def _fast_jcs(document: Mapping[str, Any]) -> bytes:
    """Serialise with the standard library's C encoder, where that is byte-identical to JCS.

    ``rfc8785.dumps`` is pure Python and takes 20-250 ms per megabyte; the registry digests
    every definition it publishes or is asked about, so the common case goes through
    :func:`json.dumps` instead. That is exact, not approximately right, because
    :func:`_fast_copy` only lets through what both serialise identically:

    * strings: with ``ensure_ascii=False`` the C encoder escapes exactly what RFC 8785
      §3.2.2.2 escapes (``"``, ``\\``, ``\\b \\f \\n \\r \\t``, other controls as lowercase
      ``\\u00hh``) and writes all else as UTF-8 (lone surrogates are refused by the copy);
    * integers within ±(2**53 - 1) and integral floats in that range (turned into ints) are
      written as plain digits, as ECMAScript's Number.toString does;
    * other floats only with 1e-4 <= |x| < 2**52, where Python's ``repr`` (shortest
      round-trip digits, positional notation) and ECMAScript agree;
    * object members in the UTF-16 order of JCS §3.2.3, built by the copy, not by the encoder.

    Anything else (tiny or huge floats, non-dict mappings, subclasses, bad values) raises
    :class:`_Unusual` and the caller uses the library. A property test checks both paths
    produce the same bytes.
    """
    copy = _fast_copy(document)
    try:
        return _JSON_ENCODER.encode(copy).encode("utf-8")
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        raise _Unusual from None


def _fast_copy(value: Any) -> Any:
    t = type(value)
    if t is dict:
        return _fast_dict(value)
    if t is list or t is tuple:
        return _fast_list(value)
    return _fast_leaf(value)


# The walk below is the hot loop of digesting: one call per container, common leaves handled
# inline, parameters typed Any (the input is untyped JSON, and cast() would be a call per
# value). Exact type checks, not isinstance: subclasses (str enums, OrderedDict, numpy
# scalars) may serialise differently, so they take the reference path.


def _fast_leaf(v: Any) -> Any:
    t = type(v)
    if t is str:
        if not v.isascii():
            _fast_text(v)
        return v
    if t is bool or v is None:
        return v
    if t is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return v
        raise _Unusual
    if t is float:
        if v.is_integer() and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return int(v)
        if 1e-4 <= abs(v) < 2.0**52:  # false for NaN and infinities
            return v
    raise _Unusual


def _fast_text(s: str) -> None:
    try:
        s.encode("utf-8")  # faster than a regex search for surrogates
    except UnicodeEncodeError:
        raise _Unusual from None


def _fast_dict(d: dict[Any, Any]) -> dict[str, Any]:
    try:
        keys = sorted(d)
        # join() also proves every key is a str (it raises TypeError otherwise).
        ascii_keys = "".join(keys).isascii()
    except TypeError:
        raise _Unusual from None
    if not ascii_keys:
        for k in keys:
            _fast_text(k)
        keys = sorted(keys, key=_utf16_key)
    out: dict[str, Any] = {}
    for k in keys:
        v = d[k]
        t = type(v)
        if (t is str and v.isascii()) or (t is int and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER):
            out[k] = v
        elif t is dict:
            out[k] = _fast_dict(v)
        elif t is list:
            out[k] = _fast_list(v)
        else:
            out[k] = _fast_leaf(v)
    return out


def _fast_list(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in items:
        t = type(v)
        if (t is str and v.isascii()) or (t is int and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER):
            out.append(v)
        elif t is dict:
            out.append(_fast_dict(v))
        elif t is list:
            out.append(_fast_list(v))
        else:
            out.append(_fast_leaf(v))
    return out


_TOO_DEEP: Final = "is nested too deeply (or contains itself)"


def _careful_copy(value: object, path: str) -> Any:
    try:
        return _json_value(value, path)
    except RecursionError:
        raise CanonicalError(path, _TOO_DEEP) from None


def _json_value(value: object, path: str) -> Any:
    """Check a free-form JSON value and return a plain-Python copy of it.

    Refused, so that every implementation agrees on the value being hashed:
    integers beyond ±(2**53 - 1) (a double cannot hold them, so JSON parsers that use doubles
    would hash a different number); NaN and infinities (no JSON form); strings or keys with
    lone surrogates; non-string keys; any other Python type.
    """
    # bool first: it is a subclass of int.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        _check_text(value, path)
        return str.__str__(value)  # the text itself, even if a subclass overrides __str__
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalError(
                path,
                f"integer {value} is outside ±(2**53 - 1); a JSON number is an IEEE-754 "
                "double, which cannot hold it exactly (send it as a string)",
            )
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalError(path, f"{value} is not a JSON number")
        return float(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError(path, f"object key {key!r} is not a string")
            child = _key_path(path, key)
            _check_text(key, child)
            out[key] = _json_value(item, child)
        return out
    if isinstance(value, list | tuple):
        return [_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise CanonicalError(path, f"{_type_name(value)} is not a JSON value")


# --------------------------------------------------------------------------------------------
# Spec structures: typed members, defaults omitted
# --------------------------------------------------------------------------------------------


def _utf16_key(s: str) -> bytes:
    # Sets are sorted like JCS sorts object keys (by UTF-16 code units), so one ordering rule
    # covers the whole document. Big-endian UTF-16 bytes sort exactly as code units do.
    return s.encode("utf-16-be")


class _Struct:
    """Reads the members of one spec structure, refusing members it was not told about."""

    def __init__(self, value: object, path: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(value, Mapping):
            raise CanonicalError(path, f"must be an object, not {_type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError(path, f"member name {key!r} is not a string")
            if key not in allowed:
                raise CanonicalError(
                    _key_path(path, key),
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
        return _key_path(self.path, key)

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
            raise CanonicalError(self.at(key), f"must be a string, not {_type_name(value)}")
        if required and not value:
            raise CanonicalError(self.at(key), "is required and must not be empty")
        _check_text(value, self.at(key))
        self.put(key, value)
        return value

    def boolean(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            value = False
        if not isinstance(value, bool):
            raise CanonicalError(self.at(key), f"must be a boolean, not {_type_name(value)}")
        self.put(key, value)

    def count(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            value = 0
        # An integral float is accepted: in JSON, and so in JCS, 8192.0 is the number 8192.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CanonicalError(self.at(key), f"must be an integer, not {_type_name(value)}")
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
            raise CanonicalError(self.at(key), f"must be a JSON object, not {_type_name(value)}")
        # Free-form JSON is kept verbatim, even when empty: `{}` is a meaningful schema.
        try:
            self.out[key] = _fast_copy(value)
        except _Unusual:
            self.out[key] = _careful_copy(value, self.at(key))
            self.fast = False
        except RecursionError:
            raise CanonicalError(self.at(key), _TOO_DEEP) from None

    def items(self, key: str) -> list[tuple[str, object]]:
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise CanonicalError(self.at(key), f"must be a list, not {_type_name(value)}")
        return [(f"{self.at(key)}[{i}]", item) for i, item in enumerate(value)]


def _check_enum(value: object, path: str, allowed: frozenset[str] | None) -> str:
    if not isinstance(value, str):
        raise CanonicalError(path, f"must be an enum value name, not {_type_name(value)}")
    if value == _UNSPECIFIED:
        raise CanonicalError(path, "UNSPECIFIED is not allowed here; name a value")
    if allowed is not None and value not in allowed:
        raise CanonicalError(path, f"{value!r} is not one of {', '.join(sorted(allowed))}")
    if not _ENUM_VALUE_RE.fullmatch(value):
        raise CanonicalError(
            path, f"{value!r} is not an enum value name (bare UPPER_CASE, without prefix)"
        )
    return value


def _keyed_set(
    items: list[dict[str, Any]], paths: list[str], key: str, what: str
) -> list[dict[str, Any]]:
    """Sort a list that is a set keyed by ``key``; a repeated key is an error, not a merge."""
    seen: dict[str, str] = {}
    for item, path in zip(items, paths, strict=True):
        k = item[key]
        if k in seen:
            raise CanonicalError(f"{path}.{key}", f"duplicate {what} {k!r} (also at {seen[k]})")
        seen[k] = path
    return sorted(items, key=lambda item: _utf16_key(item[key]))


def _prompt_spec(s: _Struct) -> None:
    s.string("text")


def _skill_spec(s: _Struct) -> None:
    s.string("description")
    s.string("instructions")
    files, paths = [], []
    for path, value in s.items("files"):
        f = _Struct(value, path, ("path", "content"))
        f.string("path", required=True)
        f.string("content")
        files.append(f.result())
        paths.append(path)
    s.put("files", _keyed_set(files, paths, "path", "file path"))


def _tool_spec(s: _Struct) -> None:
    s.string("description")
    s.json_object("input_schema", required=True)
    s.json_object("output_schema")
    s.boolean("side_effects")


def _model_policy_spec(s: _Struct) -> None:
    candidates = []
    for path, value in s.items("candidates"):
        c = _Struct(
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
        c.put("fallback_on", sorted(reasons, key=_utf16_key))
        # Candidate order is significant (the first is the primary), so it is kept.
        candidates.append(c.result())
        s.fast = s.fast and c.fast
    s.put("candidates", candidates)


def _permission_policy_spec(s: _Struct) -> None:
    rules, paths = [], []
    for path, value in s.items("rules"):
        r = _Struct(value, path, ("tool", "decision"))
        r.string("tool", required=True)
        r.enum("decision", DECISIONS, required=True)
        rules.append(r.result())
        paths.append(path)
    s.put("rules", _keyed_set(rules, paths, "tool", "rule for tool"))
    s.enum("default_decision", DECISIONS, required=False)


def _completion_policy_spec(s: _Struct) -> None:
    checks, paths = [], []
    for path, value in s.items("checks"):
        c = _Struct(value, path, ("name", "description", "condition", "artifact_kind", "tool"))
        c.string("name", required=True)
        c.string("description")
        # Absent (a worker-attested check) in every document written before conditions
        # existed, so their digests do not change.
        c.enum("condition", COMPLETION_CONDITIONS, required=False)
        c.string("artifact_kind")
        c.string("tool")
        checks.append(c.result())
        paths.append(path)
    s.put("checks", _keyed_set(checks, paths, "name", "check name"))


_KINDS: Final = frozenset(k.value for k in ComponentKind)
_SPECS: Final[dict[ComponentKind, tuple[tuple[str, ...], Callable[[_Struct], None]]]] = {
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


def _kind(kind: object, path: str) -> ComponentKind:
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
    return _normalise_spec(_kind(kind, "kind"), spec)[0]


def _normalise_spec(kind: ComponentKind, spec: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    allowed, read = _SPECS[kind]
    s = _Struct(spec, "spec", allowed)
    read(s)
    return s.result(), s.fast


_NAME_GRAMMAR: Final = "1-64 of a-z 0-9 _ -, starting with a letter; 'sha256' is reserved"


def _check_string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise CanonicalError(path, f"must be a string, not {_type_name(value)}")
    # The text itself, even if a subclass (a str enum) would encode or compare differently.
    return str.__str__(value)


def _check_name(name: object, path: str) -> str:
    name = _check_string(name, path)
    if is_valid_name(name):
        return name
    raise CanonicalError(path, f"{name!r} is not a valid name ({_NAME_GRAMMAR})")


def _check_version(version: object, path: str) -> str:
    version = _check_string(version, path)
    if is_valid_version(version):
        return version
    raise CanonicalError(
        path,
        f"{version!r} is not a component version (semver 2.0.0 such as '2.1.0', or a positive "
        "integer such as '3')",
    )


def _check_description(description: object, path: str) -> str:
    description = _check_string(description, path)
    _check_text(description, path)
    return description


def component_document(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the normalised document whose digest is a component's digest.

    The shape is ``{"type": "agentrt.component.v1", "kind", "name", "version",
    "description", "spec"}``; ``description`` is always present (possibly ``""``). The version
    and description are content: a version label maps to exactly one digest forever and a
    digest to exactly one ``name@version``, so a digest read in an audit log says which version
    it was without a look-up, and storage keys each published version by its digest.

    An *anonymous* PROMPT (how an agent's inline system prompt is stored) has an empty name and
    an empty version; its document omits both members:
    ``{"type", "kind": "PROMPT", "description", "spec"}``.

    Args:
        kind: A :class:`ComponentKind` value such as ``"TOOL"``.
        name: The component name (name grammar of :mod:`agentrt_core.refs`), or ``""`` for an
            anonymous PROMPT.
        version: A component version (semver 2.0.0 or a positive integer), or ``""`` for an
            anonymous PROMPT.
        description: Free text, kept byte-exact; may be empty.
        spec: The kind's spec as a JSON-like mapping (see :func:`normalise_spec`).

    Returns:
        The normalised document, ready for :func:`digest_document`.

    Raises:
        CanonicalError: The kind, name, version, description or spec is invalid (an empty
            name or version except both on a PROMPT); ``field`` says where.
    """
    return _component_document(kind, name, version, description, spec)[0]


def _component_document(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> tuple[dict[str, Any], bool]:
    k = _kind(kind, "kind")
    name = _check_string(name, "name")
    version = _check_string(version, "version")
    anonymous = k is ComponentKind.PROMPT and name == "" and version == ""
    if not anonymous:
        if k is ComponentKind.PROMPT and (name == "" or version == ""):
            raise CanonicalError(
                "name" if name == "" else "version",
                "is empty, but the other is not: only an anonymous PROMPT has no name, and "
                "then no version either",
            )
        if name == "":
            raise CanonicalError(
                "name", f"is required (only a PROMPT may be anonymous, not a {k.value})"
            )
        _check_name(name, "name")
        _check_version(version, "version")
    description = _check_description(description, "description")
    normalised, fast = _normalise_spec(k, spec)
    # Members written in JCS order, so a fast document can be encoded as it is.
    doc: dict[str, Any] = {"description": description, "kind": k.value}
    if not anonymous:
        doc["name"] = name
    doc["spec"] = normalised
    doc["type"] = COMPONENT_DOCUMENT_TYPE
    if not anonymous:
        doc["version"] = version
    return doc, fast


def component_digest(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> str:
    """Return a component's digest (see :func:`component_document`).

    Prefer this to ``digest_document(component_document(...))``, which gives the same digest
    but checks the (possibly large) document a second time.

    Raises:
        CanonicalError: See :func:`component_document`.
    """
    doc, fast = _component_document(kind, name, version, description, spec)
    if fast:
        # Everything in `doc` was checked and ordered while normalising, so the encoder's
        # output is already the JCS form (see _fast_jcs for why that is exact).
        return digest_bytes(_JSON_ENCODER.encode(doc).encode("utf-8"))
    return digest_document(doc)


def tool_digests(
    name: str, version: str, description: str, spec: Mapping[str, Any]
) -> tuple[str, str]:
    """Return a TOOL's component digest and its input schema digest, normalising once.

    Equal to ``(component_digest("TOOL", name, version, description, spec),
    schema_digest(spec["input_schema"]))``; publishing needs both, and a large schema need not
    be checked twice.

    Raises:
        CanonicalError: See :func:`component_document`.
    """
    doc, fast = _component_document(ComponentKind.TOOL, name, version, description, spec)
    if not fast:
        return digest_document(doc), schema_digest(doc["spec"]["input_schema"])
    schema = doc["spec"]["input_schema"]
    return (
        digest_bytes(_JSON_ENCODER.encode(doc).encode("utf-8")),
        digest_bytes(_JSON_ENCODER.encode(schema).encode("utf-8")),
    )


# --------------------------------------------------------------------------------------------
# Agents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedEntry:
    """One component as an agent's closure resolved it.

    Attributes:
        kind: The component's kind.
        name: The component's name; ``""`` only for an inline system prompt (stored as an
            anonymous PROMPT component).
        version: The version it resolved to; ``None`` only for an inline system prompt.
        digest: The component's digest.
        schema_digest: For a TOOL, the digest of its input schema; ``None`` otherwise.
    """

    kind: ComponentKind
    name: str
    version: str | None
    digest: str
    schema_digest: str | None = None


@dataclass(frozen=True, slots=True)
class AgentClosure:
    """Every component an agent definition resolved to: its lock file.

    Skills and tools are sets (sorted by name in the document). The permission and
    completion policies may be absent; the members are then omitted from the document.
    """

    system_prompt: ResolvedEntry
    model_policy: ResolvedEntry
    skills: tuple[ResolvedEntry, ...] = ()
    tools: tuple[ResolvedEntry, ...] = ()
    permission_policy: ResolvedEntry | None = None
    completion_policy: ResolvedEntry | None = None

    def __post_init__(self) -> None:
        # Accept any sequence but store tuples, so the closure is immutable and hashable.
        object.__setattr__(self, "skills", tuple(self.skills))
        object.__setattr__(self, "tools", tuple(self.tools))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AgentClosure:
        """Build a closure from its JSON form (the agent document's members, as in vectors).

        Each entry is ``{"name", "version", "digest", "schema_digest"?}``, or ``{"digest"}``
        alone for an inline system prompt (name ``""``, version ``None``); its kind follows
        from where it sits.

        Raises:
            CanonicalError: A member is missing, unknown or of the wrong type.
        """
        s = _Struct(data, "closure", _SLOTS)

        def entry(value: object, path: str, kind: ComponentKind) -> ResolvedEntry:
            keys = ("name", "version", "digest", "schema_digest")
            e = _Struct(value, path, keys)
            got = {k: e.get(k) for k in keys}
            for k, v in got.items():
                if v is not None and not isinstance(v, str):
                    raise CanonicalError(e.at(k), f"must be a string, not {_type_name(v)}")
            return ResolvedEntry(
                kind,
                str(got["name"] or ""),
                None if got["version"] is None else str(got["version"]),
                str(got["digest"] or ""),
                None if got["schema_digest"] is None else str(got["schema_digest"]),
            )

        def one(slot: str, kind: ComponentKind) -> ResolvedEntry | None:
            value = s.get(slot)
            return None if value is None else entry(value, s.at(slot), kind)

        system_prompt = one("system_prompt", ComponentKind.PROMPT)
        model_policy = one("model_policy", ComponentKind.MODEL_POLICY)
        if system_prompt is None:
            raise CanonicalError("closure.system_prompt", "is required")
        if model_policy is None:
            raise CanonicalError("closure.model_policy", "is required")
        return cls(
            system_prompt=system_prompt,
            model_policy=model_policy,
            skills=tuple(entry(v, p, ComponentKind.SKILL) for p, v in s.items("skills")),
            tools=tuple(entry(v, p, ComponentKind.TOOL) for p, v in s.items("tools")),
            permission_policy=one("permission_policy", ComponentKind.PERMISSION_POLICY),
            completion_policy=one("completion_policy", ComponentKind.COMPLETION_POLICY),
        )


_SLOTS: Final = (
    "system_prompt",
    "model_policy",
    "skills",
    "tools",
    "permission_policy",
    "completion_policy",
)


def _entry(e: object, path: str, kind: ComponentKind) -> dict[str, Any]:
    if not isinstance(e, ResolvedEntry):
        raise CanonicalError(path, f"must be a ResolvedEntry, not {_type_name(e)}")
    if e.kind != kind:
        raise CanonicalError(f"{path}.kind", f"must be {kind.value}, not {e.kind!r}")
    out: dict[str, Any] = {}
    if kind is ComponentKind.PROMPT and e.name == "" and e.version is None:
        # An inline system prompt: an anonymous PROMPT, known by its digest alone. Any other
        # entry names a published version, so a missing name or version is an error rather
        # than a second spelling of the same closure.
        pass
    elif kind is ComponentKind.PROMPT and e.name == "":
        raise CanonicalError(
            f"{path}.name",
            "is empty: only an inline system prompt has an empty name, and it has no version "
            "(None)",
        )
    elif e.version is None:
        raise CanonicalError(
            f"{path}.version",
            "is required (only an inline system prompt, with an empty name, has none)",
        )
    else:
        out["name"] = _check_name(e.name, f"{path}.name")
        out["version"] = _check_version(e.version, f"{path}.version")
    if not isinstance(e.digest, str) or not is_digest(e.digest):
        raise CanonicalError(f"{path}.digest", f"{e.digest!r} is not a sha256 digest")
    out["digest"] = str.__str__(e.digest)
    if kind is ComponentKind.TOOL:
        if not isinstance(e.schema_digest, str) or not is_digest(e.schema_digest):
            raise CanonicalError(
                f"{path}.schema_digest", f"{e.schema_digest!r} is not a sha256 digest"
            )
        out["schema_digest"] = str.__str__(e.schema_digest)
    elif e.schema_digest is not None:
        raise CanonicalError(f"{path}.schema_digest", "only a TOOL entry has a schema digest")
    return out


def _entry_set(
    entries: Sequence[ResolvedEntry], path: str, kind: ComponentKind
) -> list[dict[str, Any]]:
    out = [_entry(e, f"{path}[{i}]", kind) for i, e in enumerate(entries)]
    paths = [f"{path}[{i}]" for i in range(len(out))]
    return _keyed_set(out, paths, "name", kind.value.lower() + " name")


def agent_document(
    agent_id: str, version_label: str, description: str, closure: AgentClosure
) -> dict[str, Any]:
    """Return the normalised document whose digest is an agent version's digest.

    The shape is ``{"type": "agentrt.agent.v1", "agent_id", "version_label", "description",
    "system_prompt", "model_policy", "skills", "tools", "permission_policy"?,
    "completion_policy"?}`` where each component is an entry ``{"name", "version", "digest"}``
    (tools add ``"schema_digest"``; an inline system prompt is ``{"digest"}`` alone). This is
    a Merkle tree: the agent digest covers the component digests, which cover the content.

    In the digest: the ``agent_id`` and the ``version_label``, so that a digest names exactly
    one ``agent_id@version_label`` (and a label one digest, forever). Not in it: what the
    definition *requested* (``^2.1``; only what it resolved to counts) and server metadata
    (publish time, publisher, provenance, tags).

    Args:
        agent_id: The agent's name.
        version_label: The agent version label such as ``agent_v7`` (tag grammar).
        description: Free text (kept byte-exact; may be empty).
        closure: What every reference resolved to.

    Returns:
        The normalised document, ready for :func:`digest_document`.

    Raises:
        CanonicalError: An invalid id, label, description or entry (kind, name, version,
            digest), or a skill or tool listed twice; ``field`` says where.
    """
    agent_id = _check_name(agent_id, "agent_id")
    label = _check_string(version_label, "version_label")
    if not is_valid_label(label):
        raise CanonicalError(
            "version_label",
            f"{label!r} is not a valid version label (1-128 of A-Z a-z 0-9 . _ -, not "
            "starting with '.' or '-', not 64 hex digits)",
        )
    description = _check_description(description, "description")
    if not isinstance(closure, AgentClosure):
        raise CanonicalError("closure", f"must be an AgentClosure, not {_type_name(closure)}")
    doc: dict[str, Any] = {
        "type": AGENT_DOCUMENT_TYPE,
        "agent_id": agent_id,
        "version_label": label,
        "description": description,
        "system_prompt": _entry(closure.system_prompt, "system_prompt", ComponentKind.PROMPT),
        "model_policy": _entry(closure.model_policy, "model_policy", ComponentKind.MODEL_POLICY),
        "skills": _entry_set(closure.skills, "skills", ComponentKind.SKILL),
        "tools": _entry_set(closure.tools, "tools", ComponentKind.TOOL),
    }
    if closure.permission_policy is not None:
        doc["permission_policy"] = _entry(
            closure.permission_policy, "permission_policy", ComponentKind.PERMISSION_POLICY
        )
    if closure.completion_policy is not None:
        doc["completion_policy"] = _entry(
            closure.completion_policy, "completion_policy", ComponentKind.COMPLETION_POLICY
        )
    return doc


def agent_digest(agent_id: str, version_label: str, description: str, closure: AgentClosure) -> str:
    """Return an agent version's digest (see :func:`agent_document`)."""
    return digest_document(agent_document(agent_id, version_label, description, closure))
