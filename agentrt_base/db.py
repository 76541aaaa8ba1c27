"""The storage base both services share: the declarative base and :class:`Database`, which runs
sessions for one URL.

One schema serves SQLite and PostgreSQL. gRPC handlers run on an asyncio loop, so blocking
SQLAlchemy work is handed to executors here rather than done on the loop:

* SQLite has one write lock per file. All writes go through **one connection on one thread**
  (connections fighting over the lock is what pushes p99 into the 100 ms range, see
  ``shared/PERFORMANCE.md``), and each write transaction starts with ``BEGIN IMMEDIATE`` so the
  lock is taken up front instead of being upgraded (and possibly refused) mid-transaction.
  Reads use a small pool of other connections; WAL lets them proceed beside the writer. The
  one exception, the step writer process (``runtime_service.step_process``), takes turns with
  this writer under a :class:`WriterLock`.
* PostgreSQL takes concurrent writers; row locks (``FOR UPDATE SKIP LOCKED``) and guarded
  updates do the fencing, so a few writer threads share a connection pool.

Beside it: how engines are built (``agentrt_base.db_engines``), the SQLite group-commit writer
(``agentrt_base.group_commit``), and which failures are the database's
(``agentrt_base.db_failures``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from agentrt_base.db_engines import (
    WriterLock,
    normalise_url,
    postgres_connect_args,
    postgres_engine,
    sqlite_engine,
    writer_lock_path,
)
from agentrt_base.db_failures import DatabaseUnavailable, database_failure
from agentrt_base.group_commit import GroupCommitWriter
from agentrt_base.settings import DatabaseSettings
from agentrt_core import errors

if TYPE_CHECKING:
    from agentrt_base.raw import RawTx

T = TypeVar("T")

#: Constraint names are spelled out so Alembic migrations are identical on both engines and a
#: constraint can be dropped by name later (SQLite has no names of its own to fall back on).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A timestamp stored in UTC and always returned timezone-aware.

    SQLite has no timezone-aware type and hands back naive values; normalising here keeps the
    rest of the code from ever comparing naive and aware datetimes.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base of every table of agentrt (registry and runtime)."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dt.datetime: UTCDateTime()}  # noqa: RUF012 (SQLAlchemy reads it)


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC (the only kind stored)."""
    return dt.datetime.now(dt.UTC)


#: The health probe calls a SQLite database full below this many free pages (within its
#: ``sqlite_max_bytes``): small writes may still fit, the next larger one would not.
_SQLITE_MIN_FREE_PAGES = 16


