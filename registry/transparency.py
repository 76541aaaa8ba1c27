"""The registry log's use cases: open it, sign its checkpoints, prove inclusion and
consistency, hand out its entries.

Appending is not here: each publish and tag move appends its own entry in its own transaction
(``log_store.append``, called by ``registry/service.py`` and ``service_tags.py``). Everything
here reads, in one read transaction per call, and signs outside it. Ed25519 is deterministic,
so the checkpoint of a given size is the same note however often it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.db import Database
from agentrt_base.signing_keys import KeyFiles, SigningKeys
from agentrt_core import agent_card, merkle
from agentrt_core.errors import InvalidArgument, NotFound, OutOfRange, ViolationCollector
from agentrt_core.log_entries import Leaf, agent_version_leaf, component_leaf, tag_leaf
from agentrt_core.model import AgentVersion, TagEvent
from agentrt_core.signed_note import Checkpoint, check_key_name, sign_note
from registry import log_store, store
from registry.service_common import digest_field

#: Entries one GetLogEntries call returns at most.
MAX_ENTRIES = 1000


@dataclass(frozen=True)
class SignedCheckpoint:
    note: str
    checkpoint: Checkpoint


@dataclass(frozen=True)
class Inclusion:
    proof: log_store.Proof
    checkpoint: SignedCheckpoint


@dataclass(frozen=True)
class Consistency:
    old_size: int
    new_size: int
    hashes: tuple[bytes, ...]
    checkpoint: SignedCheckpoint


@dataclass(frozen=True)
class Entries:
    start: int
    entries: tuple[tuple[int, bytes], ...]
    prefix_hashes: tuple[bytes, ...]
    checkpoint: SignedCheckpoint


class RegistryLog:
    """The log of one database, signed by one set of keys."""

    def __init__(self, database: Database, keys: SigningKeys, origin: str) -> None:
        self._db = database
        self.keys = keys
        self.origin = origin

    def sign(self, size: int, root: bytes) -> SignedCheckpoint:
        checkpoint = Checkpoint(self.origin, size, root)
        return SignedCheckpoint(sign_note(checkpoint.text(), self.keys.signer), checkpoint)

    def card(self, version: AgentVersion) -> dict[str, Any]:
        """The version as an A2A Agent Card signed with the log's key."""
        unsigned = agent_card.card(
            agent_id=version.agent_id,
            version_label=version.version_label,
            description=version.definition.description,
            digest=version.digest,
            closure=version.closure,
            log_origin=self.origin,
            url=f"urn:agentrt:{version.agent_id}@{version.digest}",
        )
        return agent_card.sign(unsigned, self.keys.signer)

    def signed(self, proof: log_store.Proof) -> Inclusion:
        """A proof made in a write transaction, with its checkpoint signed."""
        return Inclusion(proof, self.sign(proof.tree_size, proof.root))

    async def checkpoint(self) -> SignedCheckpoint:
        current = await self._db.read(_head)
        return self.sign(current.size, current.root)

    async def inclusion(self, *, index: int | None, digest: str, tree_size: int) -> Inclusion:
        if tree_size < 0:
            raise InvalidArgument.for_field(
                "tree_size", "tree_size is 0 (the current size) or more"
            )
        if index is not None and index < 0:
            raise InvalidArgument.for_field("index", "an entry's index is 0 or more")
        if index is None:
            problems = ViolationCollector()
            digest_field(digest, "digest", problems)
            problems.raise_if_any()
        proof = await self._db.read(lambda s: _inclusion(s, index, digest, tree_size))
        return self.signed(proof)

    async def consistency(self, old_size: int, new_size: int) -> Consistency:
        if old_size < 0:
            raise InvalidArgument.for_field("old_size", "old_size is 0 or more")
        if new_size < 0:
            raise InvalidArgument.for_field("new_size", "new_size is 0 (the current size) or more")
        if new_size and old_size > new_size:
            raise InvalidArgument.for_field(
                "old_size", f"old_size {old_size} is above new_size {new_size}"
            )

        def read(session: Session) -> tuple[int, tuple[bytes, ...], bytes]:
            size = _size_within(session, new_size, "new_size")
            if old_size > size:
                raise OutOfRange("old_size", f"old_size {old_size} is past the log's {size}")
            node = _loaded(
                session,
                lambda n: (merkle.consistency_proof(old_size, size, n), merkle.root(size, n)),
            )
            return (
                size,
                tuple(merkle.consistency_proof(old_size, size, node)),
                merkle.root(size, node),
            )

        size, hashes, root = await self._db.read(read)
        return Consistency(old_size, size, hashes, self.sign(size, root))

    async def entries(self, start: int, end: int) -> Entries:
        if start < 0:
            raise InvalidArgument.for_field("start", "start is 0 or more")
        if end < 0 or (end and end <= start):
            raise InvalidArgument.for_field("end", "end is 0 (the log's size) or above start")

        def read(session: Session) -> tuple[list[tuple[int, bytes]], tuple[bytes, ...], bytes]:
            size = _head(session).size
            if start >= size:
                raise OutOfRange("start", f"start {start} is at or past the log's size {size}")
            stop = min(end or size, size, start + MAX_ENTRIES)
            rows = list(log_store.entries(session, start, stop))
            prefix_keys = merkle.prefix_nodes(start)
            known = log_store.nodes(
                session, [*prefix_keys, *merkle.needed_nodes(lambda n: merkle.root(stop, n))]
            )
            node = merkle.from_mapping(known)
            return rows, tuple(node(*k) for k in prefix_keys), merkle.root(stop, node)

        rows, prefix, root = await self._db.read(read)
        return Entries(start, tuple(rows), prefix, self.sign(start + len(rows), root))


