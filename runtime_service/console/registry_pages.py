"""The console's registry pages: agent versions and their provenance, tags and every move of
each, and a side-by-side diff of two versions — each a RegistryService call (or a few) as the
signed-in principal, like every page of the console."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web

from agentrt.registry.v1 import enum_pb2 as registry_enums
from agentrt.registry.v1 import registry_service_pb2 as rpb
from runtime_service.console.sessions import SESSION
from runtime_service.console.views import enum_name

if TYPE_CHECKING:
    from runtime_service.console.web import Console

#: Versions and tag moves a page shows (the rest a page further, by the API's tokens).
PAGE_SIZE: Final = 50


class RegistryPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/registry", self.versions),
            web.get("/registry/agents/{agent_id}", self.agent),
            web.get("/registry/agents/{agent_id}/tags/{tag}", self.tag_history),
            web.get("/registry/versions/{ref}", self.version),
            web.get("/registry/diff", self.diff),
        ]

    async def versions(self, request: web.Request) -> web.StreamResponse:
        """Every agent's versions, newest publish first, and the tags as they are now."""
        session, api = request[SESSION], self.c.api
        listed = await api.call(
            session,
            api.registry.ListAgentVersions,
            rpb.ListAgentVersionsRequest(
                page_size=PAGE_SIZE, page_token=request.query.get("page", "")
            ),
        )
        tags = await api.call(session, api.registry.ListTags, rpb.ListTagsRequest(page_size=1000))
        return self.c.render(
            request,
            "registry.html",
            versions=list(listed.agent_versions),
            next_page=listed.next_page_token,
            tags=list(tags.tags),
        )

    async def agent(self, request: web.Request) -> web.StreamResponse:
        session, api = request[SESSION], self.c.api
        agent_id = request.match_info["agent_id"]
        listed = await api.call(
            session,
            api.registry.ListAgentVersions,
            rpb.ListAgentVersionsRequest(
                agent_id=agent_id, page_size=PAGE_SIZE, page_token=request.query.get("page", "")
            ),
        )
        tags = await api.call(
            session,
            api.registry.ListTags,
            rpb.ListTagsRequest(agent_id=agent_id, page_size=1000),
        )
        return self.c.render(
            request,
            "agent.html",
            agent_id=agent_id,
            versions=list(listed.agent_versions),
            next_page=listed.next_page_token,
            tags=list(tags.tags),
        )

    async def tag_history(self, request: web.Request) -> web.StreamResponse:
        """Every recorded move and deletion of one tag, newest first (kept forever)."""
        session, api = request[SESSION], self.c.api
        agent_id, tag = request.match_info["agent_id"], request.match_info["tag"]
        history = await api.call(
            session,
            api.registry.ListTagHistory,
            rpb.ListTagHistoryRequest(
                agent_id=agent_id,
                tag=tag,
                page_size=PAGE_SIZE,
                page_token=request.query.get("page", ""),
            ),
        )
        return self.c.render(
            request,
            "tag_history.html",
            agent_id=agent_id,
            tag=tag,
            events=list(history.events),
            next_page=history.next_page_token,
        )

    async def version(self, request: web.Request) -> web.StreamResponse:
        """One version, by any reference: its definition, the closure it pins (each
        component's version and digest) and who published it, from where."""
        session, api = request[SESSION], self.c.api
        got = await api.call(
            session,
            api.registry.GetAgentVersion,
            rpb.GetAgentVersionRequest(ref=request.match_info["ref"]),
        )
        closure = got.agent_version.closure
        components = [
            closure.system_prompt,
            closure.model_policy,
            *closure.skills,
            *closure.tools,
            closure.permission_policy,
            closure.completion_policy,
        ]
        return self.c.render(
            request,
            "version.html",
            version=got.agent_version,
            resolution=got.resolution,
            components=[c for c in components if c.digest],
        )

    async def diff(self, request: web.Request) -> web.StreamResponse:
        """Two versions, part by part over their resolved closures: what changed, base
        beside target."""
        base = request.query.get("base", "").strip()
        target = request.query.get("target", "").strip()
        changes = None
        if base and target:
            session, api = request[SESSION], self.c.api
            changes = await api.call(
                session,
                api.registry.DiffAgentVersions,
                rpb.DiffAgentVersionsRequest(base_ref=base, target_ref=target),
            )
        return self.c.render(request, "diff.html", base=base, target=target, changes=changes)


def register_filters(filters: dict[str, object]) -> None:
    filters.update(
        {
            "component_kind": lambda v: enum_name(
                v, registry_enums.ComponentKind, "COMPONENT_KIND_"
            ),
            "change_type": lambda v: enum_name(v, registry_enums.ChangeType, "CHANGE_TYPE_"),
            "tag_event": lambda v: enum_name(v, registry_enums.TagEventType, "TAG_EVENT_TYPE_"),
            "reference_kind": lambda v: enum_name(
                v, registry_enums.ReferenceKind, "REFERENCE_KIND_"
            ),
        }
    )
