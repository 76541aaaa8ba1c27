"""Watch streams: replay from a cursor, then follow live, never polling while idle.

Each stream holds one subscription to its key for its whole life and clears it *before*
every read, so an event committed at any moment is either in that read or has set the
subscription again; the stream sleeps only when its last read returned less than a page. A
client that reconnects with the last sequence (or cursor) it saw receives every later event
exactly once, in order; a dropped stream touches nothing.

Many watchers of one run wake together and ask for the same page: reads are shared
(single-flight by run and cursor), so 200 watchers cost one query per new event, not 200.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TypeVar

from sqlalchemy.orm import Session

from agentrt_core import event_chain
from agentrt_core.errors import InvalidArgument
from runtime_service import notify
from runtime_service.lifecycle import RunStatus
from runtime_service.services.context import Runtime
from runtime_service.store import runs, threads

PAGE = 500
T = TypeVar("T")


class _SharedReads:
    """Concurrent identical reads share one database query (single-flight)."""

    def __init__(self) -> None:
        self._inflight: dict[tuple[str, str, int], asyncio.Future[object]] = {}

    async def read(self, key: tuple[str, str, int], load: Callable[[], Awaitable[T]]) -> T:
        pending = self._inflight.get(key)
        if pending is not None:
            shared: T = await asyncio.shield(pending)  # type: ignore[arg-type]
            return shared
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await load()
        except BaseException as exc:
            future.set_exception(exc)
            # Retrieved here so a failure nobody else awaited is not logged as unhandled.
            future.exception()
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]


class WatchService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._shared = _SharedReads()

    async def watch_run(
        self, run_id: str, after_sequence: int
    ) -> AsyncIterator[event_chain.StoredEvent]:
        """Every event of the run after ``after_sequence``; ends after ``run.ended``."""
        with self._rt.notifier.subscribe([notify.run_key(run_id)]) as woken:
            thread_id, ended_at = await self._rt.read(partial(_run_state, run_id=run_id))
            cursor = after_sequence
            if ended_at and cursor >= ended_at:
                return  # the run has ended and the caller has seen its last event
            while True:
                woken.clear()
                batch = await self._shared.read(
                    ("run", run_id, cursor),
                    partial(
                        self._rt.read,
                        partial(_run_page, thread_id=thread_id, run_id=run_id, after=cursor),
                    ),
                )
                for event in batch:
                    yield event
                    cursor = event.sequence
                    if event.event_type == "run.ended":
                        return
                if len(batch) < PAGE:
                    await woken.wait()

    async def watch_thread(
        self, thread_id: str, after_cursor: str, live_only: bool
    ) -> AsyncIterator[event_chain.StoredEvent]:
        """Every event of the thread and its runs after the cursor, in commit order; endless."""
        if after_cursor and not after_cursor.isdigit():
            raise InvalidArgument.for_field("after_cursor", "not a cursor this server issued")
        with self._rt.notifier.subscribe([notify.thread_key(thread_id)]) as woken:
            head = await self._rt.read(partial(_thread_head, thread_id=thread_id))
            cursor = head if live_only and not after_cursor else int(after_cursor or 0)
            while True:
                woken.clear()
                batch = await self._shared.read(
                    ("thread", thread_id, cursor),
                    partial(
                        self._rt.read, partial(_thread_page, thread_id=thread_id, after=cursor)
                    ),
                )
                for event in batch:
                    yield event
                    cursor = event.thread_cursor
                if len(batch) < PAGE:
                    await woken.wait()


def _run_state(session: Session, *, run_id: str) -> tuple[str, int]:
    """The run's thread, and its last sequence if it has ended (nothing more will come),
    else 0.

    Raises:
        NotFound: no such run.
    """
    run = runs.get(session, run_id)
    return run.thread_id, run.last_event_sequence if RunStatus(run.status).terminal else 0


def _thread_head(session: Session, *, thread_id: str) -> int:
    return threads.head_cursor(session, thread_id)


def _run_page(
    session: Session, *, thread_id: str, run_id: str, after: int
) -> list[event_chain.StoredEvent]:
    return runs.events_after(session, thread_id, run_id, after, PAGE)


def _thread_page(session: Session, *, thread_id: str, after: int) -> list[event_chain.StoredEvent]:
    return threads.events_after(session, thread_id, after, PAGE)
