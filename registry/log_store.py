"""The registry log's tables and queries: its entries, its tree's complete subtrees, its head.

An entry is appended in the transaction of the change it records (``append``, called last in
each publish and tag move), so a change and its entry commit together or not at all. The head
row is the log's one point of order: each append locks it (``FOR UPDATE`` on PostgreSQL; the
SQLite writer is single), so replicas appending at once get consecutive indexes. It keeps
the tree's *frontier* (the hash of each complete subtree of the binary decomposition of the
size), so an append reads nothing else and proves its own entry without another query.

Nothing here is trusted by a verifier: the head is a cache of what the nodes say, the nodes a
cache of what the leaves say. A row changed by hand makes a root that no earlier signed
checkpoint is consistent with (docs/audit.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from agentrt_base.db import Base
from agentrt_core import merkle
from agentrt_core.log_entries import AGENT_VERSION, COMPONENT, Leaf

PUBLISHES = (COMPONENT, AGENT_VERSION)


class LogHeadRow(Base):
    """The log's size, origin and frontier: one row."""

    __tablename__ = "registry_log_head"

    singleton: Mapped[int] = mapped_column(primary_key=True, default=1)
    #: The checkpoint's first line; fixed when the log is created.
    origin: Mapped[str] = mapped_column(sa.String(200))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    #: The hashes of ``merkle.prefix_nodes(size)``, 32 bytes each, largest subtree first.
    frontier: Mapped[bytes] = mapped_column(sa.LargeBinary)


class LogEntryRow(Base):
    __tablename__ = "registry_log_entries"

    position: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(sa.String(32))
    #: The component or agent version a publish entry published (NULL for a tag entry):
    #: how an inclusion proof is asked for by digest.
    subject_digest: Mapped[str | None] = mapped_column(sa.String(71), index=True)
    leaf: Mapped[bytes] = mapped_column(sa.LargeBinary)


class LogNodeRow(Base):
    """The hash of a complete subtree: ``2**level`` leaves from ``position * 2**level``
    (level 0: a leaf hash)."""

    __tablename__ = "registry_log_nodes"

    level: Mapped[int] = mapped_column(sa.SmallInteger, primary_key=True, autoincrement=False)
    position: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(sa.LargeBinary)


@dataclass(frozen=True)
class Head:
    origin: str
    size: int
    frontier: tuple[bytes, ...]

    @property
    def root(self) -> bytes:
        return merkle.CompactRange(self.size, self.frontier).root()


@dataclass(frozen=True)
class Proof:
    """An entry and its audit path in a tree of ``tree_size`` with root ``root``."""

    index: int
    leaf: bytes
    tree_size: int
    hashes: tuple[bytes, ...]
    root: bytes


def _split(blob: bytes) -> tuple[bytes, ...]:
    size = merkle.HASH_SIZE
    return tuple(blob[i : i + size] for i in range(0, len(blob), size))


# Statements built once: an append runs four of them in the writer's transaction, and
# building (and ORM-executing) them per call was most of its cost.
_HEAD_T, _ENTRY_T, _NODE_T = (
    cast(sa.Table, row.__table__) for row in (LogHeadRow, LogEntryRow, LogNodeRow)
)
_READ_HEAD = sa.select(_HEAD_T.c.origin, _HEAD_T.c.size, _HEAD_T.c.frontier).where(
    _HEAD_T.c.singleton == 1
)
_LOCK_HEAD = _READ_HEAD.with_for_update()
_INSERT_ENTRIES = _ENTRY_T.insert()
_INSERT_NODES = _NODE_T.insert()
_MOVE_HEAD = (
    _HEAD_T.update()
    .where(_HEAD_T.c.singleton == 1)
    .values(size=sa.bindparam("new_size"), frontier=sa.bindparam("new_frontier"))
)


def head(session: Session, *, for_update: bool = False) -> Head | None:
    row = session.connection().execute(_LOCK_HEAD if for_update else _READ_HEAD).first()
    return None if row is None else Head(row[0], row[1], _split(row[2]))


