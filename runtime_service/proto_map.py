"""Runtime records → protos (transport only: it reads records, never the store's rows)."""

from __future__ import annotations

import datetime as dt
import json
import operator
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_core.event_chain import StoredEvent
from agentrt_core.lru import LruCache
from agentrt_core.proto_json import enum_value, to_timestamp
from agentrt_core.resolution import BoundDefinition
from agentrt_core.trace_context import span_id_of
from runtime_service.records import (
    Artifact,
    Attempt,
    Blob,
    Checkpoint,
    Input,
    Message,
    Run,
    Step,
    Thread,
    Turn,
)


def timestamp(value: dt.datetime | None) -> timestamp_pb2.Timestamp | None:
    return None if value is None else to_timestamp(value)


def thread(row: Thread) -> message_pb2.Thread:
    return message_pb2.Thread(
        id=row.id,
        title=row.title,
        metadata=json.loads(row.metadata_json),
        concurrency_policy=enum_value(
            enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", row.concurrency_policy
        ),
        create_time=timestamp(row.create_time),
        namespace=row.namespace,
    )


def message(row: Message) -> message_pb2.Message:
    out = message_pb2.Message(
        id=row.id,
        thread_id=row.thread_id,
        role=enum_value(enum_pb2.MessageRole, "MESSAGE_ROLE_", row.role),
        content=row.content,
        run_id=row.run_id,
        create_time=timestamp(row.create_time),
    )
    data = json.loads(row.data_json)
    if data:
        out.data.update(data)
    return out


def binding(run: Run) -> message_pb2.AgentBinding:
    return message_pb2.AgentBinding(
        requested_ref=run.agent_requested_ref,
        agent_digest=run.agent_digest,
        agent_id=run.agent_id,
        version_label=run.agent_version_label,
        resolved_via_tag=run.agent_resolved_via_tag,
        resolve_time=timestamp(run.agent_resolve_time),
        # By name: the stored value is agentrt_core.model.ReferenceKind's, whose proto twin
        # numbers its values independently of agentrt.runtime.v1.ReferenceKind.
        reference_kind=enum_value(
            enum_pb2.ReferenceKind, "REFERENCE_KIND_", run.agent_reference_kind
        ),
        tag_event_sequence=run.agent_tag_event_sequence,
    )


def goal(run: Run) -> message_pb2.Goal:
    return json_format.ParseDict(json.loads(run.goal_json), message_pb2.Goal())


def budget(run: Run) -> message_pb2.Budget:
    return message_pb2.Budget(
        max_steps=run.max_steps,
        max_model_tokens=run.max_model_tokens,
        max_cost_usd=run.max_cost_usd,
    )


def amendment(record: dict[str, Any]) -> message_pb2.Amendment:
    return json_format.ParseDict(record, message_pb2.Amendment(), ignore_unknown_fields=True)


def run(row: Run) -> message_pb2.Run:
    return message_pb2.Run(
        id=row.id,
        thread_id=row.thread_id,
        namespace=row.namespace,
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
        permission_ceiling=enum_value(
            enum_pb2.PermissionCeiling, "PERMISSION_CEILING_", row.permission_ceiling
        ),
        concurrency_policy=enum_value(
            enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", row.concurrency_policy
        ),
        labels=json.loads(row.labels_json),
        runtime_version=row.runtime_version,
        status=enum_value(enum_pb2.RunStatus, "RUN_STATUS_", row.status),
        terminal_reason=enum_value(
            enum_pb2.TerminalReason, "TERMINAL_REASON_", row.terminal_reason
        ),
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
        creator_principal=row.creator_principal,
        traceparent=row.traceparent,
    )


