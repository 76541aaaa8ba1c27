"""A thread's messages as stored: appended in order under the thread's lock, read a page at a
time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core.ids import new_id
from agentrt_core.proto_json import enum_value
from runtime_service.step_rules import dumps
from runtime_service.store import threads
from runtime_service.store.tables import MessageRow, ThreadRow


def by_request_id(session: Session, request_id: str) -> MessageRow | None:
    """The message an earlier AppendMessage stored under ``request_id`` (already scoped to its
    thread), if any."""
    return session.scalar(sa.select(MessageRow).where(MessageRow.request_id == request_id))


def append(
    session: Session,
    thread: ThreadRow,
    *,
    request_id: str | None,
    role: str,
    content: str,
    data: dict[str, Any],
    run_id: str,
    now: dt.datetime,
) -> MessageRow:
    """Append a message to ``thread`` (locked by the caller: the lock orders the messages'
    ``seq``) and record ``thread.message_appended`` on the thread's chain."""
    last = session.scalar(
        sa.select(sa.func.max(MessageRow.seq)).where(MessageRow.thread_id == thread.id)
    )
    message = MessageRow(
        id=new_id("msg"),
        thread_id=thread.id,
        request_id=request_id,
        seq=(last or 0) + 1,
        role=role,
        content=content,
        data_json=dumps(data),
        run_id=run_id,
        create_time=now,
    )
    session.add(message)
    threads.append_event(
        session,
        thread,
        event_pb2.ThreadMessageAppendedAttributes(
            message_id=message.id,
            role=enum_value(enum_pb2.MessageRole, "MESSAGE_ROLE_", role),
            run_id=run_id,
        ),
        now,
    )
    return message


def page(
    session: Session,
    thread_id: str,
    *,
    run_id: str,
    newest_first: bool,
    after_seq: int | None,
    limit: int,
) -> Sequence[MessageRow]:
    """Up to ``limit`` messages of the thread (only ``run_id``'s if given) in ``seq`` order,
    newest first if asked, after ``after_seq`` (exclusive, in that order) if given."""
    m = MessageRow
    stmt = sa.select(m).where(m.thread_id == thread_id)
    if run_id:
        stmt = stmt.where(m.run_id == run_id)
    if after_seq is not None:
        stmt = stmt.where(m.seq < after_seq if newest_first else m.seq > after_seq)
    stmt = stmt.order_by(m.seq.desc() if newest_first else m.seq).limit(limit)
    return session.scalars(stmt).all()
