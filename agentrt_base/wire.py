"""Every request, checked once before any domain code sees it.

A caller's bytes reach agentrt's code in one place: the deserializer of each RPC, which the
error-mapping interceptor (:mod:`agentrt_base.grpc_errors`) replaces with
:func:`guard_deserializer`, and then :func:`check_request`. Together they close whole classes
of hostile input, not one field at a time:

- bytes that are not the request message (invalid UTF-8 in a string, a truncated field, a
  message nested deeper than protobuf's decoding limit of 100): ``INVALID_ARGUMENT`` naming
  the field where it can be found (gRPC itself would answer ``UNKNOWN``);
- a NUL character in any string: PostgreSQL's ``text`` and ``jsonb`` cannot store it, so
  it would fail on one engine and not the other;
- a non-finite ``double`` (NaN, ±Infinity), including every number inside a
  ``google.protobuf.Struct``: JSON (and so digests, events and ``jsonb``) has no such value;
- a ``Timestamp`` or ``Duration`` outside the range its own definition allows
  (``google/protobuf/timestamp.proto``: 0001-01-01 to 9999-12-31, nanos in [0, 1e9);
  ``duration.proto``: ±10,000 years, nanos of the same sign), which Python cannot convert.

Field-specific rules (a size, a required field, a domain limit) stay with the domain code
that owns them; this module holds only what is true of every field of its type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from agentrt_core import reasons
from agentrt_core.errors import FieldViolation, InvalidArgument

#: ``google/protobuf/timestamp.proto``: "Range is from 0001-01-01T00:00:00Z to
#: 9999-12-31T23:59:59.999999999Z".
TIMESTAMP_MIN_SECONDS = -62_135_596_800
TIMESTAMP_MAX_SECONDS = 253_402_300_799
#: ``google/protobuf/duration.proto``: "approximately +-10,000 years".
DURATION_MAX_SECONDS = 315_576_000_000
_NANOS = 1_000_000_000
#: Violations reported for one request: enough to fix a request in one round trip, not a
#: message the size of a hostile request.
_MAX_REPORTED = 20


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the guarded deserializer returns for bytes that are not the request message;
    the interceptor answers it before any handler runs."""

    type_name: str
    reason: str
    field: str

    def error(self) -> InvalidArgument:
        where = f" (at {self.field})" if self.field else ""
        violation = FieldViolation(self.field or "(request)", self.reason)
        return InvalidArgument(
            f"the request is not a valid {self.type_name}: {self.reason}{where}",
            [violation],
            reason=reasons.MALFORMED_REQUEST,
        )


