"""Checking what a registry log server says, with nothing but its public key: the rules a
verifier applies (``agentrt verify``, the offline bundle check, the tests).

Pure: signatures, hashes, proofs. Each check raises :class:`VerificationError` naming what
failed, or returns what is now proven. The log's formats are in ``merkle``,
``signed_note`` and ``log_entries``; docs/audit.md says how a stranger repeats these steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrt_core import merkle
from agentrt_core.log_entries import TAG, Leaf, LeafError, parse_leaf
from agentrt_core.signed_note import Checkpoint, NoteError, Verifier, open_checkpoint


class VerificationError(ValueError):
    """The server's answer does not prove what it claims; the message says which part."""


def checkpoint(note: str, verifiers: Sequence[Verifier], origin: str = "") -> Checkpoint:
    """The checkpoint of a note signed by one of ``verifiers`` (of log ``origin``, if given)."""
    try:
        return open_checkpoint(note, list(verifiers), origin)
    except NoteError as exc:
        raise VerificationError(f"checkpoint: {exc}") from None


def leaf(data: bytes) -> Leaf:
    try:
        return parse_leaf(data)
    except LeafError as exc:
        raise VerificationError(f"log entry: {exc}") from None


@dataclass(frozen=True)
class ProvenEntry:
    """An entry proven to be in the log of the signed ``checkpoint``."""

    index: int
    leaf: Leaf
    checkpoint: Checkpoint


def inclusion(
    *,
    note: str,
    verifiers: Sequence[Verifier],
    index: int,
    leaf_data: bytes,
    tree_size: int,
    hashes: Sequence[bytes],
    origin: str = "",
) -> ProvenEntry:
    """The entry, if the signed checkpoint's tree holds it at ``index``."""
    signed = checkpoint(note, verifiers, origin)
    if signed.size != tree_size:
        raise VerificationError(
            f"the proof is for a tree of {tree_size}, the checkpoint of {signed.size}"
        )
    parsed = leaf(leaf_data)
    try:
        merkle.verify_inclusion(
            index, tree_size, merkle.leaf_hash(leaf_data), hashes, signed.root_hash
        )
    except merkle.ProofError as exc:
        raise VerificationError(f"inclusion proof: {exc}") from None
    return ProvenEntry(index, parsed, signed)


def consistency(old: Checkpoint, new: Checkpoint, hashes: Sequence[bytes]) -> None:
    """That ``old`` is a prefix of ``new``: the server has not rewritten or forked what it
    showed before (a smaller ``new`` is a rollback)."""
    if old.origin != new.origin:
        raise VerificationError(f"the log {new.origin!r} is not the log {old.origin!r} seen before")
    if new.size < old.size:
        raise VerificationError(
            f"rollback: the log has {new.size} entries, but {old.size} were seen before"
        )
    try:
        merkle.verify_consistency(old.size, new.size, old.root_hash, new.root_hash, hashes)
    except merkle.ProofError as exc:
        raise VerificationError(
            f"split view: the log of {new.size} entries is not consistent with the {old.size} "
            f"seen before ({exc})"
        ) from None


class EntryRange:
    """Entries read in order from ``start`` and proven together against a signed root: the
    hashes of the subtrees before ``start``, then each leaf, must make the checkpoint's root;
    so no entry was left out, changed or added (``GetLogEntries``)."""

    def __init__(self, start: int, prefix_hashes: Sequence[bytes]) -> None:
        try:
            self._range = merkle.CompactRange(start, prefix_hashes)
        except merkle.ProofError as exc:
            raise VerificationError(f"log entries: {exc}") from None
        self.leaves: list[tuple[int, Leaf]] = []

    @property
    def end(self) -> int:
        return self._range.size

    def add(self, index: int, data: bytes) -> None:
        if index != self._range.size:
            raise VerificationError(f"log entries: entry {index} where {self._range.size} was due")
        self.leaves.append((index, leaf(data)))
        self._range.append(merkle.leaf_hash(data))

    def check(self, signed: Checkpoint) -> None:
        if signed.size != self._range.size:
            raise VerificationError(
                f"log entries: they end at {self._range.size}, the checkpoint at {signed.size}"
            )
        if self._range.root() != signed.root_hash:
            raise VerificationError(
                "log entries: they do not make the checkpoint's root (one was changed, left "
                "out or added)"
            )


def tag_target_now(
    moves: Sequence[tuple[int, Leaf]], agent_id: str, tag: str, set_at: int
) -> str | None:
    """The digest the tag points at after the entries ``moves`` (those after entry
    ``set_at``, which set the target a client was served): None if none of them moved it.
    A later move means the server served an old target under a tag it has since moved."""
    target: str | None = None
    for index, entry in moves:
        f = entry.fields
        if index > set_at and entry.type == TAG and f["agent_id"] == agent_id and f["tag"] == tag:
            target = str(f["to_digest"])
    return target
