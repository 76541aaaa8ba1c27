"""Watch streams: replay from a cursor, then follow live, never polling while idle.

Each loop subscribes to its key *before* reading, reads everything after its cursor in pages,
and sleeps only when a read came back empty: so an event committed at any moment is either in
the read or wakes the sleep. A client that reconnects with the last sequence (or cursor) it
saw receives every later event exactly once, in order; a dropped stream touches nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

from sqlalchemy.orm import Session

from agentrt_base.errors import InvalidArgument, NotFound
from runtime_service import events, notify
from runtime_service.lifecycle import RunStatus
from runtime_service.services.context import Runtime
from runtime_service.store.tables import RunRow, ThreadRow

PAGE = 500


class WatchService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def watch_run(
        self, run_id: str, after_sequence: int
    ) -> AsyncIterator[events.StoredEvent]:
        """Every event of the run after ``after_sequence``; ends after ``run.ended``."""

        def first(session: Session) -> None:
            if session.get(RunRow, run_id) is None:
                raise NotFound("run", run_id)

        await self._rt.read(first)
        cursor = after_sequence
        while True:
            with self._rt.notifier.subscribe([notify.run_key(run_id)]) as woken:
                batch = await self._rt.read(partial(_run_page, run_id=run_id, after=cursor))
                for event in batch:
                    yield event
                    cursor = event.sequence
                    if event.event_type == "run.ended":
                        return
                if batch:
                    continue
                ended = await self._rt.read(lambda s: _run_status(s, run_id))
                if ended and cursor >= ended:
                    return
                await self._rt.notifier.sleep(woken, None)

    async def watch_thread(
        self, thread_id: str, after_cursor: str, live_only: bool
    ) -> AsyncIterator[events.StoredEvent]:
        """Every event of the thread and its runs after the cursor, in commit order; endless."""
        if after_cursor and not after_cursor.isdigit():
            raise InvalidArgument.for_field("after_cursor", "not a cursor this server issued")

        def first(session: Session) -> int:
            thread = session.get(ThreadRow, thread_id)
            if thread is None:
                raise NotFound("thread", thread_id)
            return thread.event_cursor

        head = await self._rt.read(first)
        cursor = head if live_only and not after_cursor else int(after_cursor or 0)
        while True:
            with self._rt.notifier.subscribe([notify.thread_key(thread_id)]) as woken:
                batch = await self._rt.read(
                    partial(_thread_page, thread_id=thread_id, after=cursor)
                )
                for event in batch:
                    yield event
                    cursor = event.thread_cursor
                if not batch:
                    await self._rt.notifier.sleep(woken, None)


def _run_page(session: Session, *, run_id: str, after: int) -> list[events.StoredEvent]:
    return events.run_events_after(session.connection(), run_id, after, PAGE)


def _thread_page(session: Session, *, thread_id: str, after: int) -> list[events.StoredEvent]:
    return events.thread_events_after(session.connection(), thread_id, after, PAGE)


def _run_status(session: Session, run_id: str) -> int:
    """The run's last sequence if it has ended (nothing more will come), else 0."""
    run = session.get(RunRow, run_id)
    if run is None or not RunStatus(run.status).terminal:
        return 0
    return run.last_event_sequence