def guard_deserializer(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """Wrap an RPC's request deserializer so that undecodable bytes become an
    :class:`Undecodable` value instead of an exception inside gRPC (answered ``UNKNOWN``)."""
    message_class = getattr(deserializer, "__self__", None)
    descriptor: Descriptor | None = getattr(message_class, "DESCRIPTOR", None)
    type_name = descriptor.full_name if descriptor is not None else "request"

    def deserialize(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or anything a hostile body can provoke
            reason, field = _diagnose(descriptor, data) if descriptor else ("", "")
            return Undecodable(type_name, reason or _short(exc), field)

    return deserialize


def _short(exc: Exception) -> str:
    text = str(exc)
    return text.rsplit(": ", 1)[-1] if ": " in text else text or type(exc).__name__


def check_request(message: Any) -> None:
    """Raise ``INVALID_ARGUMENT`` naming every field whose value no field of its type may
    hold (see the module docstring); return quietly otherwise."""
    if type(message) is Undecodable:
        raise message.error()
    if _valid(message):
        return
    # Rare: walk again, slowly, to name every bad field.
    problems: list[FieldViolation] = []
    _walk(message, "", problems)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidArgument(
            f"invalid request: {first.field}: {first.description}{more}",
            problems,
            reason=reasons.INVALID_FIELD_VALUE,
        )


# -- the fast check ------------------------------------------------------------------------
#
# Every call passes through here, BeginStep and EndStep included, so the common answer
# ("nothing wrong") is a compiled closure per message type that reads only the fields that
# can hold something to refuse and builds no field path. Measured on this machine while it
# was loaded (everything ~3x slower than idle): a generic walk over ListFields() cost 47 us
# for an EndStep and 103 us for a tool-call BeginStep with a small Struct; the closures 5.5
# and 24 us.

_Check = Callable[[Any], bool]
#: The string rule, in one place: PostgreSQL's text and jsonb cannot hold NUL. A C-level
#: search, as cheap as ``in``, callable where a closure needs a function.
_find_nul = re.compile("\x00").search
_CHECKS: dict[str, _Check | None] = {}


def _valid(message: Any) -> bool:
    check = _checker(message.DESCRIPTOR)
    return check is None or check(message)


def _checker(descriptor: Descriptor) -> _Check | None:
    """The check for one message type (None: no field at any depth can be wrong)."""
    name = descriptor.full_name
    if name in _CHECKS:
        return _CHECKS[name]
    if name in _STRUCT_CHECKS:
        return _STRUCT_CHECKS[name]
    plan = _plan(descriptor)
    if plan is None:
        _CHECKS[name] = None
        return None

    def forward(message: Any) -> bool:
        check = _CHECKS[name]
        return check is None or check(message)

    # A recursive type sees the forwarding check while its own is being built.
    _CHECKS[name] = forward
    parts = [_field_check(fd, kind) for fd, kind in plan.items()]

    def check_message(message: Any) -> bool:
        for part in parts:  # noqa: SIM110 -- a plain loop: all() over a generator costs more
            if not part(message):
                return False
        return True

    _CHECKS[name] = check_message
    return check_message


def _field_check(fd: FieldDescriptor, kind: str) -> _Check:
    name = fd.name
    repeated = fd.is_repeated
    if kind == "string":
        if repeated:
            return lambda m: not any(map(_find_nul, getattr(m, name)))
        return lambda m: _find_nul(getattr(m, name)) is None
    if kind == "float":
        if repeated:
            return lambda m: all(map(math.isfinite, getattr(m, name)))
        return lambda m: math.isfinite(getattr(m, name))
    if kind in ("timestamp", "duration"):
        ok = _timestamp_ok if kind == "timestamp" else _duration_ok
        if repeated:
            return lambda m: all(map(ok, getattr(m, name)))
        return lambda m: not m.HasField(name) or ok(getattr(m, name))
    if kind in ("map_scalar", "map_message"):
        entry = fd.message_type
        assert entry is not None
        value_type = entry.fields_by_name["value"].message_type
        inner = _checker(value_type) if value_type is not None else None

        def map_ok(m: Any) -> bool:
            for key, value in getattr(m, name).items():
                if not _scalar_ok(key):
                    return False
                if inner is not None:
                    if not inner(value):
                        return False
                elif not _scalar_ok(value):
                    return False
            return True

        return map_ok
    sub_type = fd.message_type
    assert sub_type is not None
    sub = _checker(sub_type)
    assert sub is not None  # the plan only lists message fields that need a check
    if repeated:
        return lambda m: all(map(sub, getattr(m, name)))
    return lambda m: not m.HasField(name) or sub(getattr(m, name))


def _scalar_ok(value: Any) -> bool:
    """The rule for one string or number, shared by the fast check and the naming walk."""
    if isinstance(value, str):
        return _find_nul(value) is None
    return not isinstance(value, float) or math.isfinite(value)


def _struct_ok(struct: Any) -> bool:
    for key, value in struct.fields.items():
        if _find_nul(key) is not None or not _value_ok(value):
            return False
    return True


def _list_ok(values: Any) -> bool:
    return all(map(_value_ok, values.values))


def _value_ok(value: Any) -> bool:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return math.isfinite(value.number_value)
    if kind == "string_value":
        return _find_nul(value.string_value) is None
    if kind == "struct_value":
        return _struct_ok(value.struct_value)
    if kind == "list_value":
        return _list_ok(value.list_value)
    return True


_STRUCT_CHECKS: dict[str, _Check] = {
    "google.protobuf.Struct": _struct_ok,
    "google.protobuf.Value": _value_ok,
    "google.protobuf.ListValue": _list_ok,
}


def _timestamp_ok(stamp: Any) -> bool:
    seconds: int = stamp.seconds
    nanos: int = stamp.nanos
    return TIMESTAMP_MIN_SECONDS <= seconds <= TIMESTAMP_MAX_SECONDS and 0 <= nanos < _NANOS


def _duration_ok(span: Any) -> bool:
    seconds: int = span.seconds
    nanos: int = span.nanos
    return (
        -DURATION_MAX_SECONDS <= seconds <= DURATION_MAX_SECONDS
        and -_NANOS < nanos < _NANOS
        and not (seconds > 0 > nanos or seconds < 0 < nanos)
    )


# -- the walk that names the fields ---------------------------------------------------------

_STRING = FieldDescriptor.TYPE_STRING
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
_MESSAGE = FieldDescriptor.TYPE_MESSAGE

#: Per message type: the fields that need a look, or None when no field at any depth does
#: (the walk then skips the message). Built once per type; types are fixed at import.
_PLANS: dict[Descriptor, dict[FieldDescriptor, str] | None] = {}


def _plan(descriptor: Descriptor) -> dict[FieldDescriptor, str] | None:
    if descriptor in _PLANS:
        return _PLANS[descriptor]
    _PLANS[descriptor] = {}  # recursive types (Struct <-> Value) see themselves as checked
    plan: dict[FieldDescriptor, str] = {}
    for fd in descriptor.fields:
        if fd.type == _STRING:
            plan[fd] = "string"
        elif fd.type in _FLOATS:
            plan[fd] = "float"
        elif fd.type == _MESSAGE:
            sub = fd.message_type
            assert sub is not None
            if sub.full_name == "google.protobuf.Timestamp":
                plan[fd] = "timestamp"
            elif sub.full_name == "google.protobuf.Duration":
                plan[fd] = "duration"
            elif sub.GetOptions().map_entry:
                value_fd = sub.fields_by_name["value"]
                key_is_string = sub.fields_by_name["key"].type == _STRING
                value_type = value_fd.message_type
                if value_type is not None:
                    if key_is_string or _plan(value_type) is not None:
                        plan[fd] = "map_message"
                elif key_is_string or value_fd.type in (_STRING, *_FLOATS):
                    plan[fd] = "map_scalar"
            elif _plan(sub) is not None:
                plan[fd] = "message"
    _PLANS[descriptor] = plan or None
    return _PLANS[descriptor]


def _walk(message: Any, path: str, problems: list[FieldViolation]) -> None:
    plan = _plan(message.DESCRIPTOR)
    if plan is None:
        return
    struct_like = message.DESCRIPTOR.full_name in _STRUCT_TYPES
    for fd, value in message.ListFields():
        kind = plan.get(fd)
        if kind is None:
            continue
        # Struct, Value and ListValue read as the JSON they hold: arguments["x"][0].
        here = path if struct_like else (f"{path}.{fd.name}" if path else fd.name)
        if len(problems) >= _MAX_REPORTED:
            return
        if kind == "message":
            for i, item in _items(fd, value):
                _walk(item, here if i is None else f"{here}[{i}]", problems)
        elif kind in ("map_message", "map_scalar"):
            for key in value:
                item_path = f'{here}["{key}"]' if isinstance(key, str) else f"{here}[{key}]"
                if not _scalar_ok(key):
                    problems.append(FieldViolation(here, "a map key contains a NUL character"))
                    continue
                item = value[key]
                if kind == "map_message":
                    _walk(item, item_path, problems)
                else:
                    _scalar(item, item_path, problems)
        elif kind == "timestamp":
            for i, stamp in _items(fd, value):
                _timestamp(stamp, here if i is None else f"{here}[{i}]", problems)
        elif kind == "duration":
            for i, span in _items(fd, value):
                _duration(span, here if i is None else f"{here}[{i}]", problems)
        else:
            for i, item in _items(fd, value):
                _scalar(item, here if i is None else f"{here}[{i}]", problems)


_STRUCT_TYPES = frozenset(
    ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue")
)


def _items(fd: FieldDescriptor, value: Any) -> Iterator[tuple[int | None, Any]]:
    if fd.is_repeated:
        yield from enumerate(value)
    else:
        yield None, value


def _scalar(value: Any, path: str, problems: list[FieldViolation]) -> None:
    if not _scalar_ok(value):
        what = "contains a NUL character" if isinstance(value, str) else "must be a finite number"
        problems.append(FieldViolation(path, what))


def _timestamp(stamp: Any, path: str, problems: list[FieldViolation]) -> None:
    if not _timestamp_ok(stamp):
        problems.append(
            FieldViolation(path, "must lie in 0001-01-01..9999-12-31 with nanos in [0, 1e9)")
        )


def _duration(span: Any, path: str, problems: list[FieldViolation]) -> None:
    if not _duration_ok(span):
        problems.append(
            FieldViolation(
                path, "must lie within +-10,000 years, nanos in (-1e9, 1e9) of the seconds' sign"
            )
        )


# -- why bytes did not decode --------------------------------------------------------------


def _diagnose(descriptor: Descriptor, data: bytes) -> tuple[str, str]:
    """Read the wire format along the descriptor to name the field that broke decoding:
    ``(reason, field path)``, or ``("", "")`` when the walk finds nothing specific. Runs only
    for a request that failed to decode, so it favours plainness over speed."""
    try:
        return _diagnose_message(descriptor, memoryview(data), "", 0)
    except _Truncated:
        return "the message is truncated", ""
    except RecursionError:
        return "nested too deeply", ""


class _Truncated(Exception):
    pass


#: protobuf's default decoding limit (upb and the Python decoder alike).
_MAX_DEPTH = 100


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Truncated
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _diagnose_message(
    descriptor: Descriptor, data: memoryview, path: str, depth: int
) -> tuple[str, str]:
    if depth > _MAX_DEPTH:
        return f"messages nested deeper than {_MAX_DEPTH} levels", path
    pos = 0
    index: dict[str, int] = {}
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        fd = descriptor.fields_by_number.get(number)
        name = path if fd is None else (f"{path}.{fd.name}" if path else fd.name)
        if number == 0:
            return "field number 0 is not valid", path
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                return "a length-delimited field runs past the end of the message", name
            body = data[pos : pos + length]
            pos += length
            if fd is None:
                continue
            if fd.is_repeated:
                i = index.get(fd.name, 0)
                index[fd.name] = i + 1
                name = f"{name}[{i}]"
            if fd.type == _STRING:
                try:
                    str(body, "utf-8")
                except UnicodeDecodeError:
                    return "not valid UTF-8", name
            elif fd.message_type is not None:
                found = _diagnose_message(fd.message_type, body, name, depth + 1)
                if found != ("", ""):
                    return found
        elif wire in (3, 4):
            return "groups are not part of this contract", name
        else:
            return f"unknown wire type {wire}", name
        if pos > len(data):
            raise _Truncated
    return "", ""
