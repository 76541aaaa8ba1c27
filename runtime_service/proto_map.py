"""Runtime rows → protos (transport only)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_base.lru import LruCache
from runtime_service.events import StoredEvent
from runtime_service.store.ledger import (
    ArtifactRow,
    BlobRow,
    CheckpointRow,
    InputRow,
    StepRow,
    TurnRow,
)
from runtime_service.store.tables import AttemptRow, MessageRow, RunRow, ThreadRow

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def timestamp(value: dt.datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    # What Timestamp.FromDatetime computes, without its calendar detour (a Step carries two
    # of these on every BeginStep and EndStep answer).
    if value.tzinfo is None:  # naive means UTC, as for FromDatetime
        value = value.replace(tzinfo=dt.UTC)
    delta = value - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1000
    )


_ENUM_VALUES: dict[tuple[int, str], int] = {}


def _enum(enum: Any, prefix: str, value: str) -> Any:
    if not value:
        return 0
    key = (id(enum), prefix + value)
    number = _ENUM_VALUES.get(key)
    if number is None:
        number = _ENUM_VALUES[key] = enum.Value(prefix + value)
    return number


def thread(row: ThreadRow) -> message_pb2.Thread:
    return message_pb2.Thread(
        id=row.id,
        title=row.title,
        metadata=json.loads(row.metadata_json),
        concurrency_policy=_enum(
            enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", row.concurrency_policy
        ),
        create_time=timestamp(row.create_time),
    )


def message(row: MessageRow) -> message_pb2.Message:
    out = message_pb2.Message(
        id=row.id,
        thread_id=row.thread_id,
        role=_enum(enum_pb2.MessageRole, "MESSAGE_ROLE_", row.role),
        content=row.content,
        run_id=row.run_id,
        create_time=timestamp(row.create_time),
    )
    data = json.loads(row.data_json)
    if data:
        out.data.update(data)
    return out


def binding(run: RunRow) -> message_pb2.AgentBinding:
    return message_pb2.AgentBinding(
        requested_ref=run.agent_requested_ref,
        agent_digest=run.agent_digest,
        agent_id=run.agent_id,
        version_label=run.agent_version_label,
        resolved_via_tag=run.agent_resolved_via_tag,
        resolve_time=timestamp(run.agent_resolve_time),
    )


def goal(run: RunRow) -> message_pb2.Goal:
    return json_format.ParseDict(json.loads(run.goal_json), message_pb2.Goal())


def budget(run: RunRow) -> message_pb2.Budget:
    return message_pb2.Budget(
        max_steps=run.max_steps,
        max_model_tokens=run.max_model_tokens,
        max_cost_usd=run.max_cost_usd,
    )


def amendment(record: dict[str, Any]) -> message_pb2.Amendment:
    return json_format.ParseDict(record, message_pb2.Amendment(), ignore_unknown_fields=True)


def run(row: RunRow) -> message_pb2.Run:
    return message_pb2.Run(
        id=row.id,
        thread_id=row.thread_id,
        agent=binding(row),
        goal=goal(row),
        amendments=[amendment(a) for a in json.loads(row.amendments_json)],
        input_revision=row.input_revision,
        budget=budget(row),
        deadline_time=timestamp(row.deadline_time),
        priority=row.priority,
        max_attempts=row.max_attempts,
        parent_run_id=row.parent_run_id,
        derived_from_run_id=row.derived_from_run_id,
        permission_ceiling=_enum(
            enum_pb2.PermissionCeiling, "PERMISSION_CEILING_", row.permission_ceiling
        ),
        concurrency_policy=_enum(
            enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", row.concurrency_policy
        ),
        labels=json.loads(row.labels_json),
        runtime_version=row.runtime_version,
        status=_enum(enum_pb2.RunStatus, "RUN_STATUS_", row.status),
        terminal_reason=_enum(enum_pb2.TerminalReason, "TERMINAL_REASON_", row.terminal_reason),
        terminal_message=row.terminal_message,
        cancel_requested=row.cancel_requested,
        pause_requested=row.pause_requested,
        latest_checkpoint_id=row.latest_checkpoint_id,
        usage=message_pb2.Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        step_count=row.last_step_sequence,
        attempt_count=row.attempt_count,
        current_attempt_id=row.current_attempt_id,
        result_summary=row.result_summary,
        output_ref=row.output_ref,
        create_time=timestamp(row.create_time),
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        update_time=timestamp(row.update_time),
        last_event_sequence=row.last_event_sequence,
    )


def attempt(row: AttemptRow) -> message_pb2.Attempt:
    out = message_pb2.Attempt(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        reason=_enum(enum_pb2.AttemptReason, "ATTEMPT_REASON_", row.reason),
        worker_id=row.worker_id,
        lease_epoch=row.lease_epoch,
        resume_from_checkpoint_id=row.resume_from_checkpoint_id,
        status=_enum(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", row.status),
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        lease_expire_time=timestamp(row.lease_expire_time),
        usage=message_pb2.Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        result_summary=row.result_summary,
        output_ref=row.output_ref,
    )
    if row.error_class or row.error_message:
        out.error.CopyFrom(
            message_pb2.AttemptError(
                error_class=_enum(enum_pb2.ErrorClass, "ERROR_CLASS_", row.error_class),
                message=row.error_message,
                retryable=row.retryable,
            )
        )
    return out


def event(stored: StoredEvent) -> event_pb2.Event:
    out = event_pb2.Event(
        id=stored.id,
        run_id=stored.run_id,
        thread_id=stored.thread_id,
        sequence=stored.sequence,
        event_time=timestamp(stored.event_time),
        event_type=enum_pb2.EventType.Value(
            "EVENT_TYPE_" + stored.event_type.replace(".", "_").upper()
        ),
        prev_hash=stored.prev_hash,
        hash=stored.hash,
    )
    field = stored.event_type.replace(".", "_") + "_attributes"
    json_format.ParseDict(stored.attributes, getattr(out, field))
    return out


def _json(text: str) -> Any:
    # Most steps store empty lists and objects: skip the parser for them.
    if text == "[]":
        return []
    if text == "{}":
        return {}
    return json.loads(text)


#: StepVersions by the columns they are built from (all immutable once recorded) except the
#: context digest, which differs on nearly every model call and is set on the copy.
_VERSIONS: LruCache[tuple[Any, ...], message_pb2.StepVersions] = LruCache(4096)


def recorded_resolution(row: StepRow) -> tuple[str, ...]:
    """The columns in which a step records what BeginStep resolved for it (immutable once
    recorded): the key of the caches built from them."""
    return (
        row.model_policy_digest,
        row.candidate_name,
        row.candidate_reason,
        row.provider,
        row.requested_model_id,
        row.parameters_json,
        row.skills_json,
        row.tools_json,
    )


def versions_key(row: StepRow) -> tuple[str, ...]:
    """What a step's versions but its context digest are built from: the key of the caches
    of them (here, and their JSON mapping in ``services/step_events.py``)."""
    return (row.system_prompt_digest, row.reported_model_id, *recorded_resolution(row))


def step_versions(row: StepRow) -> message_pb2.StepVersions:
    out = message_pb2.StepVersions()
    out.CopyFrom(step_versions_without_context(row))
    out.context_digest = row.context_digest
    return out


def step_versions_without_context(row: StepRow) -> message_pb2.StepVersions:
    """A step's versions but its context digest, from a cache shared by every caller:
    read it, never modify it."""
    key = versions_key(row)
    cached = _VERSIONS.get(key)
    if cached is None:
        cached = _build_versions(row)
        _VERSIONS.put(key, cached)
    return cached


def _build_versions(row: StepRow) -> message_pb2.StepVersions:
    out = message_pb2.StepVersions(system_prompt_digest=row.system_prompt_digest)
    if row.model_policy_digest:
        out.model.CopyFrom(
            message_pb2.RecordedModel(
                policy_digest=row.model_policy_digest,
                candidate_name=row.candidate_name,
                reason=_enum(enum_pb2.CandidateReason, "CANDIDATE_REASON_", row.candidate_reason),
                provider=row.provider,
                requested_model_id=row.requested_model_id,
                reported_model_id=row.reported_model_id,
            )
        )
        out.model.parameters.update(_json(row.parameters_json))
    for skill in _json(row.skills_json):
        out.skills.add(name=skill["name"], version=skill["version"], digest=skill["digest"])
    for tool in _json(row.tools_json):
        out.tools.add(
            name=tool["name"],
            version=tool["version"],
            digest=tool["digest"],
            schema_digest=tool["schema_digest"],
            decision=_enum(
                enum_pb2.PermissionDecision, "PERMISSION_DECISION_", tool.get("decision", "")
            ),
        )
    return out


def step(row: StepRow) -> message_pb2.Step:
    out = message_pb2.Step(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        turn_id=row.turn_id,
        sequence=row.sequence,
        type=_enum(enum_pb2.StepType, "STEP_TYPE_", row.type),
        operation=row.operation,
        status=_enum(enum_pb2.StepStatus, "STEP_STATUS_", row.status),
        idempotency_key=row.idempotency_key,
        input_ref=row.input_ref,
        output_ref=row.output_ref,
        summary=row.summary,
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        error_class=_enum(enum_pb2.ErrorClass, "ERROR_CLASS_", row.error_class),
        error_message=row.error_message,
        retryable=row.retryable,
        retry_of_step_id=row.retry_of_step_id,
        side_effect=row.side_effect,
        usage=message_pb2.Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        versions=step_versions(row),
        input_revision=row.input_revision,
        consumed_input_ids=_json(row.consumed_input_ids_json),
        tool_name=row.tool_name,
        approval_step_id=row.approval_step_id,
        completion_check=row.completion_check,
    )
    if row.tool_name:
        out.tool_arguments.update(_json(row.tool_arguments_json))
    if row.approval_decision:
        out.approval.CopyFrom(
            message_pb2.Approval(
                decision=_enum(
                    enum_pb2.ApprovalDecision, "APPROVAL_DECISION_", row.approval_decision
                ),
                approver=row.approver,
                comment=row.approval_comment,
                resolve_time=timestamp(row.approval_time),
            )
        )
    return out


def turn(row: TurnRow, consumed: list[str] | None = None) -> message_pb2.Turn:
    return message_pb2.Turn(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        number=row.number,
        status=_enum(enum_pb2.TurnStatus, "TURN_STATUS_", row.status),
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        consumed_input_ids=consumed or [],
    )


def input_(row: InputRow) -> message_pb2.Input:
    out = message_pb2.Input(
        id=row.id,
        run_id=row.run_id,
        kind=_enum(enum_pb2.InputKind, "INPUT_KIND_", row.kind),
        content=row.content,
        sender=row.sender,
        create_time=timestamp(row.create_time),
        status=_enum(enum_pb2.InputStatus, "INPUT_STATUS_", row.status),
        delivered_step_id=row.delivered_step_id,
        delivered_turn_id=row.delivered_turn_id,
        deliver_time=timestamp(row.deliver_time),
    )
    data = json.loads(row.data_json)
    if data:
        out.data.update(data)
    return out


def checkpoint(row: CheckpointRow) -> message_pb2.Checkpoint:
    return message_pb2.Checkpoint(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        step_id=row.step_id,
        state_ref=row.state_ref,
        after_sequence=row.after_sequence,
        create_time=timestamp(row.create_time),
    )


def artifact(row: ArtifactRow) -> message_pb2.Artifact:
    return message_pb2.Artifact(
        id=row.id,
        run_id=row.run_id,
        thread_id=row.thread_id,
        attempt_id=row.attempt_id,
        step_id=row.step_id,
        name=row.name,
        blob_digest=row.blob_digest,
        media_type=row.media_type,
        size=row.size,
        labels=json.loads(row.labels_json),
        create_time=timestamp(row.create_time),
    )


def blob(row: BlobRow) -> message_pb2.Blob:
    return message_pb2.Blob(
        digest=row.digest,
        size=row.size,
        media_type=row.media_type,
        create_time=timestamp(row.create_time),
    )
