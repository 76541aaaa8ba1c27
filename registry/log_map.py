"""The registry log's values as protobuf messages (``registry/transparency.py`` → proto)."""

from __future__ import annotations

from agentrt.registry.v1 import message_pb2
from agentrt_base.signing_keys import SigningKeys
from agentrt_core import registry_map as pm
from agentrt_core.proto_json import to_timestamp
from registry import log_store, store
from registry.attestation_store import AttestationRow
from registry.transparency import Inclusion, SignedCheckpoint


def checkpoint_to_proto(signed: SignedCheckpoint) -> message_pb2.Checkpoint:
    c = signed.checkpoint
    return message_pb2.Checkpoint(
        note=signed.note, origin=c.origin, tree_size=c.size, root_hash=c.root_hash
    )


def entry_to_proto(index: int, leaf: bytes) -> message_pb2.LogEntry:
    return message_pb2.LogEntry(index=index, leaf=leaf)


def inclusion_to_proto(inclusion: Inclusion) -> message_pb2.LogInclusion:
    proof: log_store.Proof = inclusion.proof
    return message_pb2.LogInclusion(
        entry=entry_to_proto(proof.index, proof.leaf),
        tree_size=proof.tree_size,
        hashes=list(proof.hashes),
        checkpoint=checkpoint_to_proto(inclusion.checkpoint),
    )


def keys_to_proto(keys: SigningKeys) -> list[message_pb2.SigningKey]:
    return [
        message_pb2.SigningKey(
            key_id=v.key_id,
            verifier_key=v.encode(),
            public_key=v.public_key,
            active=v == keys.signer.verifier,
        )
        for v in keys.verifiers
    ]


def attestation_to_proto(row: AttestationRow) -> message_pb2.VersionAttestation:
    out = message_pb2.VersionAttestation(
        id=row.id,
        agent_digest=row.agent_digest,
        predicate_type=row.predicate_type,
        principal=row.principal,
        key_id=row.key_id,
        envelope=row.envelope,
        attach_time=to_timestamp(row.attach_time),
        log_index=row.log_index,
    )
    verified = store.verified(row.verified_json)
    if verified is not None:
        out.verified.CopyFrom(pm.verified_provenance_to_proto(verified))
    return out
