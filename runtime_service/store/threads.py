"""Threads as stored: their rows, their own event chain, and the reads a watcher pages through."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa
from google.protobuf.message import Message
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core import event_chain
from agentrt_core.errors import NotFound
from agentrt_core.ids import new_id
from agentrt_core.proto_json import enum_value
from runtime_service import events, notify
from runtime_service.step_rules import dumps
from runtime_service.store.tables import ThreadRow


class RequestIdTaken(Exception):
    """A concurrent CreateThread with the same request id committed first: the unique index
    refused this one's insert, and its transaction is spoilt. A new transaction finds the
    winner's thread (:func:`by_request_id`)."""


def get(session: Session, thread_id: str) -> ThreadRow:
    """The thread (unlocked).

    Raises:
        NotFound: no such thread.
    """
    thread = session.get(ThreadRow, thread_id)
    if thread is None:
        raise NotFound("thread", thread_id)
    return thread


def for_update(session: Session, thread_id: str) -> ThreadRow:
    """The thread, locked: appending to its chain and choosing its messages' order happen
    under this lock.

    Raises:
        NotFound: no such thread.
    """
    thread = session.scalar(sa.select(ThreadRow).where(ThreadRow.id == thread_id).with_for_update())
    if thread is None:
        raise NotFound("thread", thread_id)
    return thread


def by_request_id(session: Session, request_id: str) -> ThreadRow | None:
    """The thread an earlier CreateThread with ``request_id`` created, if any."""
    return session.scalar(sa.select(ThreadRow).where(ThreadRow.request_id == request_id))


def create(
    session: Session,
    *,
    namespace: str,
    title: str,
    metadata: dict[str, str],
    concurrency_policy: str,
    request_id: str,
    now: dt.datetime,
) -> ThreadRow:
    """Insert a thread and record ``thread.created`` on its own chain.

    Raises:
        RequestIdTaken: another transaction inserted a thread with ``request_id`` first.
    """
    thread = ThreadRow(
        id=new_id("thr"),
        namespace=namespace,
        title=title,
        metadata_json=dumps(metadata),
        concurrency_policy=concurrency_policy,
        create_time=now,
        request_id=request_id or None,
        last_event_sequence=0,
        last_event_hash="",
        event_cursor=0,
    )
    session.add(thread)
    try:
        session.flush()
    except sa.exc.IntegrityError as exc:
        # Only the request id is unique besides the fresh id: without one this is a bug.
        if not request_id:
            raise
        raise RequestIdTaken(request_id) from exc
    append_event(
        session,
        thread,
        event_pb2.ThreadCreatedAttributes(
            title=title,
            concurrency_policy=enum_value(
                enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", thread.concurrency_policy
            ),
        ),
        now,
    )
    session.flush()
    session.refresh(thread)
    return thread


def append_event(
    session: Session, thread: ThreadRow, attributes: Message, now: dt.datetime
) -> None:
    """Append one event to the thread's own chain (``thread`` locked or just inserted by the
    caller) and keep the row's chain head in step."""
    chain = events.Chain(thread.id, "", thread.last_event_sequence, thread.last_event_hash)
    events.append(session.connection(), chain, attributes, now)
    # On PostgreSQL the cursor was bumped by a Core UPDATE (events.append): keep the ORM
    # object from writing it back stale.
    session.expire(thread, ["event_cursor"])
    thread.last_event_sequence, thread.last_event_hash = chain.last_sequence, chain.last_hash
    notify.wake(session, notify.thread_key(thread.id))


def page(
    session: Session,
    metadata: dict[str, str],
    namespaces: frozenset[str] | None,
    after_id: str | None,
    limit: int,
) -> list[ThreadRow]:
    """Up to ``limit`` threads of ``namespaces`` (None: any) whose metadata holds every pair of
    ``metadata``, newest id first, after ``after_id`` (exclusive) if given."""
    stmt = sa.select(ThreadRow).order_by(ThreadRow.id.desc())
    if namespaces is not None:
        stmt = stmt.where(ThreadRow.namespace.in_(sorted(namespaces)))
    if after_id is not None:
        stmt = stmt.where(ThreadRow.id < after_id)
    found: list[ThreadRow] = []
    # Metadata is matched in Python: threads are few per page and the filter is
    # an exact match on a handful of keys.
    for thread in session.scalars(stmt).yield_per(200):
        meta = json.loads(thread.metadata_json)
        if all(meta.get(k) == v for k, v in metadata.items()):
            found.append(thread)
            if len(found) >= limit:
                break
    return found


def head_cursor(session: Session, thread_id: str) -> int:
    """The cursor of the thread's latest committed event (0: none yet).

    Raises:
        NotFound: no such thread.
    """
    get(session, thread_id)
    return events.thread_head(session, thread_id)


def events_after(
    session: Session, thread_id: str, after_cursor: int, limit: int
) -> list[event_chain.StoredEvent]:
    """Up to ``limit`` events of the thread and all its runs after ``after_cursor``, in cursor
    (commit) order."""
    return events.thread_events_after(session.connection(), thread_id, after_cursor, limit)
