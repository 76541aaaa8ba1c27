"""The SQLite group-commit writer, and the plain-SQL batch of the step writer process.

Both run many callers' jobs in one transaction so that one fsync covers them all; the writer
gives each job a savepoint of its own, the step process's batch is all or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import Session

from agentrt_base.db_engines import WriterLock
from agentrt_base.db_failures import WriteTimeout, database_failure

T = TypeVar("T")

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
        #: Told each batch that committed: its size and its transaction's seconds (the
        #: metrics; called on the writer thread). None: nobody.
        self.on_commit: Callable[[int, float], None] | None = None
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
                started = time.perf_counter()
                outcomes = _run_batch(self._connection(), [(job.fn, job.raw) for job in batch])
                took = time.perf_counter() - started
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
            if self.on_commit is not None:
                self.on_commit(len(batch), took)
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
    # Imported here, not at the top: raw imports agentrt_base.db, which imports this module.
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
    transactions are off: see ``agentrt_base.db_engines.sqlite_engine``), for a process that
    writes nothing else (``runtime_service.step_process``); SQLAlchemy's transaction
    bookkeeping cost more than a batch's BEGIN and COMMIT. All or nothing: no savepoint per
    job (two statements each), so a job that raises rolls the whole batch back and the
    exception propagates; the caller hands every job of it to a writer that can refuse them
    one by one."""
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
