"""An event's hash and its place in a chain: the rule the server appends by and an auditor
recomputes offline (``docs/lifecycle.md`` has the exact form).

A chain is ``(thread_id, run_id)``: a run's events, or (``run_id == ""``) the thread's own
events. Each event's hash is SHA-256 over the RFC 8785 canonical JSON of the event document
(its id, chain, sequence, type, time, attributes and the previous event's hash), so rewriting
any stored event, or dropping one, breaks every later link. The server's log
(``runtime_service.events``) appends with it; ``agentrt_core.audit_chain`` verifies with it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from agentrt_core import jcs


def event_type_name(attributes: Message) -> str:
    """``run.created`` for ``RunCreatedAttributes`` (the dotted form used in the log)."""
    name = attributes.DESCRIPTOR.name
    dotted = _EVENT_TYPE_NAMES.get(name)
    if dotted is None:
        dotted = _EVENT_TYPE_NAMES[name] = _dotted(name)
    return dotted


#: Dotted event type by attributes message name: every event pays for the lookup.
_EVENT_TYPE_NAMES: dict[str, str] = {}


def _dotted(message_name: str) -> str:
    name = message_name.removesuffix("Attributes")
    words: list[str] = []
    for ch in name:
        if ch.isupper() and words:
            words.append("_")
        words.append(ch.lower())
    snake = "".join(words)
    head, _, tail = snake.partition("_")
    return f"{head}.{tail}"


def format_time(value: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds: the one spelling of a time inside a hash."""
    # isoformat spells it as strftime("%Y-%m-%dT%H:%M:%S.%fZ") would, at a fraction of the cost.
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"


def event_hash(
    *,
    event_id: str,
    thread_id: str,
    run_id: str,
    sequence: int,
    event_type: str,
    event_time: str,
    attributes: Any,
    prev_hash: str,
) -> str:
    """The hash of an event: SHA-256 of the RFC 8785 (JCS) form of its document (the module's
    docstring)."""
    return document_hash(
        jcs.canonical_bytes(attributes),
        event_id=event_id,
        thread_id=thread_id,
        run_id=run_id,
        sequence=sequence,
        event_type=event_type,
        event_time=event_time,
        prev_hash=prev_hash,
    )


def document_hash(
    attributes_jcs: bytes,
    *,
    event_id: str,
    thread_id: str,
    run_id: str,
    sequence: int,
    event_type: str,
    event_time: str,
    prev_hash: str,
) -> str:
    """:func:`event_hash`, given the JCS bytes of the attributes.

    JCS writes an object's members in key order (RFC 8785 section 3.2.3), and "attributes"
    sorts before every other member of the document, so the document's JCS bytes are
    ``{"attributes":`` + the attributes' JCS bytes + the other members in key order. The
    attributes are serialised once, and the same bytes are what the event stores. The other
    members are strings and a sequence number, written here directly: a string as the C
    encoder of :mod:`json` writes it with ``ensure_ascii=False`` is its JCS form (the escapes
    of RFC 8785 section 3.2.2.2; ``agentrt_core.jcs`` relies on the same), and a sequence is
    a small positive integer, plain digits.
    """
    if not 0 <= sequence <= jcs.MAX_SAFE_INTEGER:
        raise ValueError(f"sequence {sequence} is out of JCS's exact integer range")
    text = (
        f',"event_time":{_jcs_string(event_time)},"event_type":{_jcs_string(event_type)}'
        f',"id":{_jcs_string(event_id)},"prev_hash":{_jcs_string(prev_hash)}'
        f',"run_id":{_jcs_string(run_id)},"sequence":{int(sequence)}'
        f',"thread_id":{_jcs_string(thread_id)},"type":"agentrt.event.v1"}}'
    )
    return jcs.digest_bytes(b'{"attributes":' + attributes_jcs + text.encode("utf-8"))


#: A JSON string as JCS writes it (see _document_hash).
_jcs_string: Callable[[str], str] = json.encoder.encode_basestring


@dataclass(frozen=True)
class StoredEvent:
    id: str
    thread_id: str
    run_id: str
    sequence: int
    thread_cursor: int
    event_type: str
    event_time: dt.datetime
    attributes: dict[str, Any]
    prev_hash: str
    hash: str

    def recomputed_hash(self) -> str:
        return event_hash(
            event_id=self.id,
            thread_id=self.thread_id,
            run_id=self.run_id,
            sequence=self.sequence,
            event_type=self.event_type,
            event_time=format_time(self.event_time),
            attributes=self.attributes,
            prev_hash=self.prev_hash,
        )
