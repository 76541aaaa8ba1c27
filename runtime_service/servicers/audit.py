"""gRPC adapter of ``agentrt.audit.v1.AuditService``: proto in, use case, proto out.

Every RPC only reads (see :mod:`runtime_service.services.audit`). A bundle's bytes are built
beside this, in :mod:`runtime_service.servicers.audit_export`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from agentrt.audit.v1 import audit_service_pb2 as pb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.audit.v1 import message_pb2 as apb
from agentrt.runtime.v1 import enum_pb2
from agentrt_base.access import VISIBLE
from agentrt_core import registry_map
from agentrt_core.audit_bundle import Format
from agentrt_core.audit_chain import ChainReport
from agentrt_core.audit_rows import RowReport
from agentrt_core.proto_json import enum_name, enum_value, time_or_none
from registry.transparency import RegistryLog
from runtime_service import proto_map as pm
from runtime_service.servicers import audit_export
from runtime_service.services.attestations import RunAttester, bundle_evidence
from runtime_service.services.audit import AuditService, ProvenanceRecord, TargetKind
from runtime_service.services.context import Runtime
from runtime_service.services.usages import ModelMatch, QueryKind, Usage, UsageQuery, UsageService

Context = Any

#: The size of the ``chunk`` messages a bundle streams in.
BUNDLE_CHUNK = 1024 * 1024

_FORMATS: dict[str, Format] = {"": "json", "JSON": "json", "JSONL": "jsonl"}
_FORMAT_ENUM = {"json": pb.BUNDLE_FORMAT_JSON, "jsonl": pb.BUNDLE_FORMAT_JSONL}


class AuditServicer(audit_service_pb2_grpc.AuditServiceServicer):
    """``agentrt.audit.v1.AuditService``."""

    def __init__(self, runtime: Runtime, attester: RunAttester, log: RegistryLog) -> None:
        self._audit = AuditService(runtime)
        self._usages = UsageService(runtime)
        self._attester = attester
        self._log = log

    async def GetRunAttestation(
        self, request: pb.GetRunAttestationRequest, context: Context
    ) -> pb.GetRunAttestationResponse:
        found = await self._attester.attestation(request.run_id)
        return pb.GetRunAttestationResponse(envelope=found.envelope, final=found.final)

    async def GetProvenance(
        self, request: pb.GetProvenanceRequest, context: Context
    ) -> pb.GetProvenanceResponse:
        kind: TargetKind = request.WhichOneof("target") or "run_id"
        found = await self._audit.provenance(
            kind, getattr(request, kind), request.max_steps, VISIBLE.get()
        )
        return pb.GetProvenanceResponse(
            records=[_record(r) for r in found.records],
            blob_references=[
                apb.BlobReference(
                    digest=b.digest,
                    role=enum_value(apb.BlobRole, "BLOB_ROLE_", b.role),
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
        usages, token = await self._usages.find_usages(
            query, VISIBLE.get(), request.page_size, request.page_token
        )
        return pb.FindUsagesResponse(usages=[_usage(u) for u in usages], next_page_token=token)

    async def VerifyRun(
        self, request: pb.VerifyRunRequest, context: Context
    ) -> pb.VerifyRunResponse:
        verification = await self._audit.verify_run(request.run_id)
        rows = await asyncio.to_thread(audit_export.compare_rows, verification)
        return _verify_response(verification.chain, rows)

    async def ExportBundle(
        self, request: pb.ExportBundleRequest, context: Context
    ) -> AsyncIterator[pb.ExportBundleResponse]:
        name = enum_name(pb.BundleFormat, "BUNDLE_FORMAT_", request.format, "format")
        fmt = _FORMATS[name]
        contents = await self._audit.bundle_contents(request.run_id)
        evidence = await bundle_evidence(
            self._attester, self._log, contents.run.id, contents.run.agent_digest
        )
        # Mapped and encoded on a worker thread, so a large bundle never blocks the loop.
        bundle = await asyncio.to_thread(audit_export.export, contents, fmt, evidence)
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
        steps=[pm.step(s) for s in r.steps],
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
        step_type=enum_value(enum_pb2.StepType, "STEP_TYPE_", u.step_type),
        attempt_id=u.attempt_id,
        agent_digest=u.agent_digest,
        matched=u.matched,
        time=pm.timestamp(u.time),
    )


def _verify_response(report: ChainReport, rows: RowReport) -> pb.VerifyRunResponse:
    out = pb.VerifyRunResponse(
        intact=report.intact and not rows.mismatches,
        event_count=report.event_count,
        head_hash=report.head_hash,
        row_mismatches=[
            apb.RowMismatch(
                kind=m.kind, id=m.id, field=m.field, stored=m.stored, committed=m.committed
            )
            for m in rows.mismatches
        ],
        rows_checked=rows.rows_checked,
        not_covered=rows.not_covered,
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
