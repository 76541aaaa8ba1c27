"""The console's audit pages: a record's provenance drawn as the chain that produced it
(artifact → step → attempt → run → agent version → components), where a component or model
was used, and a run's audit bundle to download — each an AuditService call as the signed-in
principal. The run page's verdict (VerifyRun) is asked for by ``web.Pages.run``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import quote

from aiohttp import web

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import message_pb2 as amsg
from runtime_service.console.sessions import SESSION

if TYPE_CHECKING:
    from runtime_service.console.web import Console

#: Usages a page shows (the rest a page further, by the API's tokens).
PAGE_SIZE: Final = 50
#: What a provenance query may name, as the query string names it.
TARGETS: Final = ("run", "step", "artifact", "blob")
#: What a usage search may look for.
QUERIES: Final = {
    "component": "component_ref",
    "schema": "tool_schema_digest",
    "agent": "agent_digest",
    "model": "model_id",
}
FORMATS: Final = {"json": apb.BUNDLE_FORMAT_JSON, "jsonl": apb.BUNDLE_FORMAT_JSONL}


class AuditPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/audit/provenance", self.provenance),
            web.get("/audit/usages", self.usages),
            web.get("/runs/{run_id}/bundle", self.bundle),
        ]

    async def provenance(self, request: web.Request) -> web.StreamResponse:
        """What produced a run, step, artifact or blob: each record's chain, newest first."""
        named = [(key, request.query.get(key, "").strip()) for key in TARGETS]
        target = next(((key, value) for key, value in named if value), None)
        records = references = None
        if target is not None:
            key, value = target
            field = {"run": "run_id", "step": "step_id", "artifact": "artifact_id"}.get(
                key, "blob_digest"
            )
            got = await self.c.api.call(
                request[SESSION],
                self.c.api.audit.GetProvenance,
                apb.GetProvenanceRequest(**{field: value}, max_steps=20),
            )
            records, references = list(got.records), list(got.blob_references)
        return self.c.render(
            request,
            "provenance.html",
            target=target,
            records=records,
            references=references,
        )

    async def usages(self, request: web.Request) -> web.StreamResponse:
        """Which steps used a component version, a tool schema, an agent version or a model."""
        asked = next(
            (
                (key, request.query.get(key, "").strip())
                for key in QUERIES
                if request.query.get(key)
            ),
            None,
        )
        found = None
        if asked is not None:
            key, value = asked
            message = apb.FindUsagesRequest(
                page_size=PAGE_SIZE, page_token=request.query.get("page", "")
            )
            setattr(message, QUERIES[key], value)  # one field of the request's oneof
            found = await self.c.api.call(request[SESSION], self.c.api.audit.FindUsages, message)
        return self.c.render(
            request,
            "usages.html",
            asked=asked,
            usages=list(found.usages) if found is not None else None,
            next_page=found.next_page_token if found is not None else "",
            queries=list(QUERIES),
        )

    async def bundle(self, request: web.Request) -> web.StreamResponse:
        """The run's audit bundle as a file (ExportBundle's bytes, streamed as they come)."""
        run_id = request.match_info["run_id"]
        fmt = FORMATS.get(request.query.get("format", "json"))
        if fmt is None:
            raise web.HTTPBadRequest(text="format: json or jsonl")
        api, session = self.c.api, request[SESSION]
        parts = api.stream(
            session, api.audit.ExportBundle, apb.ExportBundleRequest(run_id=run_id, format=fmt)
        )
        first = await anext(parts)  # refused (not found, not permitted) before any byte
        info = first.info
        extension = "jsonl" if fmt == apb.BUNDLE_FORMAT_JSONL else "json"
        response = web.StreamResponse(
            headers={
                "Content-Type": info.media_type or "application/json",
                "Content-Disposition": (
                    f"attachment; filename*=UTF-8''{quote(f'agentrt-run-{run_id}.{extension}')}"
                ),
                "X-Agentrt-Bundle-Digest": info.digest,
            }
        )
        if info.size:
            response.content_length = info.size
        await response.prepare(request)
        async for part in parts:
            await response.write(part.chunk)
        await response.write_eof()
        return response


def register_filters(filters: dict[str, object]) -> None:
    filters["blob_role"] = lambda value: amsg.BlobRole.Name(value).removeprefix("BLOB_ROLE_")
