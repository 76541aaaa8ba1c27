"""Request-side conversions from messages to domain values (enums, times, JSON values):
shared by the servicers and the step writer process (``step_wire``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2

from agentrt_base.errors import InvalidArgument


def enum_name(enum: Any, prefix: str, value: int, field: str, *, required: bool = False) -> str:
    """The bare name of an enum value (``RUN_STATUS_QUEUED`` → ``QUEUED``); "" for
    UNSPECIFIED unless ``required``. Unknown numbers are refused: a client built against a
    newer contract must not be silently read as something else."""
    if value == 0:
        if required:
            raise InvalidArgument.for_field(field, "required")
        return ""
    names = _NAMES.get((id(enum), prefix))
    if names is None:
        names = _NAMES[(id(enum), prefix)] = {
            number: name.removeprefix(prefix) for name, number in enum.items()
        }
    name = names.get(value)
    if name is None:
        raise InvalidArgument.for_field(field, f"unknown enum value {value}")
    return name


#: Bare names by number, per (enum, prefix): enums are module-level singletons.
_NAMES: dict[tuple[int, str], dict[int, str]] = {}


def struct_json(message: struct_pb2.Struct) -> dict[str, Any]:
    if not message.fields:
        return {}
    value: dict[str, Any] = json_format.MessageToDict(message)
    return value


def message_json(message: Any) -> dict[str, Any]:
    value: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return value


def time_or_none(request: Any, field: str) -> dt.datetime | None:
    if not request.HasField(field):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(request, field)
    return stamp.ToDatetime(tzinfo=dt.UTC)


def duration_or_none(request: Any, field: str) -> dt.timedelta | None:
    if not request.HasField(field):
        return None
    duration: duration_pb2.Duration = getattr(request, field)
    if duration.seconds < 0 or duration.nanos < 0:
        raise InvalidArgument.for_field(field, "must not be negative")
    return duration.ToTimedelta()
