"""The registry: publish agent definitions from bundle files, read, tag and diff them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt_core.bundle import Bundle, load
from agentrt_sdk.paging import collect
from agentrt_sdk.transport import Connection


@dataclass(frozen=True)
class Published:
    """What :meth:`Registry.publish` did: the agent version, whether it is new, and each
    component with whether it was new (identical content is published once)."""

    agent_version: rmsg.AgentVersion
    created: bool
    components: list[tuple[rmsg.Component, bool]] = field(default_factory=list)
    tag: rmsg.Tag | None = None


class Registry:
    """``RegistryService`` calls (docs/api.md; the protos document each field)."""

    def __init__(self, connection: Connection) -> None:
        self._c = connection

    async def publish(
        self,
        bundle: Bundle | str | Path,
        *,
        provenance: rmsg.Provenance | None = None,
        tag: str | None = None,
    ) -> Published:
        """Publish a bundle (a YAML file as ``agentrt publish`` reads it, or a parsed
        :class:`agentrt_core.bundle.Bundle`): its components in file order, then its agent,
        then move ``tag`` to it. Publishing content already published changes nothing."""
        if not isinstance(bundle, Bundle):
            bundle = load(bundle)
        agent, _ = bundle.require_agent()
        components = []
        for component in bundle.components:
            response = await self.publish_component(component.proto, provenance=provenance)
            components.append((response.component, response.created))
        answer = await self.publish_agent(agent, provenance=provenance)
        version = answer.agent_version
        moved = None
        if tag:
            moved = await self.set_tag(version.agent_id, tag, version.digest, provenance=provenance)
        return Published(version, answer.created, components, moved)

    async def publish_component(
        self, component: rmsg.ComponentDraft, *, provenance: rmsg.Provenance | None = None
    ) -> rpb.PublishComponentResponse:
        """Publish one component (``created`` is false when identical content was there)."""
        return await self._c.unary(
            "registry",
            "PublishComponent",
            rpb.PublishComponentRequest(component=component, provenance=provenance),
            rpb.PublishComponentResponse,
        )

    async def publish_agent(
        self, definition: rmsg.AgentDefinition, *, provenance: rmsg.Provenance | None = None
    ) -> rpb.PublishAgentVersionResponse:
        """Publish an agent version whose components are published already; an identical
        re-publish answers ``created`` false and keeps the first publish's provenance."""
        return await self._c.unary(
            "registry",
            "PublishAgentVersion",
            rpb.PublishAgentVersionRequest(definition=definition, provenance=provenance),
            rpb.PublishAgentVersionResponse,
        )

    async def get(self, ref: str) -> rmsg.AgentVersion:
        """An agent version by ``agent:tag``, ``agent@label`` or digest."""
        return (await self.resolve(ref)).agent_version

    async def resolve(self, ref: str) -> rpb.GetAgentVersionResponse:
        """An agent version and how ``ref`` resolved to it (``resolution``: by tag, label or
        digest, the tag's event, when)."""
        return await self._c.unary(
            "registry",
            "GetAgentVersion",
            rpb.GetAgentVersionRequest(ref=ref),
            rpb.GetAgentVersionResponse,
        )

    async def get_component(self, ref: str) -> rmsg.Component:
        response = await self._c.unary(
            "registry",
            "GetComponent",
            rpb.GetComponentRequest(ref=ref),
            rpb.GetComponentResponse,
        )
        return response.component

    async def components(self, name: str) -> list[rmsg.Component]:
        """Every published version of the component ``name``."""
        return await collect(
            self._c,
            "registry",
            "ListComponents",
            rpb.ListComponentsRequest(name=name),
            "components",
        )

    async def versions(self, agent_id: str) -> list[rmsg.AgentVersion]:
        return await collect(
            self._c,
            "registry",
            "ListAgentVersions",
            rpb.ListAgentVersionsRequest(agent_id=agent_id),
            "agent_versions",
        )

    async def set_tag(
        self,
        agent_id: str,
        tag: str,
        digest: str,
        *,
        expected_digest: str | None = None,
        expect_absent: bool = False,
        reason: str = "",
        provenance: rmsg.Provenance | None = None,
    ) -> rmsg.Tag:
        """Point ``tag`` at ``digest``; with an expectation, only if the tag still points where
        the caller last saw it (ABORTED otherwise: :class:`AbortedError`)."""
        moved = await self.move_tag(
            agent_id,
            tag,
            digest,
            expected_digest=expected_digest,
            expect_absent=expect_absent,
            reason=reason,
            provenance=provenance,
        )
        return moved.tag

    async def move_tag(
        self,
        agent_id: str,
        tag: str,
        digest: str,
        *,
        expected_digest: str | None = None,
        expect_absent: bool = False,
        actor: str = "",
        reason: str = "",
        provenance: rmsg.Provenance | None = None,
    ) -> rpb.SetTagResponse:
        """:meth:`set_tag`, answering the whole response: ``event`` is unset when nothing was
        written (the tag already pointed at ``digest``, so a retried call succeeds), and
        ``actor`` is a display label recorded beside the authenticated principal."""
        request = rpb.SetTagRequest(
            agent_id=agent_id,
            tag=tag,
            digest=digest,
            actor=actor,
            reason=reason,
            provenance=provenance,
        )
        if expected_digest is not None:
            request.expected_digest = expected_digest
        elif expect_absent:
            request.expect_absent = True
        return await self._c.unary("registry", "SetTag", request, rpb.SetTagResponse)

    async def delete_tag(
        self, agent_id: str, tag: str, *, expected_digest: str = "", reason: str = ""
    ) -> rmsg.TagEvent:
        response = await self._c.unary(
            "registry",
            "DeleteTag",
            rpb.DeleteTagRequest(
                agent_id=agent_id, tag=tag, expected_digest=expected_digest, reason=reason
            ),
            rpb.DeleteTagResponse,
        )
        return response.event

    async def tags(self, agent_id: str) -> list[rmsg.Tag]:
        return await collect(
            self._c, "registry", "ListTags", rpb.ListTagsRequest(agent_id=agent_id), "tags"
        )

    async def tag_history(self, agent_id: str, tag: str = "") -> list[rmsg.TagEvent]:
        return await collect(
            self._c,
            "registry",
            "ListTagHistory",
            rpb.ListTagHistoryRequest(agent_id=agent_id, tag=tag),
            "events",
        )

    async def diff(self, base_ref: str, target_ref: str) -> rpb.DiffAgentVersionsResponse:
        return await self._c.unary(
            "registry",
            "DiffAgentVersions",
            rpb.DiffAgentVersionsRequest(base_ref=base_ref, target_ref=target_ref),
            rpb.DiffAgentVersionsResponse,
        )

    async def digest(self, definition: rmsg.AgentDefinition) -> rpb.ComputeDigestResponse:
        """The digest the registry would give ``definition`` (nothing is stored)."""
        return await self._c.unary(
            "registry",
            "ComputeDigest",
            rpb.ComputeDigestRequest(agent_definition=definition),
            rpb.ComputeDigestResponse,
        )

    # the registry log (docs/audit.md); agentrt_sdk.transparency checks what these return

    async def signing_keys(self) -> list[rmsg.SigningKey]:
        response = await self._c.unary(
            "registry", "GetSigningKeys", rpb.GetSigningKeysRequest(), rpb.GetSigningKeysResponse
        )
        return list(response.keys)

    async def checkpoint(self) -> rmsg.Checkpoint:
        response = await self._c.unary(
            "registry", "GetCheckpoint", rpb.GetCheckpointRequest(), rpb.GetCheckpointResponse
        )
        return response.checkpoint

    async def inclusion_proof(
        self, *, digest: str = "", index: int | None = None, tree_size: int = 0
    ) -> rmsg.LogInclusion:
        request = rpb.GetInclusionProofRequest(tree_size=tree_size)
        if index is not None:
            request.index = index
        else:
            request.digest = digest
        response = await self._c.unary(
            "registry", "GetInclusionProof", request, rpb.GetInclusionProofResponse
        )
        return response.inclusion

    async def consistency_proof(
        self, old_size: int, new_size: int
    ) -> rpb.GetConsistencyProofResponse:
        return await self._c.unary(
            "registry",
            "GetConsistencyProof",
            rpb.GetConsistencyProofRequest(old_size=old_size, new_size=new_size),
            rpb.GetConsistencyProofResponse,
        )

    async def log_entries(self, start: int, end: int = 0) -> rpb.GetLogEntriesResponse:
        return await self._c.unary(
            "registry",
            "GetLogEntries",
            rpb.GetLogEntriesRequest(start=start, end=end),
            rpb.GetLogEntriesResponse,
        )

    async def agent_card(self, ref: str) -> rpb.GetAgentCardResponse:
        """The version ``ref`` names as a signed A2A Agent Card (``agentrt_core.agent_card``
        verifies it)."""
        return await self._c.unary(
            "registry", "GetAgentCard", rpb.GetAgentCardRequest(ref=ref), rpb.GetAgentCardResponse
        )
