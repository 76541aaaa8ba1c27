"""An event's hash recomputed from the wire, by the rule docs/audit.md states and nothing else.

Written from the documentation alone: no import from the project, so a test that uses it
checks that the documented rule (not our implementation of it) gives the stored hash. Its
input is an ``Event`` in the proto3 JSON mapping with proto field names, as a watcher can
turn any ``Event`` it receives into (``MessageToDict(event, preserving_proto_field_name=True)``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import rfc8785

_TYPE_PREFIX = "EVENT_TYPE_"


def dotted_event_type(enum_name: str) -> str:
    """``EVENT_TYPE_RUN_STATUS_CHANGED`` -> ``run.status_changed``: drop the prefix,
    lowercase, and make the first ``_`` a ``.``."""
    if not enum_name.startswith(_TYPE_PREFIX):
        raise ValueError(f"{enum_name!r} is not an EventType name")
    head, _, tail = enum_name.removeprefix(_TYPE_PREFIX).lower().partition("_")
    return f"{head}.{tail}"


def hashed_time(rfc3339: str) -> str:
    """A Timestamp's JSON text (0, 3, 6 or 9 fractional digits) as the hash spells it: UTC,
    exactly six fractional digits, ``Z``."""
    when = dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_document(event: dict[str, Any]) -> dict[str, Any]:
    """The document an event's hash is computed over, from its wire form."""
    (attributes,) = [v for k, v in event.items() if k.endswith("_attributes")]
    return {
        "attributes": attributes,
        "event_time": hashed_time(event["event_time"]),
        "event_type": dotted_event_type(event["event_type"]),
        "id": event["id"],
        "prev_hash": event.get("prev_hash", ""),
        "run_id": event.get("run_id", ""),
        "sequence": int(event["sequence"]),
        "thread_id": event["thread_id"],
        "type": "agentrt.event.v1",
    }


def event_hash(event: dict[str, Any]) -> str:
    """``sha256:`` + hex SHA-256 of the JCS bytes of :func:`event_document`."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(event_document(event))).hexdigest()