def _head(session: Session) -> log_store.Head:
    current = log_store.head(session)
    if current is None:
        raise RuntimeError("the registry log has no head row (the server creates it at start)")
    return current


def _size_within(session: Session, requested: int, field: str) -> int:
    size = _head(session).size
    if requested > size:
        raise OutOfRange(field, f"{field} {requested} is past the log's size {size}")
    return requested or size


def _loaded(session: Session, build: Callable[[merkle.NodeSource], object]) -> merkle.NodeSource:
    """The stored nodes ``build`` reads, read in one query."""
    keys = merkle.needed_nodes(build)
    return merkle.from_mapping(log_store.nodes(session, keys))


def _inclusion(session: Session, index: int | None, digest: str, tree_size: int) -> log_store.Proof:
    if index is None:
        found = log_store.publish_entry(session, digest)
        if found is None:
            raise NotFound("log entry", digest, f"no entry of the registry log published {digest}")
        index, leaf = found
    else:
        leaf_or_none = log_store.entry_leaf(session, index)
        size = _head(session).size
        if leaf_or_none is None or index >= size:
            raise OutOfRange("index", f"index {index} is past the log's size {size}")
        leaf = leaf_or_none
    return inclusion_in(session, index, leaf, tree_size)


def inclusion_in(session: Session, index: int, leaf: bytes, tree_size: int = 0) -> log_store.Proof:
    """The proof of entry ``index`` in a tree of ``tree_size`` (0: the current size), read in
    the caller's transaction (a publish that found its content already published proves
    the earlier entry in its own transaction)."""
    size = _size_within(session, tree_size, "tree_size")
    if index >= size:
        raise InvalidArgument.for_field(
            "tree_size", f"a tree of {size} entries does not hold entry {index}; ask for more"
        )
    node = _loaded(
        session, lambda n: (merkle.inclusion_proof(index, size, n), merkle.root(size, n))
    )
    hashes = tuple(merkle.inclusion_proof(index, size, node))
    return log_store.Proof(index, leaf, size, hashes, merkle.root(size, node))


# -- opening the log: its head, and the history it inherits --------------------------------


def open_registry_log(
    database: Database, keys: KeyFiles, configured_origin: str | None, installation_id: str
) -> RegistryLog:
    """The log a server serves, created on its first start (blocking; run at start)."""
    try:
        origin = database.write_sync(
            lambda s: open_log(s, configured_origin or "", default_origin(installation_id))
        )
    except sa.exc.IntegrityError:  # another replica created it at the same moment
        origin = database.write_sync(
            lambda s: open_log(s, configured_origin or "", default_origin(installation_id))
        )
    return RegistryLog(database, keys.named(origin), origin)


def open_log(session: Session, configured: str, default: str) -> str:
    """The log's origin, creating the log (named ``configured`` or else ``default``) when
    there is none; a log keeps the origin it was created with, so a different one configured
    later is refused (ValueError).

    A registry that existed before the log (an upgrade) has its history appended first, in
    the order it happened: components, agent versions and tag moves by time."""
    current = log_store.head(session)
    if current is not None:
        if configured and current.origin != configured:
            raise ValueError(
                f"the registry log's origin is {current.origin!r}; a log keeps its origin, "
                f"so --log-origin {configured!r} is refused"
            )
        return current.origin
    origin = configured or default
    check_key_name(origin)  # the keys are named after it
    log_store.create_head(session, origin)
    history = [leaf for _, leaf in sorted(_history(session), key=lambda item: item[0])]
    if history:
        log_store.append(session, *history)
    return origin


def _history(session: Session) -> list[tuple[tuple[object, int, str], Leaf]]:
    out: list[tuple[tuple[object, int, str], Leaf]] = []
    for c in session.scalars(sa.select(store.ComponentRow)):
        leaf = component_leaf(
            digest=c.digest,
            kind=c.kind,
            name=c.name,
            version=c.version,
            principal=c.principal,
            time=c.publish_time,
        )
        out.append(((c.publish_time, 0, c.digest), leaf))
    for v in session.scalars(sa.select(store.AgentVersionRow)):
        leaf = agent_version_leaf(
            digest=v.digest,
            agent_id=v.agent_id,
            version_label=v.version_label,
            principal=v.principal,
            time=v.publish_time,
        )
        out.append(((v.publish_time, 1, v.digest), leaf))
    for e in session.scalars(sa.select(store.TagEventRow)):
        key = (e.event_time, 2, f"{e.agent_id}:{e.sequence:020d}")
        out.append((key, tag_event_leaf(store.tag_event_of(e))))
    return out


def tag_event_leaf(event: TagEvent) -> Leaf:
    return tag_leaf(
        event=event.type,
        agent_id=event.agent_id,
        tag=event.tag,
        sequence=event.sequence,
        from_digest=event.from_digest,
        to_digest=event.to_digest,
        principal=event.actor,
        time=event.event_time,
    )


def default_origin(installation_id: str) -> str:
    return f"agentrt/{installation_id}"
