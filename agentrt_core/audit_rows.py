"""Served rows against the event chain: each row re-derived from the events that recorded it.

The read APIs serve rows (a run with its binding and amendments, attempts, steps with their
resolved versions, usage and approval, checkpoints, artifacts, inputs, and the usage index
behind ``FindUsages``); the hash chain covers events. A row changed in the database would be
served while the chain still verifies, so :func:`compare` rebuilds, from the run's events
alone, what each row must serve, and compares it field by field with what is served.
``VerifyRun`` (through ``servicers/audit_export.py``) and the offline bundle check
(``audit_bundle.verify_bundle``) both call it, on the same input: the rows in the proto3 JSON
mapping of their API messages (field names as in the protos), which is what a client receives
and what a bundle holds. The usage index rows have no message of their own (``FindUsages``
serves them joined with their step and run): they are given as their columns
(``USAGE_COLUMNS``), and re-derived from each step's committed versions by the very functions
the step path writes them with (``agentrt_core.usage_rows``), so the
rule of which rows a step gets is stated once.

Why re-derive rather than store a digest of each row in its event: a row changes after its
first event (a step ends, an input is delivered, a run accumulates usage), so a digest would
need an event per change, and a digest can say that a row differs but not which field. The
events already carry almost every served field; those they lacked were added to them
("record format 1" in ``event.proto``): a run's ``run.created`` carries the format its
events are written in, and a run of format 0 (created before) has those fields reported as
not covered, never as verified. ``docs/audit.md`` ("What VerifyRun checks") lists every row
kind and field, and what is not covered and why.

Pure: no database, no protobuf, no server (the offline verifier runs it on a file).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrt_core import jcs

# KINDS, EventLike and usage_id are part of what this module's callers use: re-exported.
from agentrt_core.audit_replay import KINDS as KINDS
from agentrt_core.audit_replay import EventLike as EventLike
from agentrt_core.audit_replay import derive
from agentrt_core.audit_replay import usage_id as usage_id

#: The record format new runs' events are written in (``RunCreatedAttributes.record_format``).
RECORD_FORMAT = 1

#: Most mismatches one answer carries (a wholesale rewrite would otherwise list every field).
MAX_MISMATCHES = 1000


#: A usage index row's columns (``runtime_step_usages``), the form its rows are compared in
#: (``start_time`` as an event time). ``tests/unit/test_audit_rows.py`` pins them to the table.
USAGE_COLUMNS = (
    "step_id",
    "kind",
    "name",
    "version",
    "digest",
    "schema_digest",
    "run_id",
    "start_time",
)

#: Served fields the events of a format-0 run do not carry, by row kind.
FORMAT_1_FIELDS: dict[str, tuple[str, ...]] = {
    # (agent.reference_kind and agent.tag_event_sequence: migration 0013 filled the row's
    # binding for runs whose run.created never carried them.)
    "run": ("labels", "result_summary", "agent.reference_kind", "agent.tag_event_sequence"),
    "attempt": ("result_summary", "output_ref"),
    "step": (
        "input_revision",
        "tool_arguments",
        "approval_step_id",
        "completion_check",
        "summary",
        "retryable",
    ),
    "input": ("content", "data"),
    "artifact": ("attempt_id", "size", "labels"),
    "checkpoint": (),
    # A step's versions were in step.started from the first format.
    "usage": (),
}

#: The served fields compared, by row kind: every field of the API message except those
#: listed in ``docs/audit.md`` as not covered (they change without an event: the run's
#: ``update_time``, an attempt's ``lease_expire_time``; the run's ``namespace`` and
#: ``last_event_sequence`` are its thread's and its chain head's, checked with those).
COVERED: dict[str, tuple[str, ...]] = {
    "run": (
        "thread_id",
        "agent",
        "goal",
        "amendments",
        "input_revision",
        "budget",
        "deadline_time",
        "priority",
        "max_attempts",
        "parent_run_id",
        "derived_from_run_id",
        "permission_ceiling",
        "concurrency_policy",
        "labels",
        "runtime_version",
        "status",
        "terminal_reason",
        "terminal_message",
        "cancel_requested",
        "pause_requested",
        "latest_checkpoint_id",
        "usage",
        "step_count",
        "attempt_count",
        "current_attempt_id",
        "result_summary",
        "output_ref",
        "create_time",
        "start_time",
        "end_time",
        "creator_principal",
    ),
    "attempt": (
        "run_id",
        "number",
        "reason",
        "worker_id",
        "lease_epoch",
        "resume_from_checkpoint_id",
        "status",
        "start_time",
        "end_time",
        "error",
        "usage",
        "result_summary",
        "output_ref",
        "worker_principal",
    ),
    "step": (
        "run_id",
        "attempt_id",
        "turn_id",
        "sequence",
        "type",
        "operation",
        "status",
        "idempotency_key",
        "input_ref",
        "output_ref",
        "summary",
        "start_time",
        "end_time",
        "error_class",
        "error_message",
        "retryable",
        "retry_of_step_id",
        "side_effect",
        "usage",
        "versions",
        "input_revision",
        "consumed_input_ids",
        "tool_name",
        "tool_arguments",
        "approval",
        "approval_step_id",
        "completion_check",
    ),
    "checkpoint": (
        "run_id",
        "attempt_id",
        "step_id",
        "state_ref",
        "after_sequence",
        "create_time",
    ),
    "artifact": (
        "run_id",
        "thread_id",
        "attempt_id",
        "step_id",
        "name",
        "blob_digest",
        "media_type",
        "size",
        "labels",
        "create_time",
    ),
    "input": (
        "run_id",
        "kind",
        "content",
        "data",
        "sender",
        "create_time",
        "status",
        "delivered_step_id",
        "delivered_turn_id",
        "deliver_time",
        "sender_principal",
    ),
    "usage": ("name", "version", "digest", "schema_digest", "run_id", "start_time"),
}

#: Served fields deliberately not compared, by row kind (``docs/audit.md`` says why): the
#: row's id (the key it is found by), fields that change without an event, and fields that
#: are another chain's. ``tests/unit/test_audit_rows.py`` checks that every field of each
#: served message is in exactly one of ``COVERED`` and this, so a field added to a message
#: is a decision, not a silent gap.
NOT_COMPARED: dict[str, tuple[str, ...]] = {
    # The trace context points at telemetry outside the ledger (docs/audit.md, "Not
    # covered"): not evidence, so not committed to.
    "run": ("id", "namespace", "update_time", "last_event_sequence", "traceparent"),
    "attempt": ("id", "lease_expire_time", "traceparent"),
    "step": ("id", "trace_id", "span_id"),
    "checkpoint": ("id",),
    "artifact": ("id",),
    "input": ("id",),
    # The row's id is made of these (:func:`usage_id`).
    "usage": ("step_id", "kind"),
}

#: Fields committed to by a digest of their value rather than the value, and how the digest
#: of a served value is computed (the writer commits ``fn`` of what it stores).
_DIGESTED = ("tool_arguments", "content", "data")


# -- what the writers commit to (one rule each, used by writers and by the comparison) --------


def arguments_digest(arguments_json: str) -> str:
    """``StepStartedAttributes.tool_arguments_digest`` of a step's stored arguments."""
    return jcs.digest_document(json.loads(arguments_json or "{}"))


