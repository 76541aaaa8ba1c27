"""``proto_map.step`` (the answer of BeginStep, EndStep, GetStep, ListSteps and provenance) is
the plain field-by-field mapping of a step record, for every shape of step; the hot path
reads the record's dict and skips defaults, so this test keeps the obvious mapping as its
reference."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import pickle
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from runtime_service import proto_map
from runtime_service.records import Step, step_of
from runtime_service.store.ledger import StepRow
from tests.unit.step_rows import new_step

NOW = dt.datetime(2026, 11, 29, 12, 0, 1, 250_001, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(seconds=3, microseconds=7)

MODEL = {
    "model_policy_digest": "sha256:" + "a" * 64,
    "candidate_name": "fallback",
    "candidate_reason": "FALLBACK_AFTER_ERROR",
    "provider": "p",
    "requested_model_id": "m2",
    "parameters_json": json.dumps({"temperature": 0.2, "stop": ["\n"], "nested": {"a": None}}),
    "system_prompt_digest": "sha256:" + "d" * 64,
    "skills_json": json.dumps([{"name": "search", "version": "2", "digest": "sha256:" + "e" * 64}]),
    "tools_json": json.dumps(
        [
            {
                "name": "noop",
                "version": "1",
                "digest": "sha256:" + "f" * 64,
                "schema_digest": "sha256:" + "0" * 64,
                "decision": "REQUIRE_APPROVAL",
            }
        ]
    ),
}
SHAPES: list[dict[str, Any]] = [
    {},  # a bare started model call without a resolution
    {**MODEL, "context_digest": "sha256:" + "9" * 64},
    {
        **MODEL,
        "status": "SUCCEEDED",
        "end_time": LATER,
        "input_tokens": 120,
        "output_tokens": 30,
        "cost_usd": 0.0125,
        "reported_model_id": "m2-2026",
        "consumed_input_ids_json": json.dumps(["inp_1", "inp_2"]),
        "input_revision": 3,
        "summary": "ok",
        "output_ref": "sha256:" + "1" * 64,
    },
    {
        **MODEL,
        "status": "FAILED",
        "end_time": LATER,
        "error_class": "RATE_LIMITED",
        "error_message": "429",
        "retryable": True,
        "retry_of_step_id": "stp_00",
        "idempotency_key": "k1",
        "turn_id": "trn_1",
        "operation": "plan",
    },
    {
        "type": "TOOL_CALL",
        "tool_name": "noop",
        "tool_arguments_json": json.dumps({"path": "a.txt", "n": 2, "deep": [1, {"x": True}]}),
        "side_effect": True,
        "approval_step_id": "stp_05",
        "input_ref": "sha256:" + "2" * 64,
    },
    {"type": "TOOL_CALL", "tool_name": "noop", "status": "DENIED", "end_time": NOW},
    {
        "type": "APPROVAL_REQUEST",
        "status": "SUCCEEDED",
        "tool_name": "noop",
        "tool_arguments_json": json.dumps({"path": "b"}),
        "approval_decision": "APPROVE",
        "approver": "alice",
        "approver_principal": "alice@example.org",
        "approval_comment": "fine",
        "approval_time": LATER,
    },
    {"type": "APPROVAL_REQUEST", "status": "WAITING_APPROVAL", "tool_name": "noop"},
    {"type": "COMPLETION_CHECK", "completion_check": "tests_pass", "status": "CANCELLED"},
    {"type": "CHECKPOINT", "sequence": 1, "turn_id": ""},
]


def step(**values: Any) -> Step:
    return new_step(NOW, **{"turn_id": "trn_0", **values})


def stamp(value: dt.datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


def reference(row: Step) -> message_pb2.Step:
    """The obvious mapping, one field at a time."""
    versions = message_pb2.StepVersions(
        system_prompt_digest=row.system_prompt_digest, context_digest=row.context_digest
    )
    if row.model_policy_digest:
        versions.model.CopyFrom(
            message_pb2.RecordedModel(
                policy_digest=row.model_policy_digest,
                candidate_name=row.candidate_name,
                reason=enum_pb2.CandidateReason.Value(f"CANDIDATE_REASON_{row.candidate_reason}"),
                provider=row.provider,
                requested_model_id=row.requested_model_id,
                reported_model_id=row.reported_model_id,
            )
        )
        versions.model.parameters.update(json.loads(row.parameters_json))
    for skill in json.loads(row.skills_json):
        versions.skills.add(**skill)
    for tool in json.loads(row.tools_json):
        versions.tools.add(
            **{
                **tool,
                "decision": enum_pb2.PermissionDecision.Value(
                    f"PERMISSION_DECISION_{tool['decision']}"
                ),
            }
        )
    out = message_pb2.Step(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        turn_id=row.turn_id,
        sequence=row.sequence,
        type=enum_pb2.StepType.Value(f"STEP_TYPE_{row.type}"),
        operation=row.operation,
        status=enum_pb2.StepStatus.Value(f"STEP_STATUS_{row.status}"),
        idempotency_key=row.idempotency_key,
        input_ref=row.input_ref,
        output_ref=row.output_ref,
        summary=row.summary,
        start_time=stamp(row.start_time),
        end_time=stamp(row.end_time),
        error_class=(
            enum_pb2.ErrorClass.Value(f"ERROR_CLASS_{row.error_class}") if row.error_class else 0
        ),
        error_message=row.error_message,
        retryable=row.retryable,
        retry_of_step_id=row.retry_of_step_id,
        side_effect=row.side_effect,
        usage=message_pb2.Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        versions=versions,
        input_revision=row.input_revision,
        consumed_input_ids=json.loads(row.consumed_input_ids_json),
        tool_name=row.tool_name,
        approval_step_id=row.approval_step_id,
        completion_check=row.completion_check,
    )
    if row.tool_name:
        out.tool_arguments.update(json.loads(row.tool_arguments_json))
    if row.approval_decision:
        out.approval.CopyFrom(
            message_pb2.Approval(
                decision=enum_pb2.ApprovalDecision.Value(
                    f"APPROVAL_DECISION_{row.approval_decision}"
                ),
                approver=row.approver,
                comment=row.approval_comment,
                resolve_time=stamp(row.approval_time),
                approver_principal=row.approver_principal,
            )
        )
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_step_is_the_field_by_field_mapping(shape: dict[str, Any]) -> None:
    row = step(**shape)
    expected = reference(row)
    # The record as built, as read back through an ORM row, and as the step writer process
    # sends it (pickled).
    for built in (
        proto_map.step(row),
        proto_map.step(step_of(StepRow(**row.values()))),
        proto_map.step(pickle.loads(pickle.dumps(row))),
    ):
        assert built == expected
        # Presence too (an empty Usage or StepVersions is still set, as in the reference).
        assert [f.name for f, _ in built.ListFields()] == [f.name for f, _ in expected.ListFields()]
        assert built.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True
        )


def test_cached_versions_are_not_shared_with_the_answer() -> None:
    """Two steps with the same resolution but different context digests, built one after the
    other from the shared versions cache, each keep their own."""
    contexts = ["sha256:" + c * 64 for c in "345"]
    built = [
        proto_map.step(step(**MODEL, context_digest=c))
        for c, _ in itertools.product(contexts, range(2))
    ]
    assert [b.versions.context_digest for b in built] == [c for c in contexts for _ in range(2)]
    plain = proto_map.step(step(**MODEL))
    assert plain.versions.context_digest == ""
    plain.versions.system_prompt_digest = "changed"  # the answer is the caller's to change
    assert (
        proto_map.step(step(**MODEL)).versions.system_prompt_digest == MODEL["system_prompt_digest"]
    )
