"""The registry log's Merkle tree: RFC 6962 / RFC 9162 hashing, proofs and their checks.

Pure: no database, no I/O. The hashing is RFC 9162 section 2.1.1 (SHA-256; a leaf is
``H(0x00 || data)``, an interior node ``H(0x01 || left || right)``, the split at the largest
power of two smaller than the size); proofs are built as RFC 6962 section 2.1.1 (``PATH``) and
2.1.2 (``SUBPROOF``) define them, and checked with RFC 9162's algorithms (sections 2.1.3.2 and
2.1.4.2), so a proof made here verifies in any RFC 9162 verifier and the reverse.

The server keeps the hash of every *complete* subtree (``2**level`` leaves starting at a
multiple of ``2**level``); every hash a root or a proof needs is one of those or is combined
from them along the tree's right edge (:func:`subtree_hash`). A caller asks first which
stored nodes a proof needs (:func:`nodes_for_inclusion` …), reads them in one query, then
builds the proof from them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

#: A stored complete subtree: (level, index): ``2**level`` leaves from ``index * 2**level``.
NodeKey = tuple[int, int]
NodeSource = Callable[[int, int], bytes]

HASH_SIZE = 32
_EMPTY = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof does not verify, or its inputs are out of range (the message says which)."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(size: int) -> int:
    """The largest power of two smaller than ``size`` (``size`` > 1)."""
    return 1 << ((size - 1).bit_length() - 1)


def subtree_hash(lo: int, hi: int, node: NodeSource) -> bytes:
    """MTH(D[lo:hi]) for a range the RFC's recursion visits (``lo`` aligned to the largest
    power of two not above ``hi - lo``), from the stored complete subtrees."""
    size = hi - lo
    if size == 0:
        return _EMPTY
    if size & (size - 1) == 0 and lo % size == 0:
        level = size.bit_length() - 1
        return node(level, lo >> level)
    k = _split(size)
    return node_hash(subtree_hash(lo, lo + k, node), subtree_hash(lo + k, hi, node))


def root(size: int, node: NodeSource) -> bytes:
    """The root hash of the tree's first ``size`` leaves (the SHA-256 of nothing when empty)."""
    return subtree_hash(0, size, node)


def inclusion_proof(index: int, size: int, node: NodeSource) -> list[bytes]:
    """RFC 6962 ``PATH(index, D[size])``: leaf to root, nearest sibling first."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of {size}")
    return _path(index, 0, size, node)


def _path(index: int, lo: int, hi: int, node: NodeSource) -> list[bytes]:
    if hi - lo <= 1:
        return []
    k = _split(hi - lo)
    if index < lo + k:
        return [*_path(index, lo, lo + k, node), subtree_hash(lo + k, hi, node)]
    return [*_path(index, lo + k, hi, node), subtree_hash(lo, lo + k, node)]


def consistency_proof(old_size: int, new_size: int, node: NodeSource) -> list[bytes]:
    """RFC 6962 ``PROOF(old_size, D[new_size])``; empty when either size is 0 or they are equal."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"a tree of {old_size} cannot be a prefix of one of {new_size}")
    if old_size == 0 or old_size == new_size:
        return []
    return _subproof(old_size, 0, new_size, True, node)


def _subproof(m: int, lo: int, hi: int, whole: bool, node: NodeSource) -> list[bytes]:
    size = hi - lo
    if m == size:
        return [] if whole else [subtree_hash(lo, hi, node)]
    k = _split(size)
    if m <= k:
        return [*_subproof(m, lo, lo + k, whole, node), subtree_hash(lo + k, hi, node)]
    return [*_subproof(m - k, lo + k, hi, False, node), subtree_hash(lo, lo + k, node)]


def needed_nodes(build: Callable[[NodeSource], object]) -> set[NodeKey]:
    """The stored nodes ``build`` reads: it is run once over placeholder hashes, and which
    nodes a root or a proof reads depends only on the sizes, never on the hashes."""
    keys: set[NodeKey] = set()

    def record(level: int, index: int) -> bytes:
        keys.add((level, index))
        return _EMPTY

    build(record)
    return keys


def from_mapping(nodes: Mapping[NodeKey, bytes]) -> NodeSource:
    def node(level: int, index: int) -> bytes:
        try:
            return nodes[(level, index)]
        except KeyError:
            raise ProofError(f"the log has no node ({level}, {index})") from None

    return node


def completed_nodes(index: int, leaf: bytes, node: NodeSource) -> list[tuple[int, int, bytes]]:
    """The nodes leaf ``index`` completes, itself first: (level, index, hash) for level 0 and
    every level whose subtree ends with it (``index + 1`` a multiple of ``2**level``)."""
    out = [(0, index, leaf)]
    current, level, position = leaf, 0, index
    while position & 1:
        current = node_hash(node(level, position - 1), current)
        level, position = level + 1, position >> 1
        out.append((level, position, current))
    return out


def prefix_nodes(size: int) -> list[NodeKey]:
    """The complete subtrees that make up the first ``size`` leaves, left to right (the
    binary decomposition of ``size``): what a verifier needs to extend them with leaves."""
    keys: list[NodeKey] = []
    start = 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size & (1 << level):
            keys.append((level, start >> level))
            start += 1 << level
    return keys


class CompactRange:
    """A verifier's view of a tree's first leaves: one hash per complete subtree of the binary
    decomposition of its size. Start from the prefix a server sent (:func:`prefix_nodes`), add
    the leaves that follow, and :meth:`root` must equal the signed root: so a list of entries
    is proven to be the log's, none left out or added, without one proof per entry."""

    def __init__(self, size: int, hashes: Sequence[bytes]) -> None:
        keys = prefix_nodes(size)
        if len(hashes) != len(keys):
            raise ProofError(f"a prefix of {size} leaves has {len(keys)} hashes, not {len(hashes)}")
        self.size = size
        self._stack: list[tuple[int, bytes]] = [
            (k[0], h) for k, h in zip(keys, hashes, strict=True)
        ]

    def append(self, leaf: bytes) -> None:
        level, current = 0, leaf
        while self._stack and self._stack[-1][0] == level:
            current = node_hash(self._stack.pop()[1], current)
            level += 1
        self._stack.append((level, current))
        self.size += 1

    @property
    def hashes(self) -> list[bytes]:
        """The hashes it holds, largest subtree first (those of ``prefix_nodes(size)``)."""
        return [h for _, h in self._stack]

    def extend(self, leaves: Iterable[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        if not self._stack:
            return _EMPTY
        current = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            current = node_hash(left, current)
        return current


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root_hash: bytes
) -> None:
    """RFC 9162 section 2.1.3.2; raises :class:`ProofError` unless the leaf is in the tree."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the inclusion proof is shorter than the tree is deep")
    if r != root_hash:
        raise ProofError(f"leaf {index} is not in the tree of {size} with this root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 section 2.1.4.2; raises :class:`ProofError` unless the tree of ``old_size``
    with ``old_root`` is a prefix of the tree of ``new_size`` with ``new_root``."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"a tree of {old_size} cannot be a prefix of one of {new_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("trees of one size need an empty consistency proof")
        if old_root != new_root:
            raise ProofError(f"two different roots for a tree of {old_size}")
        return
    if old_size == 0:
        if proof:
            raise ProofError("an empty tree needs an empty consistency proof")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the consistency proof is shorter than the tree is deep")
    if fr != old_root:
        raise ProofError(f"the tree of {old_size} is not the one with this root")
    if sr != new_root:
        raise ProofError(f"the tree of {new_size} does not extend the tree of {old_size}")
