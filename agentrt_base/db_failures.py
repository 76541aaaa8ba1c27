"""Which failures are the database's rather than the call's, and what each caller is told.

:func:`database_failure` is the one place a database error becomes a code and a reason
(``docs/api.md``); the gRPC interceptor (``agentrt_base.grpc_errors``), the group-commit writer
and the step writer process all ask it. The exceptions raised by the storage base itself live
here too, so classifying them needs nothing but this module.
"""

from __future__ import annotations

import sqlalchemy as sa

from agentrt_core import errors, reasons


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
                reason=reasons.COMMIT_OUTCOME_UNKNOWN,
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
                reason=reasons.TRANSACTION_CONFLICT,
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
                "the database stayed locked past the busy timeout; retry",
                reason=reasons.DATABASE_BUSY,
            )
        if primary == _SQLITE_FULL:
            return _full()
        if primary == _SQLITE_READONLY:
            return _read_only()
        if primary == _SQLITE_IOERR:
            return errors.Unavailable(
                "the database file could not be read or written (an I/O error); retry",
                reason=reasons.DATABASE_IO_ERROR,
            )
        if primary == _SQLITE_CANTOPEN:
            return _lost()
    return None


def _timeout(what: str) -> errors.AgentrtError:
    return errors.Unavailable(f"{what}; retry", reason=reasons.DATABASE_TIMEOUT)


def _full() -> errors.AgentrtError:
    return errors.ResourceExhausted(
        "the database or its disk is full; nothing was written; retry when space is freed",
        reason=reasons.DATABASE_FULL,
    )


def _read_only() -> errors.AgentrtError:
    return errors.Unavailable(
        "the database accepts no writes now (read-only); nothing was written; retry",
        reason=reasons.DATABASE_READ_ONLY,
    )


def _lost() -> errors.AgentrtError:
    return errors.Unavailable(
        "the database connection was lost during the call: it may or may not have taken"
        " effect; retry with the same idempotency key or request id",
        reason=reasons.DATABASE_UNAVAILABLE,
    )
