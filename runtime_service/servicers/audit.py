"""gRPC adapter of ``agentrt.audit.v1.AuditService``: proto in, use case, proto out.

Every RPC only reads (see :mod:`runtime_service.services.audit`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any, cast

from agentrt.audit.v1 import audit_service_pb2 as pb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.audit.v1 import message_pb2 as apb
from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import message_pb2 as mpb
from registry import proto_map as registry_map
from runtime_service import proto_map as pm
from runtime_service.audit_bundle import ChainReport, Format
from runtime_service.servicers.convert import enum_name, time_or_none
from runtime_service.services.audit import (
    BUNDLE_CHUNK,
    AuditService,
    ModelMatch,
    ProvenanceRecord,
    QueryKind,
    TargetKind,
    Usage,
    UsageQuery,
)
from runtime_service.services.context import Runtime

Context = Any

_FORMATS: dict[str, Format] = {"": "json", "JSON": "json", "JSONL": "jsonl"}
_FORMAT_ENUM = {"json": pb.BUNDLE_FORMAT_JSON, "jsonl": pb.BUNDLE_FORMAT_JSONL}


class AuditServicer(audit_service_pb2_grpc.AuditServiceServicer):
    """``agentrt.audit.v1.AuditService``."""

    def __init__(self, runtime: Runtime) -> None:
        self._audit = AuditService(runtime)

    async def GetProvenance(
        self, request: pb.GetProvenanceRequest, context: Context
    ) -> pb.GetProvenanceResponse:
        kind: TargetKind = request.WhichOneof("target") or "run_id"
        found = await self._audit.provenance(kind, getattr(request, kind), request.max_steps)
        return pb.GetProvenanceResponse(
            records=[_record(r) for r in found.records],
            blob_references=[
                apb.BlobReference(
                    digest=b.digest,
                    role=apb.BlobRole.Value(f"BLOB_ROLE_{b.role}"),
                    run_id=b.run_id,
                    step_id=b.step_id,
                    artifact_id=b.artifact_id,
                    checkpoint_id=b.checkpoint_id,
                )
                for b in found.blob_references
            ],
        )

    async def FindUsages(
        self, request: pb.FindUsagesRequest, context: Context
    ) -> pb.FindUsagesResponse:
        kind: QueryKind = request.WhichOneof("query") or "component_ref"
        match = enum_name(apb.ModelMatch, "MODEL_MATCH_", request.model_match, "model_match")
        query = UsageQuery(
            kind=kind,
            value=getattr(request, kind),
            model_match=cast(ModelMatch, match or "ANY"),
            start_time=time_or_none(request, "start_time"),
            end_time=time_or_none(request, "end_time"),
        )
        usages, token = await self._audit.find_usages(query, request.page_size, request.page_token)
        return pb.FindUsagesResponse(usages=[_usage(u) for u in usages], next_page_token=token)

    async def VerifyRun(
        self, request: pb.VerifyRunRequest, context: Context
    ) -> pb.VerifyRunResponse:
        return _verify_response(await self._audit.verify_run(request.run_id))

    async def ExportBundle(
        self, request: pb.ExportBundleRequest, context: Context
    ) -> AsyncIterator[pb.ExportBundleResponse]:
        name = enum_name(pb.BundleFormat, "BUNDLE_FORMAT_", request.format, "format")
        bundle = await self._audit.export_bundle(request.run_id, _FORMATS[name])
        yield pb.ExportBundleResponse(
            info=pb.BundleInfo(
                run_id=bundle.run_id,
                format=_FORMAT_ENUM[bundle.format],
                media_type=bundle.media_type,
                size=len(bundle.data),
                digest=bundle.digest,
                installation_id=bundle.installation_id,
                export_time=pm.timestamp(bundle.export_time),
            )
        )
        view = memoryview(bundle.data)
        for offset in range(0, len(view), BUNDLE_CHUNK):
            yield pb.ExportBundleResponse(chunk=bytes(view[offset : offset + BUNDLE_CHUNK]))


def _record(r: ProvenanceRecord) -> apb.ProvenanceRecord:
    out = apb.ProvenanceRecord(
        run=pm.run(r.run),
        thread=pm.thread(r.thread),
        tags_at_run_creation=[
            apb.TagAtTime(
                tag=t.tag, event_sequence=t.event_sequence, since_time=pm.timestamp(t.since_time)
            )
            for t in r.tags_at_run_creation
        ],
        attempts=[pm.attempt(a) for a in r.attempts],
        steps=[step_proto(s) for s in r.steps],
        steps_truncated=r.steps_truncated,
    )
    if r.agent_version is not None:
        out.agent_version.CopyFrom(registry_map.agent_version_to_proto(r.agent_version))
    if r.artifact is not None:
        out.artifact.CopyFrom(pm.artifact(r.artifact))
    if r.step is not None:
        out.step.CopyFrom(pm.step(r.step))
    if r.attempt is not None:
        out.attempt.CopyFrom(pm.attempt(r.attempt))
    return out


def _usage(u: Usage) -> apb.UsageRecord:
    return apb.UsageRecord(
        run_id=u.run_id,
        thread_id=u.thread_id,
        step_id=u.step_id,
        step_sequence=u.step_sequence,
        step_type=enum_pb2.StepType.Value(f"STEP_TYPE_{u.step_type or 'UNSPECIFIED'}"),
        attempt_id=u.attempt_id,
        agent_digest=u.agent_digest,
        matched=u.matched,
        time=pm.timestamp(u.time),
    )


def _verify_response(report: ChainReport) -> pb.VerifyRunResponse:
    out = pb.VerifyRunResponse(
        intact=report.intact, event_count=report.event_count, head_hash=report.head_hash
    )
    if report.first_break is not None:
        b = report.first_break
        out.first_break.CopyFrom(
            apb.ChainBreak(
                sequence=b.sequence,
                expected_hash=b.expected_hash,
                found_hash=b.found_hash,
                reason=b.reason,
            )
        )
    return out


# -- steps in bulk ---------------------------------------------------------------------------
#
# A provenance record carries every step of its run, and proto_map.step costs ~120 us a step
# (a 200-step run: ~25 ms of a 50 ms budget). step_proto builds the identical message in about
# half that: enum values from dicts, timestamps without datetime arithmetic in Python's
# protobuf helpers, and the JSON and Structs that repeat from step to step (skills and tools
# offered, model parameters) parsed once. tests/service/test_audit.py pins it equal to
# proto_map.step (GetProvenance's steps == ListSteps') on a history with every step kind.


def _values(enum: Any, prefix: str) -> dict[str, Any]:
    return {name.removeprefix(prefix): number for name, number in enum.items()}


_STEP_TYPE = _values(enum_pb2.StepType, "STEP_TYPE_")
_STEP_STATUS = _values(enum_pb2.StepStatus, "STEP_STATUS_")
_ERROR_CLASS = _values(enum_pb2.ErrorClass, "ERROR_CLASS_")
_CANDIDATE_REASON = _values(enum_pb2.CandidateReason, "CANDIDATE_REASON_")
_DECISION = _values(enum_pb2.PermissionDecision, "PERMISSION_DECISION_")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_CACHE_LIMIT = 4096
_parsed: dict[str, Any] = {}
_parameters: dict[str, Any] = {}


def _set_time(value: dt.datetime | None, stamp: Any) -> None:
    if value is not None:
        delta = value - _EPOCH
        stamp.seconds = delta.days * 86400 + delta.seconds
        stamp.nanos = delta.microseconds * 1000


def _shared_json(text: str) -> Any:
    """Parsed JSON of a text that repeats across steps; callers only read the result."""
    value = _parsed.get(text)
    if value is None:
        value = json.loads(text)
        if len(_parsed) < _CACHE_LIMIT:
            _parsed[text] = value
    return value


def step_proto(row: Any) -> mpb.Step:
    """``proto_map.step(row)``, faster, for a run's steps in bulk (see above)."""
    out = mpb.Step(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        turn_id=row.turn_id,
        sequence=row.sequence,
        type=_STEP_TYPE.get(row.type, 0),
        operation=row.operation,
        status=_STEP_STATUS.get(row.status, 0),
        idempotency_key=row.idempotency_key,
        input_ref=row.input_ref,
        output_ref=row.output_ref,
        summary=row.summary,
        error_class=_ERROR_CLASS.get(row.error_class, 0),
        error_message=row.error_message,
        retryable=row.retryable,
        retry_of_step_id=row.retry_of_step_id,
        side_effect=row.side_effect,
        input_revision=row.input_revision,
        tool_name=row.tool_name,
        approval_step_id=row.approval_step_id,
        completion_check=row.completion_check,
    )
    _set_time(row.start_time, out.start_time)
    _set_time(row.end_time, out.end_time)
    usage = out.usage
    usage.input_tokens, usage.output_tokens, usage.cost_usd = (
        row.input_tokens,
        row.output_tokens,
        row.cost_usd,
    )
    versions = out.versions
    versions.system_prompt_digest = row.system_prompt_digest
    versions.context_digest = row.context_digest
    if row.model_policy_digest:
        model = versions.model
        model.policy_digest = row.model_policy_digest
        model.candidate_name = row.candidate_name
        model.reason = _CANDIDATE_REASON.get(row.candidate_reason, 0)
        model.provider = row.provider
        model.requested_model_id = row.requested_model_id
        model.reported_model_id = row.reported_model_id
        parameters = _parameters.get(row.parameters_json)
        if parameters is None:
            parameters = type(model.parameters)()
            parameters.update(json.loads(row.parameters_json))
            if len(_parameters) < _CACHE_LIMIT:
                _parameters[row.parameters_json] = parameters
        model.parameters.CopyFrom(parameters)
    if row.skills_json != "[]":
        for skill in _shared_json(row.skills_json):
            versions.skills.add(
                name=skill["name"], version=skill["version"], digest=skill["digest"]
            )
    if row.tools_json != "[]":
        for tool in _shared_json(row.tools_json):
            versions.tools.add(
                name=tool["name"],
                version=tool["version"],
                digest=tool["digest"],
                schema_digest=tool["schema_digest"],
                decision=_DECISION.get(tool.get("decision", ""), 0),
            )
    if row.consumed_input_ids_json != "[]":
        out.consumed_input_ids.extend(json.loads(row.consumed_input_ids_json))
    if row.tool_name:
        out.tool_arguments.update(json.loads(row.tool_arguments_json))
    if row.approval_decision:
        approval = out.approval
        approval.decision = enum_pb2.ApprovalDecision.Value(
            f"APPROVAL_DECISION_{row.approval_decision}"
        )
        approval.approver = row.approver
        approval.comment = row.approval_comment
        _set_time(row.approval_time, approval.resolve_time)
    return out
