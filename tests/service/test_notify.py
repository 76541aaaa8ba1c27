"""Wake-ups across replicas (PostgreSQL LISTEN/NOTIFY): a notifier hears every other
writer's NOTIFY, and skips the echo of its own (its waiters were woken at commit)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import psycopg
import pytest
import sqlalchemy as sa

from runtime_service import notify
from runtime_service.notify import Notifier


def _conninfo(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class _Recording(Notifier):
    def __init__(self) -> None:
        super().__init__()
        self.heard: list[list[str]] = []

    def wake(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.heard.append(keys)
        super().wake(keys)


async def _until(condition: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.postgres
def test_a_notifier_skips_its_own_echo_and_hears_everyone_else(postgres_session_url: str) -> None:
    conninfo = _conninfo(postgres_session_url)

    async def scenario() -> list[list[str]]:
        notifier = _Recording()
        notifier.start_listening(conninfo)
        try:
            # On connecting, the listener wakes every waiter (none yet): LISTEN is active.
            await _until(lambda: notifier.heard, "the listener to connect")
            notifier.heard.clear()
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                for payload in (
                    f"{notifier.origin} run:mine",  # our own commit: already woken locally
                    "@someone-else run:theirs work",  # another replica's
                    "run:old thread:old",  # an earlier version's payload, without origin
                    "@someone-else run:last",
                ):
                    await conn.execute("SELECT pg_notify(%s, %s)", (notify.CHANNEL, payload))
            await _until(lambda: ["run:last"] in notifier.heard, "the last notification")
            return notifier.heard
        finally:
            await notifier.stop()

    assert asyncio.run(scenario()) == [
        ["run:theirs", "work"],
        ["run:old", "thread:old"],
        ["run:last"],
    ]


def test_payloads_carry_the_origin_then_each_key_once() -> None:
    assert notify._payload(["work", "run:a", "work"], "@abc") == "@abc run:a work"
    assert notify._payload([], "@abc") == ""
    assert Notifier().origin != Notifier().origin
    assert Notifier().origin.startswith("@")