def create_head(session: Session, origin: str) -> None:
    """The empty log (raises ``IntegrityError`` when another replica created it first)."""
    session.execute(sa.insert(LogHeadRow).values(singleton=1, origin=origin, size=0, frontier=b""))


def append(session: Session, *leaves: Leaf) -> list[Proof]:
    """Append ``leaves`` in order; each one's index and proof in the tree it ends (the last
    leaf's audit path is the frontier before it, smallest subtree first).

    Call it once, as the transaction's last write: the head's lock is then held only while
    nothing else is waited for. A transaction that took it and then inserted a row another
    publish had inserted first would wait on that publish, which would wait on the head:
    a deadlock PostgreSQL breaks by aborting one of them."""
    current = head(session, for_update=True)
    if current is None:
        raise RuntimeError("the registry log has no head row (the server creates it at start)")
    size, frontier = current.size, list(current.frontier)
    proofs, entries, nodes = [], [], []
    for leaf in leaves:
        leaf_hash = merkle.leaf_hash(leaf.data)
        known = dict(zip(merkle.prefix_nodes(size), frontier, strict=True))
        for level, position, value in merkle.completed_nodes(
            size, leaf_hash, merkle.from_mapping(known)
        ):
            nodes.append({"level": level, "position": position, "hash": value})
        compact = merkle.CompactRange(size, frontier)
        compact.append(leaf_hash)
        entries.append(
            {
                "position": size,
                "type": leaf.type,
                # Publishes only: how a proof is asked for by the digest published.
                "subject_digest": leaf.subject_digest if leaf.type in PUBLISHES else None,
                "leaf": leaf.data,
            }
        )
        proofs.append(Proof(size, leaf.data, size + 1, tuple(reversed(frontier)), compact.root()))
        size, frontier = size + 1, compact.hashes
    conn = session.connection()
    conn.execute(_INSERT_ENTRIES, entries)
    conn.execute(_INSERT_NODES, nodes)
    conn.execute(_MOVE_HEAD, {"new_size": size, "new_frontier": b"".join(frontier)})
    return proofs


def nodes(session: Session, keys: Iterable[merkle.NodeKey]) -> dict[merkle.NodeKey, bytes]:
    """The stored hashes of ``keys``, in one query: ``level = ? AND position IN (…)`` per
    level, OR-ed, which both engines answer from the primary key (SQLite scans the table for
    a row-value ``(level, position) IN (…)``)."""
    by_level: dict[int, list[int]] = {}
    for level, position in set(keys):
        by_level.setdefault(level, []).append(position)
    if not by_level:
        return {}
    n = LogNodeRow
    rows = session.execute(
        sa.select(n.level, n.position, n.hash).where(
            sa.or_(
                *(
                    sa.and_(n.level == level, n.position.in_(sorted(positions)))
                    for level, positions in sorted(by_level.items())
                )
            )
        )
    ).all()
    return {(r[0], r[1]): r[2] for r in rows}


def entry_leaf(session: Session, index: int) -> bytes | None:
    return session.scalar(sa.select(LogEntryRow.leaf).where(LogEntryRow.position == index))


def publish_entry(session: Session, digest: str) -> tuple[int, bytes] | None:
    """The entry that published ``digest`` (a component or an agent version), if any."""
    e = LogEntryRow
    row = session.execute(
        sa.select(e.position, e.leaf)
        .where(e.subject_digest == digest)
        .order_by(e.position)
        .limit(1)
    ).first()
    return None if row is None else (row[0], row[1])


def entries(session: Session, start: int, end: int) -> Sequence[tuple[int, bytes]]:
    e = LogEntryRow
    rows = session.execute(
        sa.select(e.position, e.leaf)
        .where(e.position >= start, e.position < end)
        .order_by(e.position)
    ).all()
    return [(r[0], r[1]) for r in rows]
