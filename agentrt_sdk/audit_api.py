"""Audit: provenance, usages, chain verification and exported bundles."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

from google.protobuf.message import Message

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import message_pb2 as amsg
from agentrt_sdk.paging import collect
from agentrt_sdk.transport import Connection


def _set_one(request: Message, **fields: str) -> None:
    """Set the one field of ``request``'s oneof that the caller named (ValueError unless
    exactly one is non-empty: the server would refuse it INVALID_ARGUMENT anyway)."""
    named = [(name, value) for name, value in fields.items() if value]
    if len(named) != 1:
        raise ValueError(f"{type(request).__name__}: give exactly one of {', '.join(fields)}")
    setattr(request, *named[0])


class Audit:
    """``AuditService`` calls (docs/audit.md)."""

    def __init__(self, connection: Connection) -> None:
        self._c = connection

    async def provenance(
        self,
        *,
        run_id: str = "",
        step_id: str = "",
        artifact_id: str = "",
        blob_digest: str = "",
        max_steps: int = 0,
    ) -> apb.GetProvenanceResponse:
        """The provenance of exactly one of a run, step, artifact or blob."""
        request = apb.GetProvenanceRequest(max_steps=max_steps)
        _set_one(
            request,
            run_id=run_id,
            step_id=step_id,
            artifact_id=artifact_id,
            blob_digest=blob_digest,
        )
        return await self._c.unary("audit", "GetProvenance", request, apb.GetProvenanceResponse)

    async def find_usages(
        self,
        *,
        component_ref: str = "",
        tool_schema_digest: str = "",
        agent_digest: str = "",
        model_id: str = "",
        model_match: int = amsg.MODEL_MATCH_UNSPECIFIED,
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
        limit: int | None = None,
    ) -> list[amsg.UsageRecord]:
        """Runs and steps that used exactly one of a component, a tool schema, an agent
        version or a model (``model_match``: requested or reported ids), newest first."""
        request = _usages_request(
            component_ref,
            tool_schema_digest,
            agent_digest,
            model_id,
            model_match,
            start_time,
            end_time,
        )
        return await collect(self._c, "audit", "FindUsages", request, "usages", limit)

    async def find_usages_page(
        self,
        *,
        component_ref: str = "",
        tool_schema_digest: str = "",
        agent_digest: str = "",
        model_id: str = "",
        model_match: int = amsg.MODEL_MATCH_UNSPECIFIED,
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> apb.FindUsagesResponse:
        """One page of :meth:`find_usages`, with the token of the next (for a caller that
        hands a listing's continuation to a person, as ``agentrt audit usages`` does)."""
        request = _usages_request(
            component_ref,
            tool_schema_digest,
            agent_digest,
            model_id,
            model_match,
            start_time,
            end_time,
        )
        request.page_size = page_size
        request.page_token = page_token
        return await self._c.unary("audit", "FindUsages", request, apb.FindUsagesResponse)

    async def verify(self, run_id: str) -> apb.VerifyRunResponse:
        """Re-derive the run's hash chain and served rows (``intact`` says if they agree)."""
        return await self._c.unary(
            "audit", "VerifyRun", apb.VerifyRunRequest(run_id=run_id), apb.VerifyRunResponse
        )

    async def export_bundle(
        self, run_id: str, *, format: int = apb.BUNDLE_FORMAT_JSON
    ) -> tuple[apb.BundleInfo, bytes]:
        """The run's offline-verifiable bundle and its info (digest checked by the caller
        with ``agentrt audit verify-bundle``)."""
        info = apb.BundleInfo()
        parts: list[bytes] = []
        async for response in self.export_parts(run_id, format=format):
            if response.HasField("info"):
                info.CopyFrom(response.info)
            else:
                parts.append(response.chunk)
        return info, b"".join(parts)

    def export_parts(
        self, run_id: str, *, format: int = apb.BUNDLE_FORMAT_JSON, timeout: float | None = None
    ) -> AsyncIterator[apb.ExportBundleResponse]:
        """:meth:`export_bundle` as the server streams it: the ``info`` part (size, digest),
        then the chunks, for a caller that shows progress; ``timeout`` bounds the whole
        stream (default: none)."""
        request = apb.ExportBundleRequest(run_id=run_id, format=format)  # type: ignore[arg-type]
        return self._c.stream_out("audit", "ExportBundle", request, call_timeout=timeout)


def _usages_request(
    component_ref: str,
    tool_schema_digest: str,
    agent_digest: str,
    model_id: str,
    model_match: int,
    start_time: dt.datetime | None,
    end_time: dt.datetime | None,
) -> apb.FindUsagesRequest:
    request = apb.FindUsagesRequest(model_match=model_match)  # type: ignore[arg-type]
    _set_one(
        request,
        component_ref=component_ref,
        tool_schema_digest=tool_schema_digest,
        agent_digest=agent_digest,
        model_id=model_id,
    )
    if start_time is not None:
        request.start_time.FromDatetime(start_time)
    if end_time is not None:
        request.end_time.FromDatetime(end_time)
    return request