def attempt(row: Attempt) -> message_pb2.Attempt:
    out = message_pb2.Attempt(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        reason=enum_value(enum_pb2.AttemptReason, "ATTEMPT_REASON_", row.reason),
        worker_id=row.worker_id,
        lease_epoch=row.lease_epoch,
        resume_from_checkpoint_id=row.resume_from_checkpoint_id,
        status=enum_value(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", row.status),
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        lease_expire_time=timestamp(row.lease_expire_time),
        usage=message_pb2.Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        result_summary=row.result_summary,
        output_ref=row.output_ref,
        worker_principal=row.worker_principal,
        traceparent=row.traceparent,
    )
    if row.error_class or row.error_message:
        out.error.CopyFrom(
            message_pb2.AttemptError(
                error_class=enum_value(enum_pb2.ErrorClass, "ERROR_CLASS_", row.error_class),
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


#: The columns in which a step records what BeginStep resolved for it (immutable once
#: recorded): the key of the caches built from them.
RESOLUTION_COLUMNS = (
    "model_policy_digest",
    "candidate_name",
    "candidate_reason",
    "provider",
    "requested_model_id",
    "parameters_json",
    "skills_json",
    "tools_json",
)
#: What a step's versions but its context digest are built from, in this order. (A fallback's
#: failed step differs per step, as the context digest does, but fallbacks are rare: keyed.)
VERSION_COLUMNS = (
    "system_prompt_digest",
    "reported_model_id",
    "fallback_from_step_id",
    *RESOLUTION_COLUMNS,
)

_resolution_of = operator.attrgetter(*RESOLUTION_COLUMNS)
_versions_key_of = operator.attrgetter(*VERSION_COLUMNS)

#: StepVersions by VERSION_COLUMNS (all immutable once recorded): the context digest, which
#: differs on nearly every model call, is set on a copy.
_VERSIONS: LruCache[tuple[Any, ...], message_pb2.StepVersions] = LruCache(4096)


def recorded_resolution(row: Step) -> tuple[str, ...]:
    """A step's RESOLUTION_COLUMNS."""
    key: tuple[str, ...] = _resolution_of(row)
    return key


def versions_key(row: Step) -> tuple[str, ...]:
    """A step's VERSION_COLUMNS: the key of the caches of its versions (here, and their JSON
    mapping in ``step_events.py``)."""
    key: tuple[str, ...] = _versions_key_of(row)
    return key


def step_versions_without_context(row: Step) -> message_pb2.StepVersions:
    """A step's versions but its context digest, from a cache shared by every caller:
    read it, never modify it."""
    return _versions_of_key(versions_key(row))


def _versions_of_key(key: tuple[str, ...]) -> message_pb2.StepVersions:
    cached = _VERSIONS.get(key)
    if cached is None:
        cached = _build_versions(*key)
        _VERSIONS.put(key, cached)
    return cached


def _build_versions(
    system_prompt_digest: str,
    reported_model_id: str,
    fallback_from_step_id: str,
    model_policy_digest: str,
    candidate_name: str,
    candidate_reason: str,
    provider: str,
    requested_model_id: str,
    parameters_json: str,
    skills_json: str,
    tools_json: str,
) -> message_pb2.StepVersions:
    out = message_pb2.StepVersions(system_prompt_digest=system_prompt_digest)
    if model_policy_digest:
        out.model.CopyFrom(
            message_pb2.RecordedModel(
                policy_digest=model_policy_digest,
                candidate_name=candidate_name,
                reason=enum_value(enum_pb2.CandidateReason, "CANDIDATE_REASON_", candidate_reason),
                provider=provider,
                requested_model_id=requested_model_id,
                reported_model_id=reported_model_id,
                fallback_from_step_id=fallback_from_step_id,
            )
        )
        out.model.parameters.update(_json(parameters_json))
    for skill in _json(skills_json):
        out.skills.add(name=skill["name"], version=skill["version"], digest=skill["digest"])
    for tool in _json(tools_json):
        out.tools.add(
            name=tool["name"],
            version=tool["version"],
            digest=tool["digest"],
            schema_digest=tool["schema_digest"],
            decision=enum_value(
                enum_pb2.PermissionDecision, "PERMISSION_DECISION_", tool.get("decision", "")
            ),
        )
    return out


# -- steps ----------------------------------------------------------------------------------
#
# Every BeginStep and EndStep answers a Step, and a provenance record carries every step of
# its run: the mapping reads the record's fields from its dict, and fields left at their
# default are not passed at all.

#: Fields that map one-to-one to a Step field of the same name (strings, integers, bools).
_PLAIN = (
    "id",
    "run_id",
    "attempt_id",
    "turn_id",
    "sequence",
    "operation",
    "idempotency_key",
    "input_ref",
    "output_ref",
    "summary",
    "error_message",
    "retryable",
    "retry_of_step_id",
    "side_effect",
    "input_revision",
    "tool_name",
    "approval_step_id",
    "completion_check",
)


def step(record: Step) -> message_pb2.Step:
    """The Step message of a step record (the one mapping of a step to its message)."""
    v = record.values()
    fields: dict[str, Any] = {name: v[name] for name in _PLAIN if v[name]}
    fields["type"] = enum_value(enum_pb2.StepType, "STEP_TYPE_", v["type"])
    fields["status"] = enum_value(enum_pb2.StepStatus, "STEP_STATUS_", v["status"])
    if v["error_class"]:
        fields["error_class"] = enum_value(enum_pb2.ErrorClass, "ERROR_CLASS_", v["error_class"])
    if v["start_time"] is not None:
        fields["start_time"] = timestamp(v["start_time"])
    if v["end_time"] is not None:
        fields["end_time"] = timestamp(v["end_time"])
    fields["usage"] = message_pb2.Usage(
        input_tokens=v["input_tokens"], output_tokens=v["output_tokens"], cost_usd=v["cost_usd"]
    )
    if v["trace_id"]:
        fields["trace_id"] = v["trace_id"]
        fields["span_id"] = span_id_of("step", v["id"])
    versions = _versions_of_key(versions_key(record))
    if v["context_digest"]:
        shared, versions = versions, message_pb2.StepVersions()
        versions.CopyFrom(shared)
        versions.context_digest = v["context_digest"]
    fields["versions"] = versions
    if v["consumed_input_ids_json"] != "[]":
        fields["consumed_input_ids"] = json.loads(v["consumed_input_ids_json"])
    out = message_pb2.Step(**fields)
    if "tool_name" in fields:
        out.tool_arguments.update(_json(v["tool_arguments_json"]))
    if v["approval_decision"]:
        out.approval.CopyFrom(
            message_pb2.Approval(
                decision=enum_value(
                    enum_pb2.ApprovalDecision, "APPROVAL_DECISION_", v["approval_decision"]
                ),
                approver=v["approver"],
                comment=v["approval_comment"],
                resolve_time=timestamp(v["approval_time"]),
                approver_principal=v["approver_principal"],
            )
        )
    return out


#: ResolvedVersions by (bound digest, step type, recorded resolution): see resolved_for.
_RESOLVED: LruCache[tuple[str, ...], message_pb2.ResolvedVersions] = LruCache(1024)


def resolved_for(bound: BoundDefinition, record: Step) -> message_pb2.ResolvedVersions:
    """What a worker needs for a step: what the step recorded, with content.

    Kept per bound digest and recorded resolution: both are immutable, and building the
    message (a prompt, skill files, tool schemas as Structs) on every model call cost
    more than recording the step. Callers copy it, never change it.
    """
    key = (bound.digest, record.type, *recorded_resolution(record))
    cached = _RESOLVED.get(key)
    if cached is None:
        cached = _build_resolved(bound, record)
        _RESOLVED.put(key, cached)
    return cached


def _build_resolved(bound: BoundDefinition, record: Step) -> message_pb2.ResolvedVersions:
    out = message_pb2.ResolvedVersions()
    if record.type == "MODEL_CALL":
        out.model.policy_digest = record.model_policy_digest
        out.model.candidate_name = record.candidate_name
        out.model.reason = enum_value(
            enum_pb2.CandidateReason, "CANDIDATE_REASON_", record.candidate_reason
        )
        out.model.provider = record.provider
        out.model.model_id = record.requested_model_id
        out.model.parameters.update(json.loads(record.parameters_json))
        out.system_prompt_digest = bound.system_prompt.digest
        out.system_prompt_text = str(bound.system_prompt.spec.get("text", ""))
        for skill in json.loads(record.skills_json):
            pinned = bound.skills[skill["name"]]
            resolved = out.skills.add(
                name=pinned.name,
                version=pinned.version,
                digest=pinned.digest,
                instructions=str(pinned.spec.get("instructions", "")),
            )
            for f in pinned.spec.get("files", []):
                resolved.files.add(path=f["path"], content=str(f.get("content", "")).encode())
    for tool in json.loads(record.tools_json):
        pinned_tool = bound.tools.get(tool["name"])
        if pinned_tool is None:
            continue
        resolved_tool = out.tools.add(
            name=pinned_tool.name,
            version=pinned_tool.version,
            digest=pinned_tool.digest,
            schema_digest=pinned_tool.schema_digest,
            decision=enum_value(
                enum_pb2.PermissionDecision, "PERMISSION_DECISION_", tool.get("decision", "ALLOW")
            ),
            side_effect=bool(pinned_tool.spec.get("side_effects")),
        )
        resolved_tool.input_schema.update(pinned_tool.spec.get("input_schema", {}))
        if "output_schema" in pinned_tool.spec:
            resolved_tool.output_schema.update(pinned_tool.spec["output_schema"])
    return out


def turn(row: Turn, consumed: list[str] | None = None) -> message_pb2.Turn:
    return message_pb2.Turn(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        number=row.number,
        status=enum_value(enum_pb2.TurnStatus, "TURN_STATUS_", row.status),
        start_time=timestamp(row.start_time),
        end_time=timestamp(row.end_time),
        consumed_input_ids=consumed or [],
    )


def input_(row: Input) -> message_pb2.Input:
    out = message_pb2.Input(
        id=row.id,
        run_id=row.run_id,
        kind=enum_value(enum_pb2.InputKind, "INPUT_KIND_", row.kind),
        content=row.content,
        sender=row.sender,
        sender_principal=row.sender_principal,
        create_time=timestamp(row.create_time),
        status=enum_value(enum_pb2.InputStatus, "INPUT_STATUS_", row.status),
        delivered_step_id=row.delivered_step_id,
        delivered_turn_id=row.delivered_turn_id,
        deliver_time=timestamp(row.deliver_time),
    )
    data = json.loads(row.data_json)
    if data:
        out.data.update(data)
    return out


def checkpoint(row: Checkpoint) -> message_pb2.Checkpoint:
    return message_pb2.Checkpoint(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        step_id=row.step_id,
        state_ref=row.state_ref,
        after_sequence=row.after_sequence,
        create_time=timestamp(row.create_time),
    )


def artifact(row: Artifact) -> message_pb2.Artifact:
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


def blob(row: Blob) -> message_pb2.Blob:
    return message_pb2.Blob(
        digest=row.digest,
        size=row.size,
        media_type=row.media_type,
        create_time=timestamp(row.create_time),
    )