def content_digest(content: str) -> str:
    """``InputReceivedAttributes.content_digest``."""
    return jcs.digest_bytes(content.encode("utf-8"))


def data_digest(data_json: str) -> str:
    """``InputReceivedAttributes.data_digest`` of an input's stored structured data."""
    return jcs.digest_document(json.loads(data_json or "{}"))


# -- the comparison ------------------------------------------------------------------------


@dataclass(frozen=True)
class RowMismatch:
    """A served field that differs from what the chain committed to (see
    ``agentrt.audit.v1.RowMismatch``); ``stored`` and ``committed`` are JSON."""

    kind: str
    id: str
    field: str
    stored: str
    committed: str

    def describe(self) -> str:
        if self.field == ROW:
            if self.stored == "null":
                return f"{self.kind} {self.id}: the chain records it but no such row is served"
            return f"{self.kind} {self.id}: served, but no event of the run's chain records it"
        return (
            f"{self.kind} {self.id}: {self.field} is {self.stored} but the chain committed to "
            f"{self.committed}"
        )


#: The ``field`` of a mismatch about a whole row: ``stored`` ``true`` and ``committed``
#: ``null`` for a row served without the event that records it, the reverse for a row the
#: chain records that is not served.
ROW = "(row)"


@dataclass
class RowReport:
    mismatches: list[RowMismatch] = field(default_factory=list)
    #: Mismatches found beyond ``MAX_MISMATCHES`` (not listed).
    more: int = 0
    rows_checked: int = 0
    #: ``kind.field`` of the served fields this run's chain does not commit to.
    not_covered: list[str] = field(default_factory=list)


