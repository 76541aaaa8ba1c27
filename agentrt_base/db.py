"""The storage base both services share: declarative base, engine factory, session runners.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Dialect, Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.pool import NullPool

from agentrt_base import errors
from agentrt_base.settings import DatabaseSettings

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


class DatabaseUnavailable(Exception):
    """The database cannot be reached or opened; the message is one line, fit for an operator."""


class WriteTimeout(Exception):
    """A SQLite write call waited longer than its deadline for the group-commit writer.

    ``started``: the writer had already taken the job into a transaction, so it may still
    commit (the outcome is unknown); otherwise it was withdrawn and will never run.
    """

    def __init__(self, started: bool) -> None:
        super().__init__("the write waited past its deadline for the database writer")
        self.started = started


#: PostgreSQL SQLSTATEs of a lost or closing connection (class 08, and the server shutting
#: down or crashing: 57P01-57P03), and of a transaction that lost a conflict (serialization
#: failure, deadlock). https://www.postgresql.org/docs/current/errcodes-appendix.html
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03")
_CONFLICT = ("40001", "40P01")
#: A statement cancelled by ``statement_timeout`` (57014, also an operator's cancel) or a lock
#: not granted within ``lock_timeout`` (55P03): the server's own deadlines.
_PG_TIMEOUT = ("57014", "55P03")
_PG_DISK_FULL = "53100"
_PG_TOO_MANY_CONNECTIONS = "53300"
#: A write in a read-only transaction: a standby, or ``default_transaction_read_only``.
_PG_READ_ONLY = "25006"
#: SQLite's primary result codes (the driver reports extended ones; the low byte is the
#: primary): a lock not taken within the busy timeout, a full database or disk, a file that
#: cannot be written, an I/O error, a file that cannot be opened.
_SQLITE_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
#: The health probe calls a SQLite database full below this many free pages (within its
#: ``sqlite_max_bytes``): small writes may still fit, the next larger one would not.
_SQLITE_MIN_FREE_PAGES = 16


def database_failure(exc: BaseException) -> errors.AgentrtError | None:
    """The error to answer for a failure of the database rather than of the call, or None.

    Every one is retryable by the caller, with the call's idempotency key or request id:

    * ``UNAVAILABLE``: a lost connection or one that cannot be opened (the call may or may not
      have taken effect: ``DATABASE_UNAVAILABLE``); SQLite busy past its busy timeout
      (``DATABASE_BUSY``); a database that refuses writes, a read-only SQLite file or a
      PostgreSQL standby (``DATABASE_READ_ONLY``); SQLite's I/O errors (``DATABASE_IO_ERROR``);
      a server-side deadline passed: PostgreSQL ``statement_timeout`` or ``lock_timeout``, no
      pooled connection free in time, a SQLite write not committed in time
      (``DATABASE_TIMEOUT``; ``COMMIT_OUTCOME_UNKNOWN`` if the SQLite writer had started it).
      ``UNAVAILABLE`` rather than ``DEADLINE_EXCEEDED``: that code means the caller's own
      deadline, and retry policies do not retry it.
    * ``RESOURCE_EXHAUSTED``: the database or its disk is full (``DATABASE_FULL``).
    * ``ABORTED``: a serialization failure or deadlock (``TRANSACTION_CONFLICT``).

    Anything else raised by the database is a bug of ours (``INTERNAL``). Takes SQLAlchemy's
    wrapped errors and the drivers' own (the plain-SQL step path raises those).
    """
    if isinstance(exc, WriteTimeout):
        if exc.started:
            return errors.Unavailable(
                "the database did not commit the write within the server's deadline: it may"
                " or may not have taken effect; retry with the same idempotency key or"
                " request id",
                reason="COMMIT_OUTCOME_UNKNOWN",
            )
        return _timeout("the write waited past the server's deadline; nothing was written")
    if isinstance(exc, sa.exc.TimeoutError):  # the pool had no connection free in time
        return _timeout("no database connection was free within the server's deadline")
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return _lost()
    sqlstate = getattr(orig, "sqlstate", None)
    module = type(orig).__module__
    if module.startswith("psycopg"):
        import psycopg

        if sqlstate in _CONFLICT:
            return errors.Aborted(
                "the transaction conflicted with another and was rolled back; retry",
                reason="TRANSACTION_CONFLICT",
            )
        if sqlstate in _PG_TIMEOUT:
            return _timeout("the database did not answer within the server's deadline")
        if sqlstate == _PG_DISK_FULL:
            return _full()
        if sqlstate == _PG_READ_ONLY:
            return _read_only()
        if sqlstate == _PG_TOO_MANY_CONNECTIONS:
            return _lost()
        if isinstance(orig, psycopg.OperationalError) and (
            sqlstate is None or sqlstate.startswith(_CONNECTION_LOST)
        ):
            return _lost()
    if module == "sqlite3":
        code = getattr(orig, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary in _SQLITE_BUSY:
            return errors.Unavailable(
                "the database stayed locked past the busy timeout; retry", reason="DATABASE_BUSY"
            )
        if primary == _SQLITE_FULL:
            return _full()
        if primary == _SQLITE_READONLY:
            return _read_only()
        if primary == _SQLITE_IOERR:
            return errors.Unavailable(
                "the database file could not be read or written (an I/O error); retry",
                reason="DATABASE_IO_ERROR",
            )
        if primary == _SQLITE_CANTOPEN:
            return _lost()
    return None


def _timeout(what: str) -> errors.AgentrtError:
    return errors.Unavailable(f"{what}; retry", reason="DATABASE_TIMEOUT")


def _full() -> errors.AgentrtError:
    return errors.ResourceExhausted(
        "the database or its disk is full; nothing was written; retry when space is freed",
        reason="DATABASE_FULL",
    )


def _read_only() -> errors.AgentrtError:
    return errors.Unavailable(
        "the database accepts no writes now (read-only); nothing was written; retry",
        reason="DATABASE_READ_ONLY",
    )


def _lost() -> errors.AgentrtError:
    return errors.Unavailable(
        "the database connection was lost during the call: it may or may not have taken"
        " effect; retry with the same idempotency key or request id",
        reason="DATABASE_UNAVAILABLE",
    )


def normalise_url(url: str) -> URL:
    """Parse a database URL, selecting psycopg 3 for a bare ``postgresql://`` URL.

    A malformed URL raises :class:`DatabaseUnavailable` here, one line an operator can act
    on, rather than SQLAlchemy's error when the engine is built (a traceback at start-up).
    """
    try:
        parsed = make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        # Not echoed: the text may hold a password.
        raise DatabaseUnavailable(f"the database URL is not a URL: {_URL_FORMS}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise DatabaseUnavailable(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite:/// or postgresql://"
        )
    try:
        # The dialect's own checks of the rest (sqlite://x.db names a host, not a file; an
        # unknown driver; a port that is not a number), made now.
        parsed.get_dialect()().create_connect_args(parsed)
    except (sa.exc.ArgumentError, ValueError):
        shown = parsed.render_as_string(hide_password=True)
        raise DatabaseUnavailable(f"invalid database URL {shown}: {_URL_FORMS}") from None
    return parsed


_URL_FORMS = "use sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://HOST/DB"


def _sqlite_engine(
    url: URL,
    *,
    pool_size: int | None,
    immediate: bool,
    settings: DatabaseSettings | None = None,
) -> Engine:
    """``pool_size`` None: no pool, a new connection every time (the health probe's, which
    must see the file as it is now: a pooled connection keeps the descriptors it opened)."""
    settings = settings or DatabaseSettings()
    pool: dict[str, Any] = (
        {"poolclass": NullPool}
        if pool_size is None
        else {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": settings.pool_timeout}
    )
    busy_ms = int(settings.lock_timeout * 1000)
    engine = sa.create_engine(
        url,
        # A failed statement's parameters go into the exception's text, which is logged:
        # they are the callers' content (goals, messages, arguments), not ours to log.
        hide_parameters=True,
        **pool,
        # Connections are used from executor threads, never concurrently (the pool hands each
        # to one thread at a time), so the driver's same-thread check only gets in the way.
        connect_args={"check_same_thread": False, "timeout": settings.lock_timeout},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 driver: its legacy mode issues BEGIN
        # lazily, only before DML, which silently breaks savepoints and BEGIN IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before it is acknowledged (NORMAL in WAL mode may lose the
        # last transactions on power loss, and we promise nothing acknowledged is lost).
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        if settings.sqlite_max_bytes is not None:
            (page_size,) = cursor.execute("PRAGMA page_size").fetchone()
            cursor.execute(
                f"PRAGMA max_page_count={max(1, settings.sqlite_max_bytes // page_size)}"
            )
        # Savepoints (one per job in a group commit) keep their sub-journals in memory, not
        # in a temporary file created and unlinked for every job.
        cursor.execute("PRAGMA temp_store=MEMORY")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgres_engine(url: URL, settings: DatabaseSettings, *, pool_size: int) -> Engine:
    return sa.create_engine(
        url,
        hide_parameters=True,  # as for SQLite: callers' content stays out of the log
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=settings.pool_timeout,
        connect_args=postgres_connect_args(settings),
    )


def postgres_connect_args(settings: DatabaseSettings) -> dict[str, Any]:
    """The server's deadlines as libpq connection parameters: every statement of every
    session is bounded, so a frozen database answers ``DATABASE_TIMEOUT``, not silence."""
    statement_ms = int(settings.statement_timeout * 1000)
    lock_ms = int(settings.lock_timeout * 1000)
    return {
        # libpq takes whole seconds (and ignores values under 2).
        "connect_timeout": max(2, round(settings.connect_timeout)),
        "options": f"-c statement_timeout={statement_ms} -c lock_timeout={lock_ms}",
    }


class WriterLock:
    """An exclusive ``flock`` held around each write transaction, for when a second process
    writes the same SQLite file (``runtime_service.step_process``).

    SQLite's own lock would serialise the two writers too, but a writer that finds it taken
    polls with sleeps of 1, 2, 5, 10… ms (its busy handler), which is what drives p99 into the
    100 ms range (``shared/PERFORMANCE.md``); a waiter on ``flock`` is woken by the kernel the
    moment the other lets go. The lock file sits beside the database.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def writer_lock_path(url: URL) -> str | None:
    """Where the :class:`WriterLock` of a SQLite file lives (None for an in-memory database)."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return database + "-agentrt-writer.lock"


_QUEUED, _TAKEN, _WITHDRAWN = 0, 1, 2


@dataclass(eq=False)
class _Job:
    fn: Callable[[Any], Any]
    #: Settled on ``loop``, the caller's, after the commit.
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    #: True: ``fn`` takes a :class:`~agentrt_base.raw.RawTx`, not a Session.
    raw: bool
    #: Queued, taken into a transaction by the writer, or withdrawn by its deadline; moved
    #: only under the writer's ``_claims`` lock, so a job is either withdrawn (never runs)
    #: or taken (its caller is told the outcome is unknown), never both.
    state: int = _QUEUED
    deadline: asyncio.TimerHandle | None = None


class GroupCommitWriter:
    """The single SQLite writer, committing whatever is queued together.

    Handlers enqueue write functions; the writer thread takes everything waiting, runs each
    in its own SAVEPOINT inside one transaction (so one refused request rolls back only its
    own work), commits once, and only then answers every waiter. One fsync covers the batch,
    so durable commits cost about what unsynchronised ones do (``shared/PERFORMANCE.md``,
    "group commit"), and nothing is acknowledged before it is on disk.

    Each ORM job gets a Session of its own, joined to the batch's connection: jobs never see
    each other's identity map, so a raw job (plain SQL on the driver connection) between two
    ORM jobs cannot leave a later one reading a stale object.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 64,
        lock: WriterLock | None = None,
        timeout: float | None = None,
    ) -> None:
        """``timeout``: how long a call waits for its commit (the server's deadline): a job
        still queued then is withdrawn and answered :class:`WriteTimeout`, one already in a
        transaction is answered as of unknown outcome."""
        self._engine = engine
        self._max_batch = max_batch
        self._timeout = timeout
        self._claims = threading.Lock()
        self._lock: contextlib.AbstractContextManager[Any] = lock or contextlib.nullcontext()
        self._conn: sa.Connection | None = None
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="agentrt-db-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Any], T], *, raw: bool = False) -> asyncio.Future[T]:
        """Queue ``fn`` from a coroutine; the result comes back on the caller's loop after the
        commit, with one wake-up of that loop per batch rather than one per job."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Job(fn, future, loop, raw)
        if self._timeout is not None:
            job.deadline = loop.call_later(self._timeout, self._expire, job)
        self._queue.put(job)
        return future

    def _expire(self, job: _Job) -> None:
        """The job's deadline passed (on its loop): answer the caller now."""
        if job.future.done():
            return
        with self._claims:
            started = job.state == _TAKEN
            job.state = _WITHDRAWN if not started else job.state
        job.future.set_exception(WriteTimeout(started))

    def _take(self, batch: list[_Job]) -> list[_Job]:
        """The jobs of ``batch`` to run: not withdrawn, their caller still waiting."""
        taken = []
        with self._claims:
            for job in batch:
                # A job whose caller gave up before it ran does not run: nothing was
                # acknowledged.
                if job.state == _QUEUED and not job.future.done():
                    job.state = _TAKEN
                    taken.append(job)
        return taken

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._discard()

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            stopping = False
            while len(batch) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.append(more)
            self._commit(batch)
            if stopping:
                return

    def _connection(self) -> sa.Connection:
        # The writer keeps its one connection: checking it out of the pool and back for
        # every batch cost more than a small batch's own statements.
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def _discard(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                # Invalidated, not returned to the pool: the driver connection is closed, and
                # the next one is opened anew (a pooled one would keep its old descriptors).
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()

    def _commit(self, batch: list[_Job]) -> None:
        batch = self._take(batch)
        if not batch:
            return
        try:
            with self._lock:
                outcomes = _run_batch(self._connection(), [(job.fn, job.raw) for job in batch])
        except Exception as exc:
            # The transaction itself failed (the commit, or the database: full, read-only,
            # locked): nothing of the batch is durable, so nobody succeeded, and each caller
            # hears the database's error; the connection starts afresh. The thread lives on.
            self._discard()
            failure = exc.error if isinstance(exc, _BatchBroken) else exc
            outcomes = [(False, failure)] * len(batch)
        else:
            if any(not ok and database_failure(value) is not None for ok, value in outcomes):
                # A job met the database's failure (an I/O error, a file gone read-only):
                # the next batch opens a new connection, which sees the file as it is now.
                self._discard()
        _answer(batch, outcomes)


def _run_batch(
    conn: sa.Connection, jobs: Sequence[tuple[Callable[[Any], Any], bool]]
) -> list[tuple[bool, Any]]:
    """Run ``jobs`` (each a function and whether it takes a RawTx) in one transaction of
    ``conn``, each in a savepoint of its own, and commit: one job's failure rolls back only
    its own work. Returns ``(True, result)`` or ``(False, exception)`` per job; raises, with
    nothing committed, if the transaction itself fails."""
    # A lone job needs no savepoint: if it fails, the whole transaction rolls back.
    alone = len(jobs) == 1
    outcomes: list[tuple[bool, Any]] = []
    transaction = conn.begin()
    driver = conn.connection.driver_connection
    try:
        for fn, raw in jobs:
            try:
                outcomes.append((True, _run_job(conn, fn, raw, savepoint=not alone)))
            except _BatchBroken:
                raise
            except Exception as exc:
                if not getattr(driver, "in_transaction", True):
                    # SQLite rolled the whole transaction back itself (it does on a full
                    # database or disk, and some I/O errors): the earlier jobs' work is gone,
                    # and later statements would run outside any transaction.
                    raise _BatchBroken(_database_cause(exc)) from exc
                outcomes.append((False, exc))
        if alone and not outcomes[0][0]:
            # (A lone ORM job that failed has already rolled it back itself.)
            if transaction.is_active:
                transaction.rollback()
        else:
            transaction.commit()
    except BaseException:
        if transaction.is_active:
            transaction.rollback()
        raise
    return outcomes


def _database_cause(exc: BaseException) -> BaseException:
    """The failure of the database behind ``exc``: an ORM job whose statement met a full
    database raises the error of rolling back its savepoint, which SQLite had already
    dropped ("no such savepoint"), with the real cause as its context."""
    seen: BaseException | None = exc
    while seen is not None:
        if database_failure(seen) is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


class _BatchBroken(Exception):
    """A job failed and its savepoint could not be rolled back, or the database rolled the
    whole transaction back: fail the whole batch, each caller answered ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _answer(batch: list[_Job], outcomes: list[tuple[bool, Any]]) -> None:
    """Settle every waiter of a batch, with one ``call_soon_threadsafe`` per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, bool, Any]]] = {}
    for job, (ok, value) in zip(batch, outcomes, strict=True):
        by_loop.setdefault(job.loop, []).append((job, ok, value))
    for loop, settled in by_loop.items():
        # A loop closed meanwhile has nobody left to answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: list[tuple[_Job, bool, Any]]) -> None:
    for job, ok, value in settled:
        future = job.future
        if job.deadline is not None:
            job.deadline.cancel()
        # Done already: the caller gave up while the batch ran, or its deadline answered it
        # (as of unknown outcome); either way it is committed.
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _run_job(conn: sa.Connection, fn: Callable[[Any], Any], raw: bool, *, savepoint: bool) -> Any:
    """Run one job in ``conn``'s open transaction, inside a savepoint of its own if asked."""
    if raw:
        return _run_raw(conn.dialect, conn.connection.driver_connection, fn, savepoint=savepoint)
    session = Session(
        bind=conn,
        join_transaction_mode="create_savepoint" if savepoint else "rollback_only",
        expire_on_commit=False,
    )
    with session, session.begin():
        return fn(session)


