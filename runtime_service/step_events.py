"""The attributes of ``step.started`` and ``step.ended``, built straight from the step row.

Every step appends both events, and building each attributes message only to turn it into
its JSON mapping (``json_format.MessageToDict``) was a tenth of the step writer's CPU. These
build the same mapping directly: proto3 JSON with the proto field names, fields in number
order, default values left out, int64 as strings, enums by name. The step's recorded
versions (the one nested message that is not trivial) are converted by ``MessageToDict``
itself, once per distinct resolution, and cached. ``tests/unit/test_step_events.py`` checks
both documents against ``MessageToDict`` of the messages, field by field and in order.
"""

from __future__ import annotations

import math
from typing import Any

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_core import audit_rows
from agentrt_core.lru import LruCache
from agentrt_core.proto_json import enum_value, message_json
from runtime_service import proto_map
from runtime_service.events import EventDocument
from runtime_service.records import Step

STARTED = "step.started"
ENDED = "step.ended"

#: The JSON mapping of a step's versions without its context digest (which differs per
#: step), by what it is built from. Shared, so never modified: see :func:`_versions`.
_VERSIONS: LruCache[tuple[Any, ...], dict[str, Any]] = LruCache(4096)


def ended_attributes(step: Step) -> event_pb2.StepEndedAttributes:
    """``step.ended`` as a message: :func:`ended` builds its mapping directly, but for a
    cost that proto3 JSON spells as a string."""
    return event_pb2.StepEndedAttributes(
        step_id=step.id,
        status=enum_value(enum_pb2.StepStatus, "STEP_STATUS_", step.status),
        output_ref=step.output_ref,
        error_class=enum_value(enum_pb2.ErrorClass, "ERROR_CLASS_", step.error_class),
        error_message=step.error_message,
        side_effect=step.side_effect,
        usage=message_pb2.Usage(
            input_tokens=step.input_tokens,
            output_tokens=step.output_tokens,
            cost_usd=step.cost_usd,
        ),
        reported_model_id=step.reported_model_id,
        summary=step.summary,
        retryable=step.retryable,
    )


def started(step: Step) -> EventDocument:
    """The ``step.started`` event of a step just begun."""
    doc: dict[str, Any] = {"step_id": step.id}
    _put(doc, "attempt_id", step.attempt_id)
    _put(doc, "turn_id", step.turn_id)
    if step.sequence:
        doc["step_sequence"] = str(step.sequence)
    doc["type"] = f"STEP_TYPE_{step.type}"
    _put(doc, "operation", step.operation)
    _put(doc, "idempotency_key", step.idempotency_key)
    _put(doc, "input_ref", step.input_ref)
    _put(doc, "retry_of_step_id", step.retry_of_step_id)
    _put(doc, "tool_name", step.tool_name)
    doc["versions"] = _versions(step)
    doc["status"] = f"STEP_STATUS_{step.status}"
    # Record format 1 (audit_rows): what the chain commits to besides the above.
    if step.input_revision:
        doc["input_revision"] = str(step.input_revision)
    if step.tool_name:
        doc["tool_arguments_digest"] = audit_rows.arguments_digest(step.tool_arguments_json)
    _put(doc, "approval_step_id", step.approval_step_id)
    _put(doc, "completion_check", step.completion_check)
    return EventDocument(STARTED, doc)


def ended(step: Step) -> EventDocument:
    """The ``step.ended`` event of a step just ended."""
    cost = step.cost_usd
    if not math.isfinite(cost):
        # Proto3 JSON spells these as strings ("Infinity"): leave that to json_format.
        return EventDocument(
            ENDED,
            message_json(ended_attributes(step)),
        )
    doc: dict[str, Any] = {"step_id": step.id, "status": f"STEP_STATUS_{step.status}"}
    _put(doc, "output_ref", step.output_ref)
    if step.error_class:
        doc["error_class"] = f"ERROR_CLASS_{step.error_class}"
    _put(doc, "error_message", step.error_message)
    if step.side_effect:
        doc["side_effect"] = True
    usage: dict[str, Any] = {}
    if step.input_tokens:
        usage["input_tokens"] = str(step.input_tokens)
    if step.output_tokens:
        usage["output_tokens"] = str(step.output_tokens)
    if cost or math.copysign(1.0, cost) < 0:  # -0.0 is not the default (its bits differ)
        usage["cost_usd"] = cost
    doc["usage"] = usage
    _put(doc, "reported_model_id", step.reported_model_id)
    _put(doc, "summary", step.summary)
    if step.retryable:
        doc["retryable"] = True
    return EventDocument(ENDED, doc)


def _put(doc: dict[str, Any], key: str, value: str) -> None:
    if value:
        doc[key] = value


def _versions(step: Step) -> dict[str, Any]:
    key = proto_map.versions_key(step)
    shared = _VERSIONS.get(key)
    if shared is None:
        shared = message_json(proto_map.step_versions_without_context(step))
        _VERSIONS.put(key, shared)
    if not step.context_digest:
        return dict(shared)
    # context_digest is field 3: after the model and the system prompt, before the skills.
    out: dict[str, Any] = {}
    for name in ("model", "system_prompt_digest"):
        if name in shared:
            out[name] = shared[name]
    out["context_digest"] = step.context_digest
    for name in ("skills", "tools"):
        if name in shared:
            out[name] = shared[name]
    return out
