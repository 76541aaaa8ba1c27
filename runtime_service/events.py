"""The event log: append in the caller's transaction, hash-chained per run.

A chain is ``(thread_id, run_id)``: a run's events, or (``run_id == ""``) the thread's own
events. Each event's hash is SHA-256 over the RFC 8785 canonical JSON of the event (its id,
chain, sequence, type, time, attributes and the previous event's hash), so rewriting any
stored event, or dropping one, breaks every later link; ``docs/lifecycle.md`` has the exact
form so an auditor can recompute it offline.

Attributes are stored as the proto3 JSON mapping of the event's attributes message (field
names as in the proto), which is also what watchers receive: the stored form is the wire
form.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from google.protobuf.message import Message
from sqlalchemy.orm import Session

from agentrt_base import raw
from agentrt_core import jcs
from agentrt_core.event_chain import StoredEvent, document_hash, event_type_name, format_time
from agentrt_core.ids import new_id
from agentrt_core.proto_json import message_json
from runtime_service.store.tables import EventRow, ThreadRow

# Core tables for the hot path (the ORM classes' __table__ is typed as a generic FromClause).
_EVENTS = cast(sa.Table, EventRow.__table__)
_THREADS = cast(sa.Table, ThreadRow.__table__)


@dataclass
class Chain:
    """The head of one chain, carried through a transaction that appends to it."""

    thread_id: str
    run_id: str
    last_sequence: int
    last_hash: str


# The thread cursor (docs/lifecycle.md, "Sequences and cursors") must grow in commit order
# across all of a thread's runs.
#
# PostgreSQL: the thread's own counter, taken with UPDATE ... RETURNING on the thread row,
# whose lock orders the appending transactions.
#
# SQLite: one transaction writes at a time (the database lock), so any number that grows with
# each insert grows in commit order. The event takes the next position in the whole event
# table, max(rowid) + 1 (the rowid it gets; looked up at the table's rightmost page), in the
# insert itself: no statement and no thread-row page per event, which the step path pays
# twice per step. It is above any cursor the thread counter ever handed out on this file
# (at most the number of events, which are never deleted), so the switch kept the order.
_NEXT_ROWID = "(SELECT coalesce(max(rowid), 0) + 1 FROM runtime_events)"

# Prebuilt with bind parameters: every state change appends at least one event, and building
# and cache-keying these statements anew each time cost more than executing them.
_BUMP_CURSOR = (
    sa.update(_THREADS)
    .where(_THREADS.c.id == sa.bindparam("thread"))
    .values(event_cursor=_THREADS.c.event_cursor + 1)
    .returning(_THREADS.c.event_cursor)
)
_INSERT_EVENT = sa.insert(_EVENTS)
_INSERT_EVENT_SQLITE = sa.insert(_EVENTS).values(thread_cursor=sa.literal_column(_NEXT_ROWID))


def append(
    conn: sa.Connection, chain: Chain, attributes: Message | EventDocument, now: dt.datetime
) -> tuple[int, str]:
    """Append one event to ``chain`` in the current transaction; return (sequence, hash).

    The caller holds the lock on the chain's owner (the run row, or the thread row for a
    thread's own events) and writes ``chain.last_sequence``/``last_hash`` back to it. The
    thread cursor is taken as described above (per engine).
    """
    if conn.dialect.name == "sqlite":
        row = _next_event(chain, attributes, now, 0)
        del row["thread_cursor"]
        conn.execute(_INSERT_EVENT_SQLITE, row)
    else:
        cursor = conn.execute(_BUMP_CURSOR, {"thread": chain.thread_id}).scalar_one()
        row = _next_event(chain, attributes, now, cursor)
        conn.execute(_INSERT_EVENT, row)
    return row["sequence"], row["hash"]


# The same in plain SQL for the step path. PostgreSQL takes the cursor and inserts the event in
# one statement (a data-modifying CTE), so the step path's writes go to the server in one
# pipelined round trip; the hash does not cover the cursor, so it need not be known here.
_RAW_APPEND_EVENT = raw.Statement(
    "INSERT INTO runtime_events (id, thread_id, run_id, sequence, thread_cursor, event_type,"
    " event_time, attributes_json, prev_hash, hash) VALUES (:id, :thread_id, :run_id,"
    f" :sequence, {_NEXT_ROWID}, :event_type, :event_time, :attributes_json, :prev_hash,"
    " :hash)",
    postgresql="WITH c AS (UPDATE runtime_threads SET event_cursor = event_cursor + 1"
    " WHERE id = :thread_id RETURNING event_cursor)"
    " INSERT INTO runtime_events (id, thread_id, run_id, sequence, thread_cursor, event_type,"
    " event_time, attributes_json, prev_hash, hash) SELECT :id, :thread_id, :run_id, :sequence,"
    " c.event_cursor, :event_type, :event_time, :attributes_json, :prev_hash, :hash FROM c",
)


def append_raw(
    tx: raw.RawTx, chain: Chain, attributes: Message | EventDocument, now: dt.datetime
) -> None:
    """:func:`append` in plain SQL, for the step path (the same rows, the same hashes)."""
    row = _next_event(chain, attributes, now, 0)
    del row["thread_cursor"]
    row["event_time"] = tx.time(now)
    tx.execute(_RAW_APPEND_EVENT, row)


def thread_head(session: Session, thread_id: str) -> int:
    """The cursor of the thread's latest committed event (0: none yet), read through the
    ``(thread_id, thread_cursor)`` index on either engine."""
    head = session.execute(
        sa.select(sa.func.coalesce(sa.func.max(_EVENTS.c.thread_cursor), 0)).where(
            _EVENTS.c.thread_id == thread_id
        )
    ).scalar_one()
    return int(head)


@dataclass(frozen=True, slots=True)
class EventDocument:
    """An event's type and attributes already in their JSON mapping (what
    ``json_format.MessageToDict`` with proto field names makes of the attributes message),
    for a hot path that builds it directly (``step_events.py``)."""

    type: str
    attributes: dict[str, Any]


def _next_event(
    chain: Chain, attributes: Message | EventDocument, now: dt.datetime, cursor: int
) -> dict[str, Any]:
    """The row of the event that follows ``chain``'s head, which it advances."""
    sequence = chain.last_sequence + 1
    event_id = new_id("evt")
    if isinstance(attributes, EventDocument):
        event_type, attrs = attributes.type, attributes.attributes
    else:
        event_type = event_type_name(attributes)
        attrs = message_json(attributes)
    # Stored as the bytes the hash covers: their JCS form (a verifier that re-serialises them
    # gets the same bytes back).
    attributes_jcs = jcs.canonical_bytes(attrs)
    digest = document_hash(
        attributes_jcs,
        event_id=event_id,
        thread_id=chain.thread_id,
        run_id=chain.run_id,
        sequence=sequence,
        event_type=event_type,
        event_time=format_time(now),
        prev_hash=chain.last_hash,
    )
    row = {
        "id": event_id,
        "thread_id": chain.thread_id,
        "run_id": chain.run_id,
        "sequence": sequence,
        "thread_cursor": cursor,
        "event_type": event_type,
        "event_time": now,
        "attributes_json": attributes_jcs.decode("utf-8"),
        "prev_hash": chain.last_hash,
        "hash": digest,
    }
    chain.last_sequence, chain.last_hash = sequence, digest
    return row


