"""A database that is full, read-only or frozen: the call answers a retryable code with its
reason (never INTERNAL, never a hang to the client's deadline), nothing partial is stored,
health says NOT_SERVING while it lasts, and service comes back without a restart.

SQLite only where the fault is SQLite's (a full file, a read-only file); a frozen database on
both engines. PostgreSQL stopped and started: ``tests/e2e/test_postgres_outage.py``.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa

from agentrt_base.db_engines import normalise_url
from agentrt_base.settings import DatabaseSettings
from tests.faults import NOT_SERVING, SERVING, Client, server_with
from tests.runtime_support import Stubs
from tests.service.steps_support import start

FAST_PROBE = DatabaseSettings(probe_interval=0.2)


def _threads(url: str, title_prefix: str) -> int:
    engine = sa.create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM runtime_threads WHERE title LIKE :p"),
                    {"p": title_prefix + "%"},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_sqlite_full_answers_resource_exhausted_and_recovers(sqlite_url: str) -> None:
    """The file is capped (``sqlite_max_bytes``) and filled to the cap by another connection:
    writes answer RESOURCE_EXHAUSTED DATABASE_FULL (several at once, so a group-commit batch
    meets it too), nothing of them is stored, health is NOT_SERVING; once space is freed the
    same server writes again and says SERVING."""
    settings = DatabaseSettings(probe_interval=0.2, sqlite_max_bytes=2 * 1024 * 1024)
    path = normalise_url(sqlite_url).database
    assert path
    with server_with(sqlite_url, settings) as address:
        client = Client(address)
        try:
            assert client.status() == SERVING
            client.create_thread("before")
            filler = sqlite3.connect(path, isolation_level=None, timeout=30)
            filler.execute("CREATE TABLE filler (b BLOB)")
            max_pages = settings.sqlite_max_bytes // 4096  # type: ignore[operator]
            while filler.execute("PRAGMA page_count").fetchone()[0] < max_pages - 2:
                filler.execute("INSERT INTO filler VALUES (zeroblob(3000))")

            results: list[tuple[grpc.StatusCode, str]] = []

            def refused(i: int) -> None:
                results.append(client.refusal(f"full-{i}", pad=20_000))

            workers = [threading.Thread(target=refused, args=(i,)) for i in range(6)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(60)
            assert results == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "DATABASE_FULL")] * 6
            assert _threads(sqlite_url, "full-") == 0
            client.wait_status(NOT_SERVING, within=5)

            filler.execute("DELETE FROM filler")  # space comes back (free pages in the file)
            filler.close()
            client.wait_status(SERVING, within=5)
            client.create_thread("after-full-1", pad=20_000)
            client.create_thread("after-full-2", pad=20_000)
            assert _threads(sqlite_url, "after-full-") == 2
        finally:
            client.close()


def _chattr(flag: str, paths: list[str]) -> None:
    subprocess.run(["chattr", flag, *paths], check=True)


@pytest.fixture
def immutable() -> Iterator[list[str]]:
    """Files to make immutable (``chattr +i``): the tests run as root, whom a ``chmod`` does
    not stop, and an open descriptor keeps the access it was opened with anyway; an
    immutable inode refuses every write, even through a descriptor opened before."""
    if shutil.which("chattr") is None:
        pytest.fail("chattr is needed to make a file read-only for root")
    made: list[str] = []
    yield made
    if made:
        _chattr("-i", made)


def test_sqlite_read_only_file_answers_unavailable_and_recovers(
    sqlite_url: str, immutable: list[str]
) -> None:
    """The database file and its WAL become read-only under a running server: writes answer
    UNAVAILABLE (DATABASE_READ_ONLY, or DATABASE_IO_ERROR for the writer's connection opened
    before), nothing is stored, health is NOT_SERVING; writable again, the same server writes
    and says SERVING. (The -shm file stays writable: SQLite maps it into memory, and a write
    to an immutable mapping is a SIGBUS, not an error.)"""
    path = normalise_url(sqlite_url).database
    assert path
    with server_with(sqlite_url, FAST_PROBE) as address:
        client = Client(address)
        try:
            client.create_thread("before")
            immutable.extend([path, path + "-wal"])
            _chattr("+i", immutable)
            client.wait_status(NOT_SERVING, within=5)
            seen = [client.refusal(f"ro-{i}") for i in range(4)]
            assert {code for code, _ in seen} == {grpc.StatusCode.UNAVAILABLE}
            assert {reason for _, reason in seen} <= {"DATABASE_READ_ONLY", "DATABASE_IO_ERROR"}
            assert seen[-1][1] == "DATABASE_READ_ONLY"  # the writer reopened: read-only
            assert client.status() == NOT_SERVING

            _chattr("-i", immutable)
            immutable.clear()
            client.wait_status(SERVING, within=5)
            client.create_thread("after-ro")
            assert _threads(sqlite_url, "ro-") == 0
            assert _threads(sqlite_url, "after-ro") == 1
        finally:
            client.close()


def test_frozen_database_answers_unavailable_within_the_server_deadline(
    database_url: str, engine: str
) -> None:
    """Another session holds the threads table (PostgreSQL: ACCESS EXCLUSIVE in an open
    transaction) or the write lock (SQLite: BEGIN EXCLUSIVE): a write answers UNAVAILABLE
    DATABASE_TIMEOUT / DATABASE_BUSY at the server's lock deadline (1 s here), long before
    the client's own (30 s)."""
    settings = DatabaseSettings(probe_interval=0.2, lock_timeout=1.0, statement_timeout=5.0)
    with server_with(database_url, settings) as address:
        client = Client(address)
        holder = sa.create_engine(normalise_url(database_url), poolclass=sa.pool.NullPool)
        conn = holder.connect()
        try:
            client.create_thread("before")
            driver = conn.connection.driver_connection
            if engine == "sqlite":
                driver.isolation_level = None
                driver.execute("BEGIN EXCLUSIVE")
                expected = "DATABASE_BUSY"
            else:
                conn.exec_driver_sql("LOCK TABLE runtime_threads IN ACCESS EXCLUSIVE MODE")
                expected = "DATABASE_TIMEOUT"
            start = time.monotonic()
            assert client.refusal("frozen") == (grpc.StatusCode.UNAVAILABLE, expected)
            assert time.monotonic() - start < 4
        finally:
            conn.rollback() if engine != "sqlite" else conn.connection.driver_connection.execute(
                "ROLLBACK"
            )
            conn.close()
            holder.dispose()
        client.create_thread("after-frozen")
        assert _threads(database_url, "frozen") == 0
        client.close()


