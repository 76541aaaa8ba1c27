"""Helpers of the registry log's tests: trusting the server's key as a client would, and
checking what it proves with agentrt_core.log_verify."""

from __future__ import annotations

import uuid
from typing import Any

from agentrt.registry.v1 import message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_core import log_verify
from agentrt_core.signed_note import Checkpoint, Verifier


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def trusted(stub: Any) -> list[Verifier]:
    keys = stub.GetSigningKeys(pb.GetSigningKeysRequest(), timeout=10).keys
    assert [k.active for k in keys] == [True]
    verifier = Verifier.parse(keys[0].verifier_key)
    assert verifier.key_id == keys[0].key_id and verifier.public_key == keys[0].public_key
    return [verifier]


def proven(inclusion: message_pb2.LogInclusion, keys: list[Verifier]) -> log_verify.ProvenEntry:
    return log_verify.inclusion(
        note=inclusion.checkpoint.note,
        verifiers=keys,
        index=inclusion.entry.index,
        leaf_data=inclusion.entry.leaf,
        tree_size=inclusion.tree_size,
        hashes=list(inclusion.hashes),
    )


def current(stub: Any, keys: list[Verifier]) -> Checkpoint:
    response = stub.GetCheckpoint(pb.GetCheckpointRequest(), timeout=10)
    signed = log_verify.checkpoint(response.checkpoint.note, keys)
    assert (signed.origin, signed.size, signed.root_hash) == (
        response.checkpoint.origin,
        response.checkpoint.tree_size,
        response.checkpoint.root_hash,
    )
    return signed


def publish_agent(stub: Any, agent_id: str, label: str) -> pb.PublishAgentVersionResponse:
    definition = message_pb2.AgentDefinition(
        agent_id=agent_id,
        version_label=label,
        system_prompt=message_pb2.SystemPrompt(text=f"You are {agent_id} {label}."),
        model_policy="coding-balanced@3",
    )
    response: pb.PublishAgentVersionResponse = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(definition=definition), timeout=30
    )
    return response
