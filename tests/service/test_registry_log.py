"""The registry log (issue 31, items 1 and 2) through real gRPC on both engines: every publish
and tag move is an entry proven against a signed checkpoint; inclusion, consistency and entry
ranges verify with nothing but the published key; malformed or out-of-range requests are
refused with the field named; concurrent publishes append one consistent log (replicas on
PostgreSQL: tests/e2e/test_runtime_replicas.py)."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from agentrt.registry.v1 import message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_core import log_verify
from agentrt_core.log_entries import AGENT_VERSION, COMPONENT, TAG
from agentrt_core.signed_note import Checkpoint
from tests import registry_data as data
from tests.log_support import current, proven, publish_agent, trusted, unique
from tests.support import error_details, rpc_error


@pytest.fixture(autouse=True)
def policy(stub: Any) -> None:
    """The model policy the agents refer to (publishing it again is idempotent)."""
    stub.PublishComponent(pb.PublishComponentRequest(component=data.model_policy()), timeout=10)


def test_every_publish_and_tag_move_is_a_proven_entry(stub: Any) -> None:
    keys = trusted(stub)
    name = unique("lookup")
    component = stub.PublishComponent(
        pb.PublishComponentRequest(component=data.tool(name, "1")), timeout=10
    )
    entry = proven(component.log_inclusion, keys)
    assert entry.leaf.type == COMPONENT
    assert entry.leaf.fields["digest"] == component.component.digest
    assert (entry.leaf.fields["name"], entry.leaf.fields["version"]) == (name, "1")

    agent = unique("agent")
    version = publish_agent(stub, agent, "v1")
    entry = proven(version.log_inclusion, keys)
    assert entry.leaf.type == AGENT_VERSION
    assert entry.leaf.fields["digest"] == version.agent_version.digest
    assert entry.leaf.fields["agent_id"] == agent

    moved = stub.SetTag(
        pb.SetTagRequest(agent_id=agent, tag="prod", digest=version.agent_version.digest),
        timeout=10,
    )
    entry = proven(moved.log_inclusion, keys)
    assert entry.leaf.type == TAG
    assert entry.leaf.fields["event"] == "SET" and entry.leaf.fields["sequence"] == 1
    assert entry.leaf.fields["to_digest"] == version.agent_version.digest

    # Setting it where it already points writes no event and no entry.
    again = stub.SetTag(
        pb.SetTagRequest(agent_id=agent, tag="prod", digest=version.agent_version.digest),
        timeout=10,
    )
    assert not again.HasField("log_inclusion") and not again.HasField("event")

    deleted = stub.DeleteTag(pb.DeleteTagRequest(agent_id=agent, tag="prod"), timeout=10)
    entry = proven(deleted.log_inclusion, keys)
    assert entry.leaf.fields["event"] == "DELETE" and entry.leaf.fields["to_digest"] == ""


def test_republishing_proves_the_first_entry(stub: Any) -> None:
    keys = trusted(stub)
    agent = unique("agent")
    first = publish_agent(stub, agent, "v1")
    publish_agent(stub, unique("other"), "v1")
    second = publish_agent(stub, agent, "v1")
    assert not second.created
    assert second.log_inclusion.entry.index == first.log_inclusion.entry.index
    assert second.log_inclusion.tree_size > first.log_inclusion.tree_size
    proven(second.log_inclusion, keys)


def test_inclusion_by_digest_and_index_at_any_size(stub: Any) -> None:
    keys = trusted(stub)
    version = publish_agent(stub, unique("agent"), "v1")
    index = version.log_inclusion.entry.index
    publish_agent(stub, unique("agent"), "v1")
    now = current(stub, keys)

    by_digest = stub.GetInclusionProof(
        pb.GetInclusionProofRequest(digest=version.agent_version.digest), timeout=10
    ).inclusion
    assert by_digest.entry.index == index and by_digest.tree_size >= now.size
    proven(by_digest, keys)
    for size in (index + 1, index + 2, now.size):
        at = stub.GetInclusionProof(
            pb.GetInclusionProofRequest(index=index, tree_size=size), timeout=10
        ).inclusion
        assert at.tree_size == size
        assert proven(at, keys).leaf.data == version.log_inclusion.entry.leaf

    # A proof moved to another index, or with a changed hash, does not verify.
    tampered = message_pb2.LogInclusion()
    tampered.CopyFrom(by_digest)
    tampered.hashes[0] = bytes([tampered.hashes[0][0] ^ 1]) + tampered.hashes[0][1:]
    with pytest.raises(log_verify.VerificationError, match="inclusion proof"):
        proven(tampered, keys)
    tampered.CopyFrom(by_digest)
    tampered.entry.index += 1
    with pytest.raises(log_verify.VerificationError):
        proven(tampered, keys)


def test_checkpoints_stay_consistent_as_the_log_grows(stub: Any) -> None:
    keys = trusted(stub)
    before = current(stub, keys)
    for i in range(3):
        publish_agent(stub, unique("agent"), f"v{i}")
    after = current(stub, keys)
    proof = stub.GetConsistencyProof(
        pb.GetConsistencyProofRequest(old_size=before.size, new_size=after.size), timeout=10
    )
    assert log_verify.checkpoint(proof.checkpoint.note, keys) == after
    log_verify.consistency(before, after, list(proof.hashes))
    # Against a history the server did not have, the proof fails: a split view is caught.
    forged = Checkpoint(before.origin, before.size, bytes(32))
    with pytest.raises(log_verify.VerificationError, match="split view"):
        log_verify.consistency(forged, after, list(proof.hashes))
    with pytest.raises(log_verify.VerificationError, match="rollback"):
        log_verify.consistency(after, before, [])


@pytest.mark.parametrize("start", [0, 1, 5])
def test_entry_ranges_make_the_signed_root(stub: Any, start: int) -> None:
    keys = trusted(stub)
    for i in range(4):
        publish_agent(stub, unique("agent"), f"v{i}")
    response = stub.GetLogEntries(pb.GetLogEntriesRequest(start=start), timeout=10)
    signed = log_verify.checkpoint(response.checkpoint.note, keys)
    entries = log_verify.EntryRange(start, list(response.prefix_hashes))
    for entry in response.entries:
        entries.add(entry.index, entry.leaf)
    entries.check(signed)
    # Two entries swapped: every leaf is the log's, but they no longer make the root;
    # one left out: the range ends before the checkpoint does.
    leaves = [e.leaf for e in response.entries]
    leaves[-2], leaves[-1] = leaves[-1], leaves[-2]
    swapped = log_verify.EntryRange(start, list(response.prefix_hashes))
    for index, leaf in enumerate(leaves, start=start):
        swapped.add(index, leaf)
    with pytest.raises(log_verify.VerificationError, match="root"):
        swapped.check(signed)
    short = log_verify.EntryRange(start, list(response.prefix_hashes))
    for index, leaf in enumerate(leaves[:-1], start=start):
        short.add(index, leaf)
    with pytest.raises(log_verify.VerificationError, match="end at"):
        short.check(signed)


def test_a_checkpoint_signed_by_another_key_is_refused(stub: Any) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentrt_core.signed_note import Signer, sign_note

    keys = trusted(stub)
    signed = current(stub, keys)
    forger = Signer(keys[0].name, Ed25519PrivateKey.generate())
    forged = sign_note(Checkpoint(signed.origin, signed.size + 1, bytes(32)).text(), forger)
    with pytest.raises(log_verify.VerificationError, match="none of the trusted keys"):
        log_verify.checkpoint(forged, keys)
    note = stub.GetCheckpoint(pb.GetCheckpointRequest(), timeout=10).checkpoint.note
    changed = note.replace(f"\n{signed.size}\n", f"\n{signed.size + 1}\n", 1)
    with pytest.raises(log_verify.VerificationError, match="does not verify"):
        log_verify.checkpoint(changed, keys)


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (pb.GetInclusionProofRequest(), grpc.StatusCode.INVALID_ARGUMENT, "target"),
        (
            pb.GetInclusionProofRequest(digest="sha256:xyz"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "digest",
        ),
        (pb.GetInclusionProofRequest(index=-1), grpc.StatusCode.INVALID_ARGUMENT, "index"),
        (pb.GetInclusionProofRequest(index=10**12), grpc.StatusCode.OUT_OF_RANGE, "index"),
        (
            pb.GetInclusionProofRequest(index=0, tree_size=10**12),
            grpc.StatusCode.OUT_OF_RANGE,
            "tree_size",
        ),
        (
            pb.GetInclusionProofRequest(index=3, tree_size=2),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tree_size",
        ),
        (
            pb.GetInclusionProofRequest(index=0, tree_size=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tree_size",
        ),
        (pb.GetConsistencyProofRequest(old_size=-1), grpc.StatusCode.INVALID_ARGUMENT, "old_size"),
        (pb.GetConsistencyProofRequest(new_size=-2), grpc.StatusCode.INVALID_ARGUMENT, "new_size"),
        (
            pb.GetConsistencyProofRequest(old_size=3, new_size=2),
            grpc.StatusCode.INVALID_ARGUMENT,
            "old_size",
        ),
        (
            pb.GetConsistencyProofRequest(old_size=1, new_size=10**12),
            grpc.StatusCode.OUT_OF_RANGE,
            "new_size",
        ),
        (pb.GetConsistencyProofRequest(old_size=10**12), grpc.StatusCode.OUT_OF_RANGE, "old_size"),
        (pb.GetLogEntriesRequest(start=-1), grpc.StatusCode.INVALID_ARGUMENT, "start"),
        (pb.GetLogEntriesRequest(start=2, end=2), grpc.StatusCode.INVALID_ARGUMENT, "end"),
        (pb.GetLogEntriesRequest(start=10**12), grpc.StatusCode.OUT_OF_RANGE, "start"),
    ],
)
def test_refusals_name_the_field(
    stub: Any, request_: Any, code: grpc.StatusCode, field: str
) -> None:
    method = {
        pb.GetInclusionProofRequest: stub.GetInclusionProof,
        pb.GetConsistencyProofRequest: stub.GetConsistencyProof,
        pb.GetLogEntriesRequest: stub.GetLogEntries,
    }[type(request_)]
    error = rpc_error(method, request_, timeout=10)
    assert error.code() == code, error.details()
    violations = error_details(error)["BadRequest"].field_violations
    assert [v.field for v in violations] == [field]


def test_an_unpublished_digest_is_not_found(stub: Any) -> None:
    error = rpc_error(
        stub.GetInclusionProof, pb.GetInclusionProofRequest(digest="sha256:" + "0" * 64)
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_concurrent_publishes_append_one_consistent_log(stub: Any) -> None:
    keys = trusted(stub)
    before = current(stub, keys)
    results: list[pb.PublishAgentVersionResponse] = []
    lock = threading.Lock()

    def publish(n: int) -> None:
        for i in range(4):
            response = publish_agent(stub, unique(f"race{n}"), f"v{i}")
            with lock:
                results.append(response)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    indexes = sorted(r.log_inclusion.entry.index for r in results)
    assert len(set(indexes)) == len(indexes) == 24
    for r in results:
        proven(r.log_inclusion, keys)
    after = current(stub, keys)
    proof = stub.GetConsistencyProof(
        pb.GetConsistencyProofRequest(old_size=before.size, new_size=after.size), timeout=10
    )
    log_verify.consistency(before, after, list(proof.hashes))


# -- signed agent cards (issue 31, item 8) -----------------------------------------------------


def test_an_agent_card_is_signed_over_its_canonical_form(stub: Any) -> None:
    """The card verifies with the published key by our check and by PyJWT's (an independent
    JWS implementation: the compact form rebuilt from the card's detached signature); a card
    changed after signing verifies with neither."""
    import base64
    import json

    import jwt
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from agentrt_core import agent_card
    from agentrt_core.jcs import canonical_bytes

    keys = trusted(stub)
    agent = unique("card")
    version = publish_agent(stub, agent, "v1")
    moved = stub.SetTag(
        pb.SetTagRequest(agent_id=agent, tag="prod", digest=version.agent_version.digest),
        timeout=10,
    )
    assert moved.tag.digest == version.agent_version.digest
    response = stub.GetAgentCard(pb.GetAgentCardRequest(ref=f"{agent}:prod"), timeout=10)
    assert response.digest == version.agent_version.digest
    card = json.loads(response.card)
    assert agent_card.verify(card, keys) == keys
    assert (card["name"], card["version"]) == (agent, "v1")
    (extension,) = card["capabilities"]["extensions"]
    assert extension["params"]["digest"] == version.agent_version.digest
    assert extension["params"]["registry_log"] == keys[0].name

    # A detached JWS (RFC 7515, appendix F): put the payload back, and it is a compact JWS.
    (signature,) = card["signatures"]

    def compact(document: dict[str, Any]) -> str:
        payload = canonical_bytes({k: v for k, v in document.items() if k != "signatures"})
        encoded = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        return f"{signature['protected']}.{encoded}.{signature['signature']}"

    public = Ed25519PublicKey.from_public_bytes(keys[0].public_key)
    decoded = jwt.api_jws.PyJWS().decode_complete(compact(card), public, algorithms=["EdDSA"])
    assert decoded["header"]["kid"] == keys[0].key_id

    card["description"] = "Approved by security."
    with pytest.raises(agent_card.CardError, match="does not verify"):
        agent_card.verify(card, keys)
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.api_jws.PyJWS().decode_complete(compact(card), public, algorithms=["EdDSA"])
    error = rpc_error(stub.GetAgentCard, pb.GetAgentCardRequest(ref=f"{agent}:absent"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
