"""gRPC adapter of the registry: proto in, use case, proto out. No rules live here."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agentrt.registry.v1 import message_pb2, registry_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_base.auth import TagPolicy
from agentrt_base.db import Database
from agentrt_core import registry_map as pm
from agentrt_core.errors import InvalidArgument
from agentrt_core.lru import LruCache
from agentrt_core.model import AgentVersion
from registry import log_map as lm
from registry import log_store
from registry.attestations import AttestationsService
from registry.service import RegistryService
from registry.service_tags import TagsService
from registry.transparency import RegistryLog

Context = Any  # grpc.aio.ServicerContext; the handlers never touch it (errors are raised)


class RegistryServicer(registry_service_pb2_grpc.RegistryServiceServicer):
    """``agentrt.registry.v1.RegistryService``."""

    def __init__(
        self,
        database: Database,
        log: RegistryLog,
        tag_policies: Callable[[], Sequence[TagPolicy]] = lambda: (),
    ) -> None:
        self._service = RegistryService(database)
        self._log = log
        self._attestations = AttestationsService(database, log)
        self._tags = TagsService(database, tag_policies)
        # Serialised AgentVersion messages without their (mutable) tags, by digest: the
        # version itself never changes, and rebuilding ~60 closure entries per call was most
        # of GetAgentVersion's cost.
        self._version_protos: LruCache[str, bytes] = LruCache(1024)

    def _version_proto(self, version: AgentVersion) -> message_pb2.AgentVersion:
        cached = self._version_protos.get(version.digest)
        if cached is None:
            cached = pm.agent_version_to_proto(replace(version, tags=())).SerializeToString()
            self._version_protos.put(version.digest, cached)
        message = message_pb2.AgentVersion.FromString(cached)
        message.tags.extend(version.tags)
        return message

    async def PublishComponent(
        self, request: pb.PublishComponentRequest, context: Context
    ) -> pb.PublishComponentResponse:
        component, created, proof = await self._service.publish_component(
            pm.draft_from_proto(request.component),
            pm.provenance_from_proto(request.provenance),
            request.request_id,
        )
        return pb.PublishComponentResponse(
            component=pm.component_to_proto(component),
            created=created,
            log_inclusion=self._inclusion(proof),
        )

    async def GetComponent(
        self, request: pb.GetComponentRequest, context: Context
    ) -> pb.GetComponentResponse:
        component = await self._service.get_component(request.ref)
        return pb.GetComponentResponse(component=pm.component_to_proto(component))

    async def ListComponents(
        self, request: pb.ListComponentsRequest, context: Context
    ) -> pb.ListComponentsResponse:
        kind = pm.kind_from_proto(request.kind, "kind") if request.kind else None
        page = await self._service.list_components(
            kind, request.name, request.page_size, request.page_token
        )
        return pb.ListComponentsResponse(
            components=[pm.component_to_proto(c) for c in page.items],
            next_page_token=page.next_page_token,
        )

    async def PublishAgentVersion(
        self, request: pb.PublishAgentVersionRequest, context: Context
    ) -> pb.PublishAgentVersionResponse:
        version, created, proof = await self._service.publish_agent_version(
            pm.definition_from_proto(request.definition),
            pm.provenance_from_proto(request.provenance),
            request.request_id,
        )
        return pb.PublishAgentVersionResponse(
            agent_version=self._version_proto(version),
            created=created,
            log_inclusion=self._inclusion(proof),
        )

    async def GetAgentVersion(
        self, request: pb.GetAgentVersionRequest, context: Context
    ) -> pb.GetAgentVersionResponse:
        version, resolution = await self._service.get_agent_version(request.ref)
        return pb.GetAgentVersionResponse(
            agent_version=self._version_proto(version),
            resolution=pm.resolution_to_proto(resolution),
        )

    async def ListAgentVersions(
        self, request: pb.ListAgentVersionsRequest, context: Context
    ) -> pb.ListAgentVersionsResponse:
        page = await self._service.list_agent_versions(
            request.agent_id, request.page_size, request.page_token
        )
        return pb.ListAgentVersionsResponse(
            agent_versions=[self._version_proto(v) for v in page.items],
            next_page_token=page.next_page_token,
        )

    async def ComputeDigest(
        self, request: pb.ComputeDigestRequest, context: Context
    ) -> pb.ComputeDigestResponse:
        target = request.WhichOneof("target")
        if target == "agent_definition":
            computed = await self._service.compute_agent_digest(
                pm.definition_from_proto(request.agent_definition)
            )
        elif target == "component":
            computed = await self._service.compute_component_digest(
                pm.draft_from_proto(request.component)
            )
        else:
            raise InvalidArgument.for_field("target", "required: agent_definition or component")
        response = pb.ComputeDigestResponse(
            digest=computed.digest,
            canonical_json=computed.canonical,
            schema_digest=computed.schema_digest or "",
            existing_digest=computed.existing_digest,
        )
        if computed.closure:
            response.closure.CopyFrom(pm.closure_to_proto(computed.closure))
        return response

    async def SetTag(self, request: pb.SetTagRequest, context: Context) -> pb.SetTagResponse:
        expectation = request.WhichOneof("expectation")
        tag, event, proof = await self._tags.set_tag(
            request.agent_id,
            request.tag,
            request.digest,
            expected_digest=request.expected_digest if expectation == "expected_digest" else None,
            expect_absent=expectation == "expect_absent" and request.expect_absent,
            actor=request.actor,
            reason=request.reason,
            provenance=pm.provenance_from_proto(request.provenance),
        )
        response = pb.SetTagResponse(tag=pm.tag_to_proto(tag))
        if event is not None:
            response.event.CopyFrom(pm.tag_event_to_proto(event))
        if proof is not None:
            response.log_inclusion.CopyFrom(self._inclusion(proof))
        return response

    async def DeleteTag(
        self, request: pb.DeleteTagRequest, context: Context
    ) -> pb.DeleteTagResponse:
        event, proof = await self._tags.delete_tag(
            request.agent_id,
            request.tag,
            expected_digest=request.expected_digest,
            actor=request.actor,
            reason=request.reason,
            provenance=pm.provenance_from_proto(request.provenance),
        )
        return pb.DeleteTagResponse(
            event=pm.tag_event_to_proto(event), log_inclusion=self._inclusion(proof)
        )

    async def ListTags(self, request: pb.ListTagsRequest, context: Context) -> pb.ListTagsResponse:
        page = await self._tags.list_tags(request.agent_id, request.page_size, request.page_token)
        return pb.ListTagsResponse(
            tags=[pm.tag_to_proto(t) for t in page.items], next_page_token=page.next_page_token
        )

    async def ListTagHistory(
        self, request: pb.ListTagHistoryRequest, context: Context
    ) -> pb.ListTagHistoryResponse:
        page = await self._tags.list_tag_history(
            request.agent_id, request.tag, request.page_size, request.page_token
        )
        return pb.ListTagHistoryResponse(
            events=[pm.tag_event_to_proto(e) for e in page.items],
            next_page_token=page.next_page_token,
        )

    async def DiffAgentVersions(
        self, request: pb.DiffAgentVersionsRequest, context: Context
    ) -> pb.DiffAgentVersionsResponse:
        base, target, changes = await self._service.diff_agent_versions(
            request.base_ref, request.target_ref
        )
        return pb.DiffAgentVersionsResponse(
            base_digest=base, target_digest=target, changes=[pm.change_to_proto(c) for c in changes]
        )

    # the registry log

    def _inclusion(self, proof: log_store.Proof) -> message_pb2.LogInclusion:
        return lm.inclusion_to_proto(self._log.signed(proof))

    async def GetAgentCard(
        self, request: pb.GetAgentCardRequest, context: Context
    ) -> pb.GetAgentCardResponse:
        version, _ = await self._service.get_agent_version(request.ref)
        card = self._log.card(version)
        return pb.GetAgentCardResponse(
            card=json.dumps(card, ensure_ascii=False, sort_keys=True), digest=version.digest
        )

    async def AttachAttestation(
        self, request: pb.AttachAttestationRequest, context: Context
    ) -> pb.AttachAttestationResponse:
        attached = await self._attestations.attach(
            request.agent_id, request.digest, request.envelope, request.statement
        )
        return pb.AttachAttestationResponse(
            attestation=lm.attestation_to_proto(attached.row),
            created=attached.created,
            log_inclusion=self._inclusion(attached.proof),
        )

    async def ListAttestations(
        self, request: pb.ListAttestationsRequest, context: Context
    ) -> pb.ListAttestationsResponse:
        page = await self._attestations.list(
            request.digest, request.predicate_type, request.page_size, request.page_token
        )
        return pb.ListAttestationsResponse(
            attestations=[lm.attestation_to_proto(r) for r in page.items],
            next_page_token=page.next_page_token,
        )

    async def GetSigningKeys(
        self, request: pb.GetSigningKeysRequest, context: Context
    ) -> pb.GetSigningKeysResponse:
        return pb.GetSigningKeysResponse(keys=lm.keys_to_proto(self._log.keys))

    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: Context
    ) -> pb.GetCheckpointResponse:
        checkpoint = await self._log.checkpoint()
        return pb.GetCheckpointResponse(checkpoint=lm.checkpoint_to_proto(checkpoint))

    async def GetInclusionProof(
        self, request: pb.GetInclusionProofRequest, context: Context
    ) -> pb.GetInclusionProofResponse:
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument.for_field("target", "required: index or digest")
        inclusion = await self._log.inclusion(
            index=request.index if target == "index" else None,
            digest=request.digest,
            tree_size=request.tree_size,
        )
        return pb.GetInclusionProofResponse(inclusion=lm.inclusion_to_proto(inclusion))

    async def GetConsistencyProof(
        self, request: pb.GetConsistencyProofRequest, context: Context
    ) -> pb.GetConsistencyProofResponse:
        proof = await self._log.consistency(request.old_size, request.new_size)
        return pb.GetConsistencyProofResponse(
            old_size=proof.old_size,
            new_size=proof.new_size,
            hashes=list(proof.hashes),
            checkpoint=lm.checkpoint_to_proto(proof.checkpoint),
        )

    async def GetLogEntries(
        self, request: pb.GetLogEntriesRequest, context: Context
    ) -> pb.GetLogEntriesResponse:
        found = await self._log.entries(request.start, request.end)
        return pb.GetLogEntriesResponse(
            entries=[lm.entry_to_proto(i, leaf) for i, leaf in found.entries],
            prefix_hashes=list(found.prefix_hashes),
            checkpoint=lm.checkpoint_to_proto(found.checkpoint),
        )