def _run_raw(dialect: Dialect, driver: Any, fn: Callable[[Any], Any], *, savepoint: bool) -> Any:
    """Run a plain-SQL job on ``driver``'s open transaction, in a savepoint if asked."""
    from agentrt_base.raw import RawTx

    tx = RawTx(dialect, driver)
    if not savepoint:
        return fn(tx)
    # Plain SAVEPOINT statements on the driver connection: SQLAlchemy's nested
    # transaction costs more than the job's own statements.
    driver.execute("SAVEPOINT agentrt_job")
    try:
        result = fn(tx)
    except BaseException as failure:
        try:
            driver.execute("ROLLBACK TO SAVEPOINT agentrt_job")
            driver.execute("RELEASE SAVEPOINT agentrt_job")
        except Exception as exc:
            # The job's partial writes could not be undone: the batch must not commit.
            raise _BatchBroken(failure) from exc
        raise
    driver.execute("RELEASE SAVEPOINT agentrt_job")
    return result


def run_raw_batch_sqlite(
    dialect: Dialect, driver: Any, jobs: Sequence[Callable[[Any], Any]]
) -> list[Any]:
    """Plain-SQL jobs in one transaction straight on a sqlite3 connection (whose driver
    transactions are off: see ``_sqlite_engine``), for a process that writes nothing else
    (``runtime_service.step_process``); SQLAlchemy's transaction bookkeeping cost more than
    a batch's BEGIN and COMMIT. All or nothing: no savepoint per job (two statements each),
    so a job that raises rolls the whole batch back and the exception propagates; the caller
    hands every job of it to a writer that can refuse them one by one."""
    from agentrt_base.raw import RawTx

    driver.execute("BEGIN IMMEDIATE")
    try:
        results = [fn(RawTx(dialect, driver)) for fn in jobs]
        driver.execute("COMMIT")
    except BaseException:
        if driver.in_transaction:
            driver.execute("ROLLBACK")
        raise
    return results


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
        self._probe_engine: Engine | None = None
        if self.is_sqlite:
            # Two: the group-commit writer keeps one for itself; the other serves the rare
            # write outside it (migrations at start-up, ``write_sync``), which simply waits
            # for the writer's lock between batches.
            self.write_engine = _sqlite_engine(
                self.url, pool_size=2, immediate=True, settings=settings
            )
            self.read_engine = _sqlite_engine(
                self.url, pool_size=read_pool_size, immediate=False, settings=settings
            )
            writer_threads = 1
        else:
            self.write_engine = _postgres_engine(self.url, settings, pool_size=read_pool_size + 4)
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

    async def write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a write transaction; returns (or raises) after the commit.

        On SQLite ``fn`` may share its transaction with other queued writes (group commit,
        each in its own savepoint); it must not commit or roll back itself.
        """
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
                self._probe_engine = _sqlite_engine(
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