def compare(
    rows: Mapping[str, Any], events: Iterable[EventLike], *, run_id: str, thread_id: str
) -> RowReport:
    """Compare the served rows of a run with what its events committed to.

    Args:
        rows: ``run`` (one row), and ``attempts``, ``steps``, ``checkpoints``,
            ``artifacts``, ``inputs`` (lists; a list left out is not compared), each row in
            the proto3 JSON mapping of its API message; and ``usages``, the usage index rows
            as their columns (``USAGE_COLUMNS``; bundles do not carry them).
        events: The run's events in sequence order, as stored (whether their chain verifies
            is :func:`audit_chain.verify_chain`'s question).
        run_id, thread_id: The run's, as its chain records them.
    """
    derived = derive(events, run_id, thread_id)
    report = RowReport()
    fmt = derived.record_format
    for kind in KINDS:
        skipped = FORMAT_1_FIELDS[kind] if fmt < 1 else ()
        report.not_covered += [f"{kind}.{name}" for name in skipped]
        if kind == "run":
            served_rows = [rows["run"]] if "run" in rows else []
        else:
            section = f"{kind}s"
            if section not in rows:
                continue
            served_rows = list(rows[section])
        expected = derived.rows[kind]
        seen: set[str] = set()
        for served in served_rows:
            row_id = usage_id(served) if kind == "usage" else str(served.get("id", ""))
            seen.add(row_id)
            report.rows_checked += 1
            committed = expected.get(row_id)
            if committed is None:
                _add(report, RowMismatch(kind, row_id, ROW, "true", "null"))
                continue
            for name in COVERED[kind]:
                if name in skipped:
                    continue
                stored_value = served.get(name)
                if name in _DIGESTED:
                    stored_value = _served_digest(kind, name, served)
                for path, have, want in _differences(name, stored_value, committed.get(name)):
                    if any(path.startswith(f"{s}.") or path == s for s in skipped):
                        continue
                    _add(report, RowMismatch(kind, row_id, path, _json(have), _json(want)))
        for row_id in expected:
            if row_id not in seen:
                _add(report, RowMismatch(kind, row_id, ROW, "null", "true"))
    return report


def _add(report: RowReport, mismatch: RowMismatch) -> None:
    if len(report.mismatches) < MAX_MISMATCHES:
        report.mismatches.append(mismatch)
    else:
        report.more += 1


def _served_digest(kind: str, name: str, served: Mapping[str, Any]) -> str | None:
    """The digest the writer would have committed for the served value of a digested field."""
    value = served.get(name)
    if kind == "step":
        if not served.get("tool_name") and value is None:
            return None
        return jcs.digest_document(value or {})
    if name == "content":
        return content_digest(value or "")
    return jcs.digest_document(value or {})


def _json(value: Any) -> str:
    return json.dumps(None if _absent(value) else value, sort_keys=True, ensure_ascii=False)


def _absent(value: Any) -> bool:
    """Proto3 JSON leaves default values out: absent and default are the same served value."""
    return value is None or value is False or value == 0 or value in ("", [], {})


def _differences(path: str, have: Any, want: Any) -> Iterable[tuple[str, Any, Any]]:
    """The leaf paths where two JSON values differ (absent and default being equal)."""
    if isinstance(have, dict) or isinstance(want, dict):
        a = have if isinstance(have, dict) else {}
        b = want if isinstance(want, dict) else {}
        if (have is not None and not isinstance(have, dict)) or (
            want is not None and not isinstance(want, dict)
        ):
            yield path, have, want
            return
        for key in sorted(set(a) | set(b)):
            yield from _differences(f"{path}.{key}", a.get(key), b.get(key))
        return
    if (
        isinstance(have, list)
        and isinstance(want, list)
        and len(have) == len(want)
        and any(isinstance(x, dict) for x in have + want)
    ):
        for i, (x, y) in enumerate(zip(have, want, strict=True)):
            yield from _differences(f"{path}[{i}]", x, y)
        return
    if _absent(have) and _absent(want):
        return
    if (
        path.endswith("_time")
        and isinstance(have, str)
        and isinstance(want, str)
        and _instant(have) == _instant(want)
    ):
        return
    if have != want:
        yield path, have, want


def _instant(text: str) -> dt.datetime | str:
    """A served timestamp and an event's time in comparable form (proto3 JSON writes 0, 3, 6
    or 9 fraction digits; events write 6)."""
    try:
        head, _, frac = text.rstrip("Z").partition(".")
        micros = (frac + "000000")[:6]
        return dt.datetime.fromisoformat(f"{head}.{micros}")
    except ValueError:
        return text


def describe(mismatches: Sequence[RowMismatch]) -> list[str]:
    return [m.describe() for m in mismatches]
