"""Watching a run or a thread: an async iterator that survives disconnects.

The server promises (runtime_service.proto, WatchRun/WatchThread) that a dropped stream
never affects the run and that reconnecting from the last sequence (run) or cursor (thread)
seen loses and repeats nothing; it may end a stream with UNAVAILABLE at any time (shutdown,
slow consumer). These iterators hold that position and reconnect with backoff on every
error that says "not now", so the caller sees each event exactly once, in order. A run's
stream ends after ``run.ended``; a thread's goes on until the caller stops iterating.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from agentrt.runtime.v1 import event_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_sdk import errors
from agentrt_sdk.transport import Connection, is_retryable

__all__ = ["ThreadEvent", "watch_run", "watch_thread"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThreadEvent:
    """An event of a thread's stream and the cursor to resume after it."""

    event: event_pb2.Event
    cursor: str


def _reconnectable(error: errors.AgentrtError) -> bool:
    # A stream the transport dropped surfaces as UNAVAILABLE, or CANCELLED when the
    # connection went away under it; neither is an answer about the run.
    return is_retryable(error) or isinstance(error, errors.CancelledError)


async def _pause(connection: Connection, failures: int, error: errors.AgentrtError) -> None:
    delay = connection.retry.delay(min(failures, 10), getattr(error, "retry_delay", None))
    _log.info("watch: %s; reconnecting in %.2fs", error, delay)
    await asyncio.sleep(delay)


async def watch_run(
    connection: Connection,
    run_id: str,
    *,
    after_sequence: int = 0,
    event_types: Iterable[int] = (),
) -> AsyncIterator[event_pb2.Event]:
    """Every event of ``run_id`` after ``after_sequence``, then live, until ``run.ended``.

    Raises:
        AgentrtError: an answer that reconnecting cannot change (NOT_FOUND, PERMISSION_DENIED,
            INVALID_ARGUMENT ...).
    """
    last = after_sequence
    types = list(event_types)
    failures = 0
    while True:
        request = pb.WatchRunRequest(
            run_id=run_id,
            after_sequence=last,
            event_types=types,  # type: ignore[arg-type]
        )
        try:
            async for response in connection.stream_out("runtime", "WatchRun", request):
                event = response.event
                if event.sequence <= last:
                    continue  # never repeat what was already handed out
                last = event.sequence
                failures = 0
                yield event
            return  # the server ended the stream with OK: the run has ended
        except errors.AgentrtError as error:
            if not _reconnectable(error):
                raise
            await _pause(connection, failures, error)
            failures += 1


async def watch_thread(
    connection: Connection,
    thread_id: str,
    *,
    after_cursor: str = "",
    live_only: bool = False,
    event_types: Iterable[int] = (),
) -> AsyncIterator[ThreadEvent]:
    """Every event of ``thread_id`` (and its runs) after ``after_cursor``, then live; never
    ends on its own. ``live_only`` starts at the present on the first connection only."""
    cursor = after_cursor
    types = list(event_types)
    failures = 0
    while True:
        request = pb.WatchThreadRequest(
            thread_id=thread_id,
            after_cursor=cursor,
            live_only=live_only and not cursor,
            event_types=types,  # type: ignore[arg-type]
        )
        try:
            async for response in connection.stream_out("runtime", "WatchThread", request):
                # The cursor is opaque: resuming after the last one is what keeps the
                # stream free of gaps and repeats, so nothing here compares cursors.
                cursor = response.cursor
                failures = 0
                yield ThreadEvent(response.event, response.cursor)
        except errors.AgentrtError as error:
            if not _reconnectable(error):
                raise
            await _pause(connection, failures, error)
            failures += 1
        else:
            # The stream "does not end on its own": an OK end is a server going away
            # politely; resume after a short pause.
            await asyncio.sleep(connection.retry.delay(0))