def test_a_frozen_database_bounds_step_calls_too(
    database_url: str, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    """BeginStep goes to the step writer process first, which has its own connection: it must
    keep the server's deadlines (lock 1 s here), not its defaults (10 s), or a frozen
    database holds the step call for the child's wait and then the server's, past the
    client's 10 s deadline. With them: the child's 1 s, then the server's path (up to a few
    transactions of 1 s each). The freeze is the database's, not a bug: the server logs it
    without a traceback."""
    settings = DatabaseSettings(probe_interval=0.2, lock_timeout=1.0, statement_timeout=5.0)
    with server_with(database_url, settings) as address:
        stubs = Stubs.open(address)
        worker = start(stubs)
        worker.end(worker.model().step.id)  # the child is up and answering
        holder = sa.create_engine(normalise_url(database_url), poolclass=sa.pool.NullPool)
        conn = holder.connect()
        try:
            driver = conn.connection.driver_connection
            if engine == "sqlite":
                driver.isolation_level = None
                driver.execute("BEGIN EXCLUSIVE")
            else:
                conn.exec_driver_sql("LOCK TABLE runtime_runs IN ACCESS EXCLUSIVE MODE")
            begun = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                worker.model(key="frozen")
            waited = time.monotonic() - begun
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
            assert waited < 8, f"the step call waited {waited:.1f} s"
        finally:
            if engine == "sqlite":
                conn.connection.driver_connection.execute("ROLLBACK")
            else:
                conn.rollback()
            conn.close()
            holder.dispose()
        worker.end(worker.model(key="frozen").step.id)  # the retry is recorded once
        stubs.close()
    assert not [r.getMessage() for r in caplog.records if r.exc_info]


def test_sqlite_write_waiting_past_its_deadline_is_withdrawn(sqlite_url: str) -> None:
    """The writer is stuck behind another connection's lock (busy timeout 4 s) while calls
    wait 1 s: the call the writer had started hears COMMIT_OUTCOME_UNKNOWN, one still queued
    behind it DATABASE_TIMEOUT and is withdrawn: never committed, even once the lock frees."""
    settings = DatabaseSettings(probe_interval=0.2, lock_timeout=4.0, statement_timeout=1.0)
    path = normalise_url(sqlite_url).database
    assert path
    with server_with(sqlite_url, settings) as address:
        client = Client(address)
        try:
            client.create_thread("before")
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            results: dict[str, tuple[grpc.StatusCode, str]] = {}

            def call(title: str) -> None:
                results[title] = client.refusal(title, request_id=uuid.uuid4().hex)

            first = threading.Thread(target=call, args=("late-first",))
            first.start()
            time.sleep(0.3)  # the writer has taken the first call and waits for the lock
            start = time.monotonic()
            call("late-second")
            assert time.monotonic() - start < 2.5
            first.join(10)
            assert results["late-first"] == (grpc.StatusCode.UNAVAILABLE, "COMMIT_OUTCOME_UNKNOWN")
            assert results["late-second"] == (grpc.StatusCode.UNAVAILABLE, "DATABASE_TIMEOUT")
            # Let go while the writer still waits for the lock (its busy timeout is 4 s): the
            # call it had started commits after all, which is why it was answered "unknown";
            # the withdrawn one never runs.
            holder.execute("ROLLBACK")
            holder.close()
            client.create_thread("after-late")  # the writer lives on
            assert _threads(sqlite_url, "late-first") == 1
            assert _threads(sqlite_url, "late-second") == 0
        finally:
            client.close()