class Database:
    """Engines, sessions and executors for one database URL.

    Built explicitly by the server or a CLI command (never at import time), and disposed by
    whoever built it.
    """

    def __init__(
        self,
        url: str,
        *,
        read_pool_size: int = 4,
        writer_lock: bool = False,
        group_commit: bool = True,
        settings: DatabaseSettings | None = None,
    ) -> None:
        """``writer_lock``: take a :class:`WriterLock` around every SQLite write transaction
        (another process writes the file too). ``group_commit=False``: no writer thread, for
        a process that runs its batches itself (:func:`run_raw_batch_sqlite`). ``settings``:
        the server-side deadlines and the SQLite size cap (defaults otherwise)."""
        self.url = normalise_url(url)
        self.dialect_name = self.url.get_backend_name()
        self.settings = settings = settings or DatabaseSettings()
        #: Called with each database failure a call met (``database_failure``'s answer), so
        #: the health watcher need not wait for its next probe (``runtime_service.health``).
        self.on_failure: Callable[[errors.AgentrtError], None] | None = None
        #: Starts a span around one transaction, named for what it does ("write", "read";
        #: ``agentrt_base.tracing.Tracing.database_span``); None: the server does not trace.
        self.span: Callable[[str], contextlib.AbstractContextManager[object]] | None = None
        self._probe_engine: Engine | None = None
        if self.is_sqlite:
            # Two: the group-commit writer keeps one for itself; the other serves the rare
            # write outside it (migrations at start-up, ``write_sync``), which simply waits
            # for the writer's lock between batches.
            self.write_engine = sqlite_engine(
                self.url, pool_size=2, immediate=True, settings=settings
            )
            self.read_engine = sqlite_engine(
                self.url, pool_size=read_pool_size, immediate=False, settings=settings
            )
            writer_threads = 1
        else:
            self.write_engine = postgres_engine(self.url, settings, pool_size=read_pool_size + 4)
            self.read_engine = self.write_engine
            writer_threads = 4
        self._write_sessions = sessionmaker(self.write_engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)
        lock_path = writer_lock_path(self.url) if writer_lock else None
        self._lock = WriterLock(lock_path) if lock_path else None
        #: The probe's own flock on the writers' lock file (its own open file: a flock taken
        #: through the writer's descriptor would not exclude the writer's thread), so the
        #: probe queues behind the writers instead of sending them into SQLite's busy handler.
        self._probe_lock = WriterLock(self._lock.path) if self._lock is not None else None
        self._group: GroupCommitWriter | None = (
            GroupCommitWriter(
                self.write_engine, lock=self._lock, timeout=settings.statement_timeout
            )
            if self.is_sqlite and group_commit
            else None
        )
        self._write_executor = ThreadPoolExecutor(writer_threads, "agentrt-db-write")
        self._read_executor = ThreadPoolExecutor(read_pool_size, "agentrt-db-read")

    def observe_commits(self, on_commit: Callable[[int, float], None]) -> None:
        """Have ``on_commit`` told each group commit's size and seconds (SQLite: the server's
        own writes are group-committed; PostgreSQL commits each transaction alone)."""
        if self._group is not None:
            self._group.on_commit = on_commit

    @property
    def is_sqlite(self) -> bool:
        return self.dialect_name == "sqlite"

    def display_url(self) -> str:
        """The URL with any password masked, for logs and error messages."""
        return self.url.render_as_string(hide_password=True)

    def check(self) -> None:
        """Open one connection, or raise :class:`DatabaseUnavailable` with a one-line reason."""
        try:
            with self.write_engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except sa.exc.DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise DatabaseUnavailable(
                f"cannot open database {self.display_url()}: {reason}"
            ) from exc

    def write_sync(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one write transaction on the calling thread; commit, or roll back."""
        with self._write_sessions.begin() as session:
            return fn(session)

    def read_sync(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one read-only transaction on the calling thread."""
        with self._read_sessions.begin() as session:
            return fn(session)

    def traced(self, operation: str) -> contextlib.AbstractContextManager[object]:
        """The span of one transaction doing ``operation`` (a no-op when untraced)."""
        return self.span(operation) if self.span is not None else contextlib.nullcontext()

    async def write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a write transaction; returns (or raises) after the commit.

        On SQLite ``fn`` may share its transaction with other queued writes (group commit,
        each in its own savepoint); it must not commit or roll back itself.
        """
        with self.traced("write"):
            return await self._write(fn)

    async def _write(self, fn: Callable[[Session], T]) -> T:
        try:
            if self._group is not None:
                return await self._group.submit(fn)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._write_executor, self.write_sync, fn)
        except Exception as exc:
            self._observed(exc)
            raise

    def write_raw_sync(self, fn: Callable[[RawTx], T]) -> T:
        """Run ``fn`` on the driver connection of one write transaction on this thread."""
        from agentrt_base.raw import RawTx

        with self.write_engine.begin() as conn:
            return fn(RawTx(conn.dialect, conn.connection.driver_connection))

    async def write_raw(self, fn: Callable[[RawTx], T]) -> T:
        """Like :meth:`write`, for a job written in plain SQL (``agentrt_base.raw``)."""
        with self.traced("write"):
            return await self._write_raw(fn)

    async def _write_raw(self, fn: Callable[[RawTx], T]) -> T:
        try:
            if self._group is not None:
                return await self._group.submit(fn, raw=True)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._write_executor, self.write_raw_sync, fn)
        except Exception as exc:
            self._observed(exc)
            raise

    def writer_lock(self) -> contextlib.AbstractContextManager[Any]:
        """The :class:`WriterLock` (a no-op without one), for a process running its batches
        itself (:func:`run_raw_batch_sqlite`)."""
        return self._lock or contextlib.nullcontext()

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one read transaction on a reader thread."""
        with self.traced("read"):
            return await self._read(fn)

    async def _read(self, fn: Callable[[Session], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._read_executor, self.read_sync, fn)
        except Exception as exc:
            self._observed(exc)
            raise

    def _observed(self, exc: Exception) -> None:
        if self.on_failure is not None and (failure := database_failure(exc)) is not None:
            self.on_failure(failure)

    def probe(self) -> None:
        """Check that the database can be reached and written now; raise the database's error
        (or :class:`DatabaseUnavailable`) if not. One small committed write, on a connection
        of its own: on SQLite a new one each time (a pooled connection keeps the write access
        it opened with, after the file became read-only), so the check sees the file as it is.
        Blocking; the caller bounds how long it waits (``runtime_service.health``)."""
        if self._probe_engine is None:
            if self.is_sqlite:
                self._probe_engine = sqlite_engine(
                    self.url, pool_size=None, immediate=True, settings=self.settings
                )
            else:
                self._probe_engine = sa.create_engine(
                    self.url,
                    pool_size=1,
                    max_overflow=0,
                    pool_pre_ping=True,
                    pool_timeout=self.settings.pool_timeout,
                    connect_args=postgres_connect_args(self.settings),
                )
        with self._probe_lock or contextlib.nullcontext(), self._probe_engine.begin() as conn:
            # Rewrites the installation row as it is: a real write, committed (so a full
            # disk shows on SQLite's WAL append or PostgreSQL's WAL flush), changing nothing.
            conn.exec_driver_sql("UPDATE installation SET create_time = create_time")
            if self.is_sqlite:
                free = conn.exec_driver_sql(
                    "SELECT (SELECT max_page_count FROM pragma_max_page_count)"
                    " - (SELECT page_count FROM pragma_page_count)"
                    " + (SELECT freelist_count FROM pragma_freelist_count)"
                ).scalar_one()
                if free < _SQLITE_MIN_FREE_PAGES:
                    raise DatabaseUnavailable("the database is full (at its max page count)")

    def dispose(self) -> None:
        """Stop the executors and close every pooled connection."""
        if self._group is not None:
            self._group.close()
        if self._lock is not None:
            self._lock.close()
        self._write_executor.shutdown(wait=True)
        self._read_executor.shutdown(wait=True)
        if self._probe_engine is not None:
            self._probe_engine.dispose()
        if self._probe_lock is not None:
            self._probe_lock.close()
        self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            self.read_engine.dispose()
