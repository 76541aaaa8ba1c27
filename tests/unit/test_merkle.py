"""The registry log's Merkle tree (agentrt_core.merkle): RFC 6962 hashing against published
roots, and every proof of small trees checked against a plain recursive implementation and by
the RFC 9162 verifiers, including that a wrong proof fails."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt_core import merkle

# The leaves and roots of RFC 6962's reference tests (certificate-transparency's
# merkle_tree_test: sizes 1 to 8 of these eight inputs).
LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
]
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


class Log:
    """Leaves appended the way the server appends them: each keeps the nodes it completes."""

    def __init__(self) -> None:
        self.nodes: dict[merkle.NodeKey, bytes] = {}
        self.leaves: list[bytes] = []

    def append(self, data: bytes) -> None:
        index = len(self.leaves)
        self.leaves.append(merkle.leaf_hash(data))
        source = merkle.from_mapping(self.nodes)
        for level, position, value in merkle.completed_nodes(index, self.leaves[-1], source):
            self.nodes[(level, position)] = value

    @property
    def source(self) -> merkle.NodeSource:
        return merkle.from_mapping(self.nodes)


def reference_root(leaves: list[bytes]) -> bytes:
    """MTH as RFC 6962 section 2.1 writes it, over the leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(reference_root(leaves[:k]), reference_root(leaves[k:]))


def grown(size: int) -> Log:
    log = Log()
    for i in range(size):
        log.append(i.to_bytes(4, "big"))
    return log


def test_roots_match_rfc6962_reference_values() -> None:
    log = Log()
    for size, (data, expected) in enumerate(zip(LEAVES, ROOTS, strict=True), start=1):
        log.append(data)
        assert merkle.root(size, log.source).hex() == expected


def test_empty_tree_root_is_sha256_of_nothing() -> None:
    assert merkle.root(0, Log().source) == hashlib.sha256(b"").digest()


@pytest.mark.parametrize("size", range(1, 40))
def test_every_inclusion_and_consistency_proof_of_small_trees(size: int) -> None:
    log = grown(size)
    root = merkle.root(size, log.source)
    assert root == reference_root(log.leaves)
    for index in range(size):
        proof = merkle.inclusion_proof(index, size, log.source)
        merkle.verify_inclusion(index, size, log.leaves[index], proof, root)
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(index, size, merkle.leaf_hash(b"forged"), proof, root)
        if proof:
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(index, size, log.leaves[index], proof[:-1], root)
    for old in range(size + 1):
        old_root = merkle.root(old, log.source)
        proof = merkle.consistency_proof(old, size, log.source)
        merkle.verify_consistency(old, size, old_root, root, proof)
        if 0 < old < size:
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(old, size, merkle.leaf_hash(b"x"), root, proof)
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(old, size, old_root, merkle.leaf_hash(b"x"), proof)


@given(st.integers(1, 5000), st.data())
def test_proofs_read_few_nodes_and_verify(size: int, data: st.DataObject) -> None:
    """What a proof reads is known before reading (needed_nodes), and it is about log2 of the
    size squared at most: the server answers with one query of a few dozen keys."""
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(0, size))
    keys = merkle.needed_nodes(lambda node: merkle.inclusion_proof(index, size, node))
    keys |= merkle.needed_nodes(lambda node: merkle.consistency_proof(old, size, node))
    keys |= merkle.needed_nodes(lambda node: merkle.root(size, node))
    assert len(keys) <= 3 * (size.bit_length() + 1) ** 2


def test_a_wrong_tree_is_not_consistent() -> None:
    one, other = grown(13), Log()
    for i in range(13):
        other.append(b"other" if i == 5 else i.to_bytes(4, "big"))
    proof = merkle.consistency_proof(9, 13, one.source)
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(
            9, 13, merkle.root(9, other.source), merkle.root(13, one.source), proof
        )


@pytest.mark.parametrize("start", [0, 1, 2, 5, 8, 13])
def test_compact_range_extends_a_prefix_to_the_root(start: int) -> None:
    log = grown(21)
    hashes = [log.nodes[key] for key in merkle.prefix_nodes(start)]
    compact = merkle.CompactRange(start, hashes)
    compact.extend(log.leaves[start:])
    assert compact.root() == merkle.root(21, log.source)
    dropped = merkle.CompactRange(start, hashes)
    dropped.extend(log.leaves[start:-2] + log.leaves[-1:])
    assert dropped.root() != merkle.root(20, log.source)


def test_out_of_range_requests_are_refused() -> None:
    log = grown(4)
    with pytest.raises(merkle.ProofError):
        merkle.inclusion_proof(4, 4, log.source)
    with pytest.raises(merkle.ProofError):
        merkle.consistency_proof(5, 4, log.source)
    with pytest.raises(merkle.ProofError):
        merkle.root(5, log.source)
