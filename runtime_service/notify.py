"""Wake-ups after commit: in-process, and across replicas through PostgreSQL LISTEN/NOTIFY.

Waiters (watch streams, long-polling AcquireRun) never poll the database while idle: they
sleep on a key (``run:<id>``, ``thread:<id>``, ``work``) and re-read from their cursor when
woken. A wake-up carries no data, so a duplicate or a spurious one costs one query and loses
nothing; that is what lets the PostgreSQL path be simple: every replica hears every NOTIFY
and wakes its local waiters.

On PostgreSQL the NOTIFY is issued inside the writing transaction, so it is delivered only if
that transaction commits (PostgreSQL queues notifications until commit). Its payload starts
with the writer's origin (``@`` and the writing notifier's id): the writer woke its own
waiters right after the commit, so its listener skips the echo instead of waking them all a
second time (every sleeping AcquireRun re-queries on a wake of ``work``). A payload without
an origin (a replica of an earlier version) wakes everything it names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa

from agentrt_base import raw

log = logging.getLogger("agentrt.notify")

CHANNEL = "agentrt_events"
WORK = "work"


#: Session.info key under which a transaction collects the keys to wake after commit
#: (``services.context.Runtime.write`` wakes them).
WAKE = "agentrt.wake"


def wake(session: Any, *keys: str) -> None:
    """Ask for ``keys`` to be woken once ``session``'s transaction commits."""
    session.info.setdefault(WAKE, []).extend(keys)


def run_key(run_id: str) -> str:
    return f"run:{run_id}"


def thread_key(thread_id: str) -> str:
    return f"thread:{thread_id}"


class Notifier:
    """Local waiters by key; woken by :meth:`wake` (same process) or by the listener task."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listener: asyncio.Task[None] | None = None
        self._stopping = False
        #: Marks this notifier's NOTIFY payloads (see the module docstring).
        self.origin = "@" + secrets.token_hex(8)

    def wake(self, keys: Iterable[str]) -> None:
        """Wake every local waiter on any of ``keys``. Call on the event loop."""
        for key in keys:
            for event in self._waiters.get(key, ()):
                event.set()

    @contextlib.contextmanager
    def subscribe(self, keys: Iterable[str]) -> Iterator[asyncio.Event]:
        """Register a waiter on ``keys`` for the duration of the block.

        Callers register *before* reading the database, so a commit between their read and
        their sleep cannot be missed.
        """
        event = asyncio.Event()
        registered = list(keys)
        for key in registered:
            self._waiters[key].add(event)
        try:
            yield event
        finally:
            for key in registered:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]

    @staticmethod
    async def sleep(event: asyncio.Event, timeout: float | None) -> bool:  # noqa: ASYNC109
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- PostgreSQL ------------------------------------------------------------------------

    def _heard(self, payload: str) -> None:
        origin, _, keys = payload.partition(" ")
        if not origin.startswith("@"):
            self.wake(payload.split(" "))  # no origin: an earlier version's payload
        elif origin != self.origin:
            self.wake(keys.split(" "))
        # else: our own commit, whose waiters were woken when it committed

    def start_listening(self, conninfo: str) -> None:
        """Listen on :data:`CHANNEL` in the background (PostgreSQL only)."""
        self._listener = asyncio.create_task(self._listen(conninfo), name="agentrt-listen")

    async def stop(self) -> None:
        if self._listener is not None:
            self._stopping = True
            self._listener.cancel()
            # Bounded: a cancellation swallowed inside the driver's wait (CPython gh-86296)
            # must not hold the server's shutdown; the loop ends at its next turn.
            done, _ = await asyncio.wait({self._listener}, timeout=5)
            for task in done:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
            self._listener = None

    async def _listen(self, conninfo: str) -> None:
        import psycopg

        delay = 0.5
        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    delay = 0.5
                    # A (re)connect may have missed notifications: wake everyone to re-read.
                    self.wake(list(self._waiters))
                    async for note in conn.notifies():
                        self._heard(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection dropped: retry, waiters re-read on return
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)


_NOTIFY = raw.Statement("SELECT pg_notify(:channel, :payload)")


def notify_raw(tx: raw.RawTx, keys: Iterable[str], origin: str) -> None:
    """:func:`notify_in_transaction` for a job written in plain SQL."""
    if tx.dialect_name != "postgresql":
        return
    payload = _payload(keys, origin)
    if payload:
        tx.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


def notify_in_transaction(conn: sa.Connection, keys: Iterable[str], origin: str) -> None:
    """On PostgreSQL, queue a NOTIFY for ``keys``; it is delivered if the transaction commits.
    ``origin``: the :attr:`Notifier.origin` of the notifier that wakes the keys locally."""
    if conn.dialect.name != "postgresql":
        return
    payload = _payload(keys, origin)
    if payload:
        conn.execute(sa.select(sa.func.pg_notify(CHANNEL, payload)))


def _payload(keys: Iterable[str], origin: str) -> str:
    unique = sorted(set(keys))
    return f"{origin} {' '.join(unique)}" if unique else ""
