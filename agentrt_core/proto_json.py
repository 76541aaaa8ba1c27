"""Protobuf well-known values ⇄ plain Python: Struct/Value ⇄ JSON, enum number ⇄ short name,
Timestamp/Duration ⇄ datetime/timedelta. Each rule is written once, here, and used by the
registry, the runtime and the SDK (so this module imports protobuf and
:mod:`agentrt_core.errors` only: no SQLAlchemy, no gRPC server).

**The number rule.** A ``Struct`` holds every number as an IEEE-754 double, so 42 written by a
client reads back as 42.0. :func:`json_number` turns a finite double that is a whole number
with ``|x| <= 2**53 - 1`` into an ``int`` and leaves every other double a ``float``; NaN and
±Infinity are refused (:class:`NonFiniteNumber`: JSON has no form for them). One rule serves
every reader:

* **Digests** need exactly this bound. :mod:`agentrt_core.jcs` writes 42 and 42.0 the same
  (RFC 8785), but refuses *integers* beyond ±(2**53 - 1) while accepting a double there
  (``docs/digest.md`` §2.5). Turning 2.0**60 into the int 2**60 would make a definition that
  publishes today refused; turning nothing into ints would store ``42.0`` where the author
  wrote ``42``. ``tests/vectors/struct_numbers.json`` pins what each case becomes.
* **Stored and returned JSON** (inputs, messages, tool arguments) reads as it was written.
* **JSON Schema validation and providers** see 42, not 42.0: jsonschema counts 42.0 as an
  integer anyway, but its messages print the value, and an OpenAI-compatible server may refuse
  ``max_tokens: 1024.0``. A whole double beyond 2**53 - 1 is not an exact integer of the
  author's (any of ~2**10 integers round to it), so it stays the float it is.

**Enums** travel in JSON and in storage by their short name: the value's name without the
enum's prefix (``RUN_STATUS_QUEUED`` → ``QUEUED``). A number the contract does not know is
refused, naming the field: a client built against a newer contract must not be read as
something else.

**Times** are UTC. A naive ``datetime`` is read as UTC (what ``Timestamp.FromDatetime`` does,
and what the database layer stores); Timestamps become aware UTC datetimes.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any, Final

from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2

from agentrt_core.errors import InvalidArgument

#: The largest integer every double (so every JSON parser) holds exactly.
MAX_SAFE_INTEGER: Final = 2**53 - 1

# -- numbers and JSON values ------------------------------------------------------------------


class NonFiniteNumber(ValueError):
    """A Struct held NaN or an infinity; ``path`` says where (``["a"][0]``, "" at the top)."""

    def __init__(self, path: str, number: float) -> None:
        super().__init__(f"{path or 'value'}: {number} is not a JSON number")
        self.path = path


def json_number(number: float, path: str = "") -> int | float:
    """The JSON value of a Struct double (the module doc's number rule)."""
    if not math.isfinite(number):
        raise NonFiniteNumber(path, number)
    if number.is_integer() and -MAX_SAFE_INTEGER <= number <= MAX_SAFE_INTEGER:
        return int(number)  # int(-0.0) is 0, as JCS writes -0
    return number


def json_numbers(value: Any, path: str = "") -> Any:
    """Plain JSON ``value`` (dicts, lists, scalars) with every float read by
    :func:`json_number`; for values that reached us as Struct doubles by another route
    (a dict built from a Struct's items, a decoded row). Booleans stay booleans."""
    if isinstance(value, float):
        return json_number(value, path)
    if isinstance(value, Mapping):
        return {k: json_numbers(v, f'{path}["{k}"]') for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_numbers(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def struct_to_json(struct: struct_pb2.Struct, path: str = "") -> dict[str, Any]:
    return {key: value_to_json(v, f'{path}["{key}"]') for key, v in struct.fields.items()}


def value_to_json(value: struct_pb2.Value, path: str = "") -> Any:
    which = value.WhichOneof("kind")
    if which == "number_value":
        return json_number(value.number_value, path)
    if which == "string_value":
        return value.string_value
    if which == "struct_value":
        return struct_to_json(value.struct_value, path)
    if which == "list_value":
        return [value_to_json(v, f"{path}[{i}]") for i, v in enumerate(value.list_value.values)]
    if which == "bool_value":
        return value.bool_value
    return None  # null_value, or a Value with nothing set (proto3 JSON reads it as null)


def message_json(message: Any) -> dict[str, Any]:
    """A whole message in the proto3 JSON mapping with proto field names (numbers inside its
    Structs stay doubles: this is protobuf's mapping, used where a message is kept whole)."""
    value: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return value


def json_to_struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(data)
    return struct


# -- enums ------------------------------------------------------------------------------------

#: Short names by number, per (enum, prefix): enum wrappers are module-level singletons.
_NAMES: dict[tuple[int, str], dict[int, str]] = {}
#: Numbers by full name, per enum.
_NUMBERS: dict[tuple[int, str], int] = {}


def short_name(enum: Any, prefix: str, value: int, field: str) -> str:
    """The name of ``value`` without ``prefix`` (0 is ``UNSPECIFIED``); an unknown number is
    refused as an invalid ``field``. ``enum`` is a generated ``EnumTypeWrapper`` (typed Any:
    each enum has its own ``ValueType`` in the stubs)."""
    names = _NAMES.get((id(enum), prefix))
    if names is None:
        names = _NAMES[(id(enum), prefix)] = {
            number: name.removeprefix(prefix) for name, number in enum.items()
        }
    name = names.get(value)
    if name is None:
        raise InvalidArgument.for_field(field, f"unknown enum value {value}")
    return name


def enum_name(enum: Any, prefix: str, value: int, field: str, *, required: bool = False) -> str:
    """:func:`short_name` for a field where UNSPECIFIED means "not given": "" for 0, or
    refused as ``required``."""
    if value == 0:
        if required:
            raise InvalidArgument.for_field(field, "required")
        return ""
    return short_name(enum, prefix, value, field)


def display_name(enum: Any, value: int) -> str:
    """For people: ``value``'s name without the enum's prefix (``RUN_STATUS_WAITING_APPROVAL``
    as ``WAITING_APPROVAL``; the prefix is what precedes ``UNSPECIFIED`` in the name of 0,
    which every enum of the contract has). Never refused: a number this client does not know
    (a newer server's value) is shown as the number. ``enum``: a generated wrapper, or an
    ``EnumDescriptor`` (a field's ``enum_type``)."""
    values = enum.values_by_number if hasattr(enum, "values_by_number") else None
    if values is None:
        values = enum.DESCRIPTOR.values_by_number
    prefix = values[0].name.removesuffix("UNSPECIFIED") if 0 in values else ""
    known = values.get(value)
    return known.name.removeprefix(prefix) if known is not None else str(value)


def enum_value(enum: Any, prefix: str, name: str) -> Any:
    """The number of short name ``name`` ("" is 0, UNSPECIFIED); the inverse of
    :func:`enum_name`. Names come from our own storage, so an unknown one is a bug
    (``ValueError`` from the generated wrapper)."""
    if not name:
        return 0
    key = (id(enum), prefix + name)
    number = _NUMBERS.get(key)
    if number is None:
        number = _NUMBERS[key] = enum.Value(prefix + name)
    return number


# -- times ------------------------------------------------------------------------------------

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """``value`` as a Timestamp; a naive datetime is UTC (as for ``FromDatetime``). Computed
    directly rather than by ``FromDatetime``, whose calendar detour showed in profiles (a Step
    carries two of these on every BeginStep and EndStep answer)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1000
    )


def from_timestamp(stamp: timestamp_pb2.Timestamp) -> dt.datetime:
    """An aware UTC datetime (microseconds: a datetime holds no nanoseconds)."""
    return stamp.ToDatetime(tzinfo=dt.UTC)


def time_or_none(message: Any, field: str) -> dt.datetime | None:
    """``message.field`` as a datetime, None when the field is not set."""
    if not message.HasField(field):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, field)
    return from_timestamp(stamp)


def duration_or_none(message: Any, field: str) -> dt.timedelta | None:
    """``message.field`` as a timedelta, None when not set; a negative one is refused."""
    if not message.HasField(field):
        return None
    duration: duration_pb2.Duration = getattr(message, field)
    if duration.seconds < 0 or duration.nanos < 0:
        raise InvalidArgument.for_field(field, "must not be negative")
    return duration.ToTimedelta()
