"""Engines for a database URL: the URL checked up front, SQLite and PostgreSQL engines set up on
connect, and the ``flock`` that lets two processes take turns writing one SQLite file.

What each engine is for (one writer connection on SQLite, a pool on PostgreSQL) is decided by
:class:`agentrt_base.db.Database`; this module only builds them.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

from agentrt_base.db_failures import DatabaseUnavailable
from agentrt_base.settings import DatabaseSettings


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


def sqlite_engine(
    url: URL,
    *,
    pool_size: int | None,
    immediate: bool,
    settings: DatabaseSettings | None = None,
) -> Engine:
    """An engine on a SQLite file, each connection set up as agentrt needs it (below).

    ``pool_size`` None: no pool, a new connection every time (the health probe's, which
    must see the file as it is now: a pooled connection keeps the descriptors it opened).
    ``immediate``: each transaction starts with ``BEGIN IMMEDIATE`` (a writer's), else
    ``BEGIN``."""
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


def postgres_engine(url: URL, settings: DatabaseSettings, *, pool_size: int) -> Engine:
    """A pooled engine on PostgreSQL, every session bounded by the server's deadlines."""
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
