"""W3C Trace Context as the ledger records it: the ``traceparent`` of a run, of each of its
attempts, and the span ids of its steps.

A run records the context it was created in (the CreateRun server span, a child of the
caller's ``traceparent`` when it sent one). Each attempt gets a span of its own in that
trace, its ``invoke_agent`` span: AcquireRun hands its ``traceparent`` to the worker, whose
spans for the attempt are then its children whatever language it is written in. A step's
span is the child of its attempt's.

The span ids of attempts and steps are functions of their ledger ids (:func:`span_id_of`),
not drawn at random and stored: the server emits an attempt's or a step's span when the
ledger says it ended, possibly in another replica than the one that began it, and needs
nothing but the record to name it, and the parent link of a step's span is known from its
``attempt_id`` alone. Only the trace id (the run's, or a new one for a run created outside
any trace) is drawn and stored.

Pure rules, shared by the server and the worker SDK. The format is the W3C Recommendation's
(https://www.w3.org/TR/trace-context/#traceparent-header): ``version-trace_id-parent_id-
flags``, lowercase hex, all-zero ids invalid, version ``ff`` invalid, a later version read
by its first four fields.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final

#: The trace-flags bit saying the caller sampled (recorded) its span.
SAMPLED: Final = 0x01

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
#: Longest header read: the W3C format is 55 characters; a later version may append fields.
MAX_TRACEPARENT: Final = 512


@dataclass(frozen=True, slots=True)
class TraceParent:
    """One span's context: its trace, its own id, its flags."""

    trace_id: str
    span_id: str
    flags: int = SAMPLED

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The ``traceparent`` header value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def child(self, span_id: str) -> TraceParent:
        """The context of a span ``span_id`` of the same trace, sampled as this one is."""
        return TraceParent(self.trace_id, span_id, self.flags & SAMPLED)


def parse(value: str) -> TraceParent | None:
    """The context in a ``traceparent`` header, or None when it is not a valid one (the
    W3C rule: a receiver that cannot parse it starts a new trace; it is never an error)."""
    if not value or len(value) > MAX_TRACEPARENT:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


#: W3C tracestate (https://www.w3.org/TR/trace-context/#tracestate-header): a list-member's
#: key (simple or tenant@system) and value, at most 32 members; only this many characters
#: of a header are taken at all (the length the Recommendation asks vendors to propagate).
_STATE_KEY = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})\Z"
)
_STATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]\Z")
MAX_TRACESTATE: Final = 512
_MAX_MEMBERS: Final = 32


def parse_tracestate(value: str) -> list[tuple[str, str]] | None:
    """The list-members of a ``tracestate`` header, or None when it is longer than
    :data:`MAX_TRACESTATE`, has more than 32 members or any that break the grammar: then it
    is dropped whole (a receiver that cannot parse it must not pass a changed one on), and
    nothing of a caller's malformed header reaches a log line."""
    if len(value) > MAX_TRACESTATE:
        return None
    members: list[tuple[str, str]] = []
    for part in value.split(","):
        part = part.strip(" \t")
        if not part:
            continue  # empty list-members are allowed and ignored
        key, sep, item = part.partition("=")
        if not sep or not _STATE_KEY.match(key) or not _STATE_VALUE.match(item):
            return None
        members.append((key, item))
    if len(members) > _MAX_MEMBERS or len({key for key, _ in members}) != len(members):
        return None
    return members


def trace_id_of(traceparent: str) -> str:
    """The trace id of a recorded ``traceparent`` ("" when there is none)."""
    parsed = parse(traceparent)
    return parsed.trace_id if parsed is not None else ""


def span_id_of(kind: str, ledger_id: str) -> str:
    """The span id of the ledger's ``kind`` ("attempt" or "step") with id ``ledger_id``: an
    8-byte BLAKE2b of both, never all zeros (ids are unique, so the spans are; read on every
    step a worker is answered, so the cheaper hash)."""
    digest = hashlib.blake2b(f"agentrt.{kind}\0{ledger_id}".encode(), digest_size=8).hexdigest()
    return digest if digest != _ZERO_SPAN else "0" * 15 + "1"


def new_trace_id() -> str:
    """A random trace id (W3C: 16 random bytes, not all zero)."""
    while True:
        value = secrets.token_hex(16)
        if value != _ZERO_TRACE:
            return value


def attempt_context(run_traceparent: str, attempt_id: str, *, start_trace: bool) -> str:
    """The ``traceparent`` an attempt records and its worker is given: the child of the
    run's context, or, for a run created outside any trace, the root of a new trace when the
    server traces (``start_trace``), else "" (nobody would see that trace's root)."""
    span_id = span_id_of("attempt", attempt_id)
    run = parse(run_traceparent)
    if run is not None:
        return run.child(span_id).header()
    if start_trace:
        return TraceParent(new_trace_id(), span_id).header()
    return ""
