"""The registry log's worked example (docs/audit.md, tests/vectors/log/registry_log.json):
three entries, their leaf hashes, the checkpoint signed by a published test key, an inclusion
and a consistency proof, rebuilt here from the formats' definitions and compared byte for
byte with the committed file, which the Node verifier checks too (tests/polyglot/node).

Regenerate after a deliberate format change: ``python -m tests.unit.test_log_vector``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentrt_core import log_verify, merkle
from agentrt_core.log_entries import agent_version_leaf, component_leaf, tag_leaf
from agentrt_core.signed_note import Checkpoint, Signer, Verifier, open_checkpoint, sign_note

VECTOR = Path(__file__).resolve().parents[1] / "vectors" / "log" / "registry_log.json"
#: A key for examples only: its private half is public (bytes 0..31).
SEED = bytes(range(32))
ORIGIN = "example.com/agentrt-log"
TIME = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
AGENT = "sha256:" + "ab" * 32
TOOL = "sha256:" + "cd" * 32


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def build() -> dict[str, Any]:
    leaves = [
        component_leaf(
            digest=TOOL, kind="TOOL", name="read_file", version="1", principal="ci", time=TIME
        ),
        agent_version_leaf(
            digest=AGENT, agent_id="coding_agent", version_label="v1", principal="ci", time=TIME
        ),
        tag_leaf(
            event="SET",
            agent_id="coding_agent",
            tag="prod",
            sequence=1,
            from_digest="",
            to_digest=AGENT,
            principal="release-bot",
            time=TIME,
        ),
    ]
    hashes = [merkle.leaf_hash(leaf.data) for leaf in leaves]
    nodes: dict[merkle.NodeKey, bytes] = {}
    for index, value in enumerate(hashes):
        source = merkle.from_mapping(nodes)
        for level, position, h in merkle.completed_nodes(index, value, source):
            nodes[(level, position)] = h
    node = merkle.from_mapping(nodes)
    signer = Signer(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    notes = {
        size: sign_note(Checkpoint(ORIGIN, size, merkle.root(size, node)).text(), signer)
        for size in (2, 3)
    }
    return {
        "about": "The registry log's worked example (docs/audit.md). The key is for examples "
        "only: its Ed25519 seed is the bytes 0..31.",
        "private_key_seed_hex": SEED.hex(),
        "verifier_key": signer.verifier.encode(),
        "entries": [
            {"index": i, "leaf": leaf.data.decode(), "leaf_hash_hex": h.hex()}
            for i, (leaf, h) in enumerate(zip(leaves, hashes, strict=True))
        ],
        "checkpoints": {str(size): note for size, note in notes.items()},
        "inclusion": {
            "index": 1,
            "tree_size": 3,
            "hashes_base64": [_b64(h) for h in merkle.inclusion_proof(1, 3, node)],
        },
        "consistency": {
            "old_size": 2,
            "new_size": 3,
            "hashes_base64": [_b64(h) for h in merkle.consistency_proof(2, 3, node)],
        },
    }


def test_the_committed_vector_is_what_the_formats_make() -> None:
    assert json.loads(VECTOR.read_text()) == build()


def test_the_vector_verifies_from_its_own_fields() -> None:
    vector = json.loads(VECTOR.read_text())
    key = Verifier.parse(vector["verifier_key"])
    # The key hash is the spec's: SHA-256(name || "\n" || 0x01 || public key), 4 bytes.
    expected_hash = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + key.public_key).digest()[:4]
    assert key.key_hash == expected_hash
    old = open_checkpoint(vector["checkpoints"]["2"], [key], ORIGIN)
    new = open_checkpoint(vector["checkpoints"]["3"], [key], ORIGIN)
    entry = vector["entries"][1]
    proof = [base64.b64decode(h) for h in vector["inclusion"]["hashes_base64"]]
    proven = log_verify.inclusion(
        note=vector["checkpoints"]["3"],
        verifiers=[key],
        index=1,
        leaf_data=entry["leaf"].encode(),
        tree_size=3,
        hashes=proof,
    )
    assert proven.leaf.fields["agent_id"] == "coding_agent"
    consistency = [base64.b64decode(h) for h in vector["consistency"]["hashes_base64"]]
    log_verify.consistency(old, new, consistency)


if __name__ == "__main__":
    VECTOR.parent.mkdir(parents=True, exist_ok=True)
    VECTOR.write_text(json.dumps(build(), indent=2, ensure_ascii=False) + "\n")