def _stored(row: sa.Row[Any]) -> StoredEvent:
    return StoredEvent(
        id=row.id,
        thread_id=row.thread_id,
        run_id=row.run_id,
        sequence=row.sequence,
        thread_cursor=row.thread_cursor,
        event_type=row.event_type,
        event_time=row.event_time,
        attributes=json.loads(row.attributes_json),
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


def run_events_after(
    conn: sa.Connection, thread_id: str, run_id: str, after_sequence: int, limit: int
) -> list[StoredEvent]:
    """A page of a run's events (``thread_id`` is the run's: the chain's index is keyed by
    it)."""
    rows = conn.execute(
        sa.select(_EVENTS)
        .where(
            _EVENTS.c.thread_id == thread_id,
            _EVENTS.c.run_id == run_id,
            _EVENTS.c.sequence > after_sequence,
        )
        .order_by(_EVENTS.c.sequence)
        .limit(limit)
    ).all()
    return [_stored(r) for r in rows]


def thread_events_after(
    conn: sa.Connection, thread_id: str, after_cursor: int, limit: int
) -> list[StoredEvent]:
    rows = conn.execute(
        sa.select(_EVENTS)
        .where(_EVENTS.c.thread_id == thread_id, _EVENTS.c.thread_cursor > after_cursor)
        .order_by(_EVENTS.c.thread_cursor)
        .limit(limit)
    ).all()
    return [_stored(r) for r in rows]
