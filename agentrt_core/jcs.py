"""The canonical JSON layer: RFC 8785 bytes of a JSON object, and ``sha256:`` digests.

A digest is ``sha256:<64 lowercase hex>`` of the RFC 8785 (JSON Canonicalization Scheme, JCS)
serialisation of a JSON object. This module knows nothing of registry objects: it refuses the
values two implementations could disagree on (integers a double cannot hold, NaN, lone
surrogates, non-string keys) and serialises the rest, through the standard library's C encoder
where that is byte-identical to JCS and through ``rfc8785`` otherwise. Events, blobs and the
bound-definition document use it directly; :mod:`agentrt_core.specs` and
:mod:`agentrt_core.canonical` build the registry's documents on top of it. The rules are
written out, with test vectors, in ``docs/digest.md``.

The names not in ``__all__`` (:func:`fast_copy`, :func:`careful_copy`, :class:`Unusual`,
:func:`key_path`, :func:`check_text`, :func:`utf16_key`, ...) are for those two modules, which
check free-form JSON the same way while normalising a spec; nothing outside
``agentrt_core`` should need them.

The module is pure: no I/O, no storage, no protobuf.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import rfc8785

__all__ = [
    "MAX_SAFE_INTEGER",
    "CanonicalError",
    "canonical_bytes",
    "digest_bytes",
    "digest_document",
    "schema_digest",
]

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""The largest integer an IEEE-754 double holds exactly (ECMAScript ``Number.MAX_SAFE_INTEGER``)."""

_PLAIN_KEY_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
        raise CanonicalError(path, f"must be a JSON object, not {type_name(document)}")
    try:
        return _fast_jcs(document)
    except Unusual:
        pass
    except RecursionError:
        raise CanonicalError(path, TOO_DEEP) from None
    # The reference path: check everything with locations, then let the library serialise.
    checked = careful_copy(document, path)
    try:
        return rfc8785.dumps(checked)
    except rfc8785.CanonicalizationError as e:  # pragma: no cover - _json_value refuses first
        raise CanonicalError(path, str(e)) from e


def digest_document(document: Mapping[str, Any]) -> str:
    """Return the digest of a JSON object: SHA-256 of its JCS bytes.

    Args:
        document: A JSON object (normally from :func:`agentrt_core.canonical.component_document`
            or :func:`agentrt_core.canonical.agent_document`).

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


def type_name(value: object) -> str:
    return type(value).__name__


def key_path(path: str, key: str) -> str:
    if _PLAIN_KEY_RE.fullmatch(key):
        return f"{path}.{key}" if path else key
    # Keys with dots, spaces or quotes would make a dotted path ambiguous.
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'{path}["{escaped}"]'


def check_text(s: str, path: str) -> None:
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


class Unusual(Exception):
    """Raised by the fast path for anything it does not handle; the reference path takes over."""


JSON_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)


def _fast_jcs(document: Mapping[str, Any]) -> bytes:
    """Serialise with the standard library's C encoder, where that is byte-identical to JCS.

    ``rfc8785.dumps`` is pure Python and takes 20-250 ms per megabyte; the registry digests
    every definition it publishes or is asked about, so the common case goes through
    :func:`json.dumps` instead. That is exact, not approximately right, because
    :func:`fast_copy` only lets through what both serialise identically:

    * strings: with ``ensure_ascii=False`` the C encoder escapes exactly what RFC 8785
      §3.2.2.2 escapes (``"``, ``\\``, ``\\b \\f \\n \\r \\t``, other controls as lowercase
      ``\\u00hh``) and writes all else as UTF-8 (lone surrogates are refused by the copy);
    * integers within ±(2**53 - 1) and integral floats in that range (turned into ints) are
      written as plain digits, as ECMAScript's Number.toString does;
    * other floats only with 1e-4 <= |x| < 2**52, where Python's ``repr`` (shortest
      round-trip digits, positional notation) and ECMAScript agree;
    * object members in the UTF-16 order of JCS §3.2.3, built by the copy, not by the encoder.

    Anything else (tiny or huge floats, non-dict mappings, subclasses, bad values) raises
    :class:`Unusual` and the caller uses the library. A property test checks both paths
    produce the same bytes.
    """
    copy = fast_copy(document)
    try:
        return JSON_ENCODER.encode(copy).encode("utf-8")
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        raise Unusual from None


def fast_copy(value: Any) -> Any:
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
        raise Unusual
    if t is float:
        if v.is_integer() and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return int(v)
        if 1e-4 <= abs(v) < 2.0**52:  # false for NaN and infinities
            return v
    raise Unusual


def _fast_text(s: str) -> None:
    try:
        s.encode("utf-8")  # faster than a regex search for surrogates
    except UnicodeEncodeError:
        raise Unusual from None


def _fast_dict(d: dict[Any, Any]) -> dict[str, Any]:
    try:
        keys = sorted(d)
        # join() also proves every key is a str (it raises TypeError otherwise).
        ascii_keys = "".join(keys).isascii()
    except TypeError:
        raise Unusual from None
    if not ascii_keys:
        for k in keys:
            _fast_text(k)
        keys = sorted(keys, key=utf16_key)
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


TOO_DEEP: Final = "is nested too deeply (or contains itself)"


def careful_copy(value: object, path: str) -> Any:
    try:
        return _json_value(value, path)
    except RecursionError:
        raise CanonicalError(path, TOO_DEEP) from None


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
        check_text(value, path)
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
            child = key_path(path, key)
            check_text(key, child)
            out[key] = _json_value(item, child)
        return out
    if isinstance(value, list | tuple):
        return [_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise CanonicalError(path, f"{type_name(value)} is not a JSON value")


def utf16_key(s: str) -> bytes:
    # Sets are sorted like JCS sorts object keys (by UTF-16 code units), so one ordering rule
    # covers the whole document. Big-endian UTF-16 bytes sort exactly as code units do.
    return s.encode("utf-16-be")
