"""``step.started`` and ``step.ended`` built straight from the step row are exactly what
``json_format.MessageToDict`` makes of their attributes messages: the same members, in the
same order (the stored JSON keeps it), for every shape of step."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from typing import Any

import pytest
from google.protobuf import json_format

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core import audit_rows
from runtime_service import proto_map, step_events
from runtime_service.store.ledger import StepRow
from tests.unit.step_rows import new_step

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)

RESOLUTIONS: list[dict[str, Any]] = [
    {},  # no model: a tool call, a check, an approval
    {
        "model_policy_digest": "sha256:" + "a" * 64,
        "candidate_name": "primary",
        "candidate_reason": "PRIMARY",
        "provider": "anthropic",
        "requested_model_id": "claude-sonnet-4",
        "parameters_json": "{}",
        "system_prompt_digest": "sha256:" + "b" * 64,
    },
    {
        "model_policy_digest": "sha256:" + "c" * 64,
        "candidate_name": "fallback",
        "candidate_reason": "FALLBACK_AFTER_ERROR",
        "provider": "p",
        "requested_model_id": "m2",
        "parameters_json": json.dumps(
            {"temperature": 0.2, "max_tokens": 1024, "stop": ["\n"], "nested": {"a": None}}
        ),
        "system_prompt_digest": "sha256:" + "d" * 64,
        "skills_json": json.dumps(
            [{"name": "search", "version": "2", "digest": "sha256:" + "e" * 64}]
        ),
    },
]
TOOLS = [
    "[]",
    json.dumps(
        [
            {
                "name": "noop",
                "version": "1",
                "digest": "sha256:" + "f" * 64,
                "schema_digest": "sha256:" + "0" * 64,
                "decision": decision,
            }
            for decision in ("ALLOW", "REQUIRE_APPROVAL", "DENY")
        ]
    ),
]


def step(**values: Any) -> StepRow:
    return new_step(NOW, **values)


def reference_started(row: StepRow) -> dict[str, Any]:
    message = event_pb2.StepStartedAttributes(
        step_id=row.id,
        attempt_id=row.attempt_id,
        turn_id=row.turn_id,
        step_sequence=row.sequence,
        type=enum_pb2.StepType.Value(f"STEP_TYPE_{row.type}"),
        operation=row.operation,
        idempotency_key=row.idempotency_key,
        input_ref=row.input_ref,
        retry_of_step_id=row.retry_of_step_id,
        tool_name=row.tool_name,
        versions=proto_map.step(row).versions,
        status=enum_pb2.StepStatus.Value(f"STEP_STATUS_{row.status}"),
        input_revision=row.input_revision,
        tool_arguments_digest=(
            audit_rows.arguments_digest(row.tool_arguments_json) if row.tool_name else ""
        ),
        approval_step_id=row.approval_step_id,
        completion_check=row.completion_check,
    )
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def reference_ended(row: StepRow) -> dict[str, Any]:
    return json_format.MessageToDict(
        step_events.ended_attributes(row), preserving_proto_field_name=True
    )


def same(built: dict[str, Any], reference: dict[str, Any]) -> None:
    # The stored JSON is in insertion order: compare that too, not just the mappings; but
    # not inside the model's parameters, a Struct, whose map order upb does not keep even
    # across a copy.
    assert built == reference
    assert json.dumps(ordered(built)) == json.dumps(ordered(reference))


def ordered(doc: dict[str, Any]) -> dict[str, Any]:
    model = doc.get("versions", {}).get("model", {})
    if "parameters" in model:
        model = {**model, "parameters": dict(sorted(model["parameters"].items()))}
        return {**doc, "versions": {**doc["versions"], "model": model}}
    return doc


@pytest.mark.parametrize(
    ("resolution", "tools", "context", "reported"),
    list(itertools.product(RESOLUTIONS, TOOLS, ["", "sha256:" + "9" * 64], ["", "claude-x"])),
)
def test_started_is_the_message_mapping(
    resolution: dict[str, Any], tools: str, context: str, reported: str
) -> None:
    for extra in (
        {},
        {"turn_id": "trn_1", "operation": "plan", "idempotency_key": "k1", "input_ref": "sha256:1"},
        {"type": "TOOL_CALL", "tool_name": "noop", "retry_of_step_id": "stp_00"},
        {
            "type": "TOOL_CALL",
            "tool_name": "noop",
            "tool_arguments_json": '{"path":"a.py","n":42}',
            "approval_step_id": "stp_01",
            "input_revision": 3,
        },
        {"type": "APPROVAL_REQUEST", "status": "WAITING_APPROVAL", "tool_name": "noop"},
        {"type": "COMPLETION_CHECK", "status": "DENIED", "sequence": 1},
        {"type": "COMPLETION_CHECK", "completion_check": "tests-pass", "input_revision": 1},
    ):
        row = step(
            **resolution,
            tools_json=tools,
            context_digest=context,
            reported_model_id=reported,
            **extra,
        )
        built = step_events.started(row)
        assert built.type == "step.started"
        same(built.attributes, reference_started(row))


@pytest.mark.parametrize(
    "usage",
    [
        {},
        {"input_tokens": 12, "output_tokens": 3, "cost_usd": 0.0001},
        {"output_tokens": 2**40, "cost_usd": 1e-7},
        {"cost_usd": -0.0},
        {"cost_usd": float("inf")},
        {"input_tokens": 1, "cost_usd": 12.5},
    ],
)
def test_ended_is_the_message_mapping(usage: dict[str, Any]) -> None:
    for outcome in (
        {"status": "SUCCEEDED"},
        {"status": "SUCCEEDED", "output_ref": "sha256:2", "reported_model_id": "m1-2026"},
        {
            "status": "FAILED",
            "error_class": "RATE_LIMITED",
            "error_message": "slow down",
            "retryable": True,
            "side_effect": True,
        },
        {"status": "DENIED", "error_class": "PERMISSION_DENIED"},
        {"status": "CANCELLED", "summary": "stopped"},
    ):
        row = step(**outcome, **usage, end_time=NOW)
        built = step_events.ended(row)
        assert built.type == "step.ended"
        same(built.attributes, reference_ended(row))


def test_the_cached_versions_are_not_changed_by_a_step_with_a_context() -> None:
    resolution = RESOLUTIONS[2]
    with_context = step(**resolution, context_digest="sha256:" + "9" * 64)
    without = step(**resolution)
    assert "context_digest" in step_events.started(with_context).attributes["versions"]
    assert "context_digest" not in step_events.started(without).attributes["versions"]
    same(step_events.started(without).attributes, reference_started(without))
