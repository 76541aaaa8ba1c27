"""The step writer process: BeginStep and EndStep off the server's GIL.

Why a second process: the server is one CPython process whose gRPC, handlers and database
writers share one GIL. At 16 workers the step path kept ~1 of this machine's 2 cores busy and
left the other mostly idle (``bench/results/steps.md``). A step is self-contained: given the
request's bytes it needs only the database and the run's bound definition. So a child process
takes it: the server forwards the request's bytes (``step_process.StepProcess``), this
process parses them (``step_wire``) and runs the step engine (``step_engine``: the same
rules and the same writes as the server's in-process path) in a group commit of its own, and
answers the engine's result, which the server settles and maps to the response.

The only difference from the in-process path is where the engine's views come from: on
SQLite from what this writer last wrote while nothing else wrote (``CachedStepStates``), on
PostgreSQL read ahead for a whole batch in one round trip (``PrefetchedStepStates``), a call
the batch could not apply that way (a second call on one run, a repeated key or a steer to
read) running right after in a transaction of its own. A call that breaks this process's
code is answered None (the server's own engine then takes it); a batch the database refuses
is too. The child commits a batch before it answers any of it, so an answer still means the
step is on disk.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect

from agentrt.runtime.v1 import worker_service_pb2 as pb
from agentrt_base import gc_policy
from agentrt_base.db import Database
from agentrt_base.db_failures import database_failure
from agentrt_base.group_commit import run_raw_batch_sqlite
from agentrt_base.raw import DeferredTx, RawTx, Writes, send_deferred
from agentrt_base.settings import DatabaseSettings
from agentrt_core.errors import AgentrtError
from agentrt_core.resolution import BoundDefinition
from runtime_service import notify
from runtime_service.fence import FenceClaim
from runtime_service.services.bound import BoundAgents
from runtime_service.step_engine import Begun, Ended, StepEngine
from runtime_service.step_process import (
    BEGIN_STEP,
    COMMIT_UNKNOWN,
    MAX_BATCH,
    Answer,
    FrameReader,
    frame,
)
from runtime_service.step_rules import StepEnd, StepRequest
from runtime_service.step_wire import fence_of, step_end_of, step_request
from runtime_service.store.step_states import CachedStepStates, PrefetchedStepStates
from runtime_service.store.steps import NeedsRead

log = logging.getLogger("agentrt.step_writer")


@dataclass(frozen=True, slots=True)
class BeginCall:
    req: StepRequest


@dataclass(frozen=True, slots=True)
class EndCall:
    fence: FenceClaim
    step_id: str
    outcome: StepEnd


@dataclass(frozen=True, slots=True)
class Answered:
    """A call answered without the database (a request the rules refuse as it is)."""

    result: Begun | Ended


Call = BeginCall | EndCall | Answered


def refused(call: Call, error: AgentrtError) -> Answered:
    """``call`` answered with ``error``: a refusal is an answer for the worker, not a failure
    of the writer."""
    return Answered(Begun(error=error) if isinstance(call, BeginCall) else Ended(error=error))


class StepJobs:
    """What the child runs for each call: the step engine."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._bound = BoundAgents()
        self.sqlite = database.is_sqlite
        #: SQLite: what this writer wrote, while nothing else writes. PostgreSQL: each batch's
        #: views, read ahead in one round trip (``store/step_states.py``).
        self.states = CachedStepStates()
        self.prefetched = PrefetchedStepStates()
        self.engine = StepEngine(self._definition, self.states if self.sqlite else self.prefetched)
        #: For the calls a PostgreSQL batch could not apply from what it read ahead.
        self.fresh = StepEngine(self._definition)

    def _definition(self, digest: str) -> BoundDefinition:
        # A run's definition is immutable and committed before the run: a read connection
        # beside the write transaction sees it.
        cached = self._bound.cached(digest)
        if cached is None:
            cached = self._database.read_sync(lambda session: self._bound.get(session, digest))
        return cached.definition

    @staticmethod
    def parse(method: int, payload: bytes) -> Call | None:
        """The call in a request's bytes; a request the rules refuse as it is comes back
        answered; None: it broke a conversion here (the server's engine then takes it).

        Any exception, not only our own errors: a request the server let through may still
        break a conversion here (a non-finite number in a Struct once did), and an exception
        escaping would end the process and every call it holds."""
        try:
            if method == BEGIN_STEP:
                return BeginCall(step_request(pb.BeginStepRequest.FromString(payload)))
            request = pb.EndStepRequest.FromString(payload)
            return EndCall(fence_of(request.fence), request.step_id, step_end_of(request))
        except AgentrtError as error:
            return Answered(Begun(error=error) if method == BEGIN_STEP else Ended(error=error))
        except Exception:
            _CALL_FAILURES.failed()
            return None

    def run(self, tx: RawTx, call: Call | None, engine: StepEngine | None = None) -> Answer | None:
        """One call on ``tx``: the engine's result and the keys to wake after the commit."""
        if call is None:
            return None
        if isinstance(call, Answered):
            return call.result, ()
        engine = engine or self.engine
        if isinstance(call, BeginCall):
            result: Begun | Ended = engine.begin(tx, call.req)
        else:
            result = engine.end(tx, call.fence, call.step_id, call.outcome)
        # The server wakes these after the answer (on PostgreSQL the batch also notifies them
        # to other replicas).
        return result, tuple(tx.wake)

    def read_ahead(self, tx: RawTx, calls: list[Call | None]) -> None:
        """PostgreSQL: lock and read every call's view in one pipelined round trip, for
        :attr:`prefetched` to answer from."""
        states = self.prefetched
        states.reset()
        with tx.pipeline():
            for call in calls:
                if isinstance(call, BeginCall):
                    states.read_begin(tx, call.req)
                elif isinstance(call, EndCall):
                    states.read_end(
                        tx, call.fence.attempt_id, call.step_id, call.outcome.output_ref
                    )
        states.collect(tx)


def child_main(
    database_url: str,
    sock: socket.socket,
    origin: str = "",
    settings: DatabaseSettings | None = None,
) -> None:
    """The step writer process: serve calls from ``sock`` until the server closes it.
    ``origin``: the server's notifier origin, for the notifications it sends (PostgreSQL);
    ``settings``: the server's database deadlines."""
    # Ctrl-C reaches the whole process group; the server decides when this process stops
    # (it closes the stream), so an interrupted batch never leaves calls unanswered.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    database = Database(
        database_url,
        read_pool_size=1,
        writer_lock=True,
        group_commit=False,
        settings=settings or DatabaseSettings(),
    )
    try:
        database.check()
        jobs = StepJobs(database)
        gc_policy.settle_long_lived()
        sock.sendall(frame("ready"))
        _serve(sock, database, jobs, origin)
    finally:
        with contextlib.suppress(Exception):
            sock.close()
        database.dispose()


def _serve(sock: socket.socket, database: Database, jobs: StepJobs, origin: str) -> None:
    reader = FrameReader()
    queued: list[tuple[int, int, bytes]] = []
    dialect = database.write_engine.dialect
    conn: Any = database.write_engine.raw_connection()
    try:
        while True:
            if not queued:
                # Everything the server sent meanwhile arrives in one read: that is the batch.
                data = sock.recv(1 << 20)
                if not data:
                    return
                queued = reader.feed(data)
                continue
            batch, queued = queued[:MAX_BATCH], queued[MAX_BATCH:]
            started = time.perf_counter()
            answers, conn = _commit(database, dialect, conn, jobs, batch, origin)
            # With how long the batch's transaction took, for the server's metrics.
            sock.sendall(frame((time.perf_counter() - started, answers)))
    finally:
        if conn is not None:
            conn.close()


class FailureLog:
    """Logs failed batches without flooding the log when they keep failing (a full disk, a
    locked file, a database restarting): the first, then at most one line per ``every``
    seconds saying how many more failed. A failure of the database (``database_failure``:
    locked, full, gone) is the database's, not a bug, so it is one line with its reason; any
    other error comes with its traceback."""

    def __init__(
        self,
        what: str = "a batch of step writes failed",
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._every = every
        self._clock = clock
        self._last_logged: float | None = None
        self._unlogged = 0

    def failed(self, exc: BaseException | None = None) -> None:
        """Call from an ``except`` block; ``exc``: the error to show, if not the one handled."""
        now = self._clock()
        if self._last_logged is None or now - self._last_logged >= self._every:
            more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
            error = exc if exc is not None else sys.exc_info()[1]
            failure = database_failure(error) if isinstance(error, Exception) else None
            if failure is not None:
                log.warning(
                    "%s%s (%s: %s); the server takes its calls",
                    self._what,
                    more,
                    failure.reason,
                    (str(error).splitlines() or [type(error).__name__])[0],
                )
            else:
                log.error(
                    "%s%s; the server takes its calls", self._what, more, exc_info=error or True
                )
            self._last_logged, self._unlogged = now, 0
        else:
            self._unlogged += 1


_FAILURES = FailureLog()
_UNREACHABLE = FailureLog("the step writer cannot open a database connection")
#: A bug of ours that one request reached (the server's own path then answers that request).
_CALL_FAILURES = FailureLog("a step call failed unexpectedly in the step writer process")


def _commit(
    database: Database,
    dialect: Dialect,
    conn: Any,
    jobs: StepJobs,
    batch: list[tuple[int, int, bytes]],
    origin: str = "",
) -> tuple[list[tuple[int, Any, tuple[str, ...]]], Any]:
    """Run a batch of calls in one transaction; answer each (None: the server takes it).
    ``origin``: the server's notifier origin, which its notifications carry (PostgreSQL).
    ``conn`` is None after a batch failed and no new connection could be opened (the
    database is down or restarting): until one opens, the server takes every call."""
    if conn is None:
        conn = _connect(database)
        if conn is None:
            return [(job, None, ()) for job, _, _ in batch], None
    calls = [jobs.parse(method, payload) for _, method, payload in batch]
    try:
        results = _run_batch(database, dialect, conn, jobs, calls, origin)
    except _CommitUnknown as unknown:
        # A call that wrote nothing (a refusal, a repeated key: nothing to wake) keeps its
        # answer, which does not depend on the commit; one not run goes to the server; the
        # others may or may not be committed.
        _FAILURES.failed()
        with contextlib.suppress(Exception):
            conn.invalidate()
        conn = _connect(database)
        results = [
            result if result is None or not result[1] else (COMMIT_UNKNOWN, ())
            for result in unknown.results
        ]
    except Exception:
        # Nothing of the batch committed: the server takes every call of it, and answers
        # whatever error there is to answer one call at a time.
        jobs.states.clear()  # what the batch's jobs remembered was rolled back
        _FAILURES.failed()
        with contextlib.suppress(Exception):
            conn.invalidate()  # a fresh connection, in case this one is the problem
        conn = _connect(database)
        results = [None] * len(batch)
    answers: list[tuple[int, Any, tuple[str, ...]]] = []
    for (job, _, _), result in zip(batch, results, strict=True):
        answers.append((job, None, ()) if result is None else (job, result[0], result[1]))
    return answers, conn


def _run_batch(
    database: Database,
    dialect: Dialect,
    conn: Any,
    jobs: StepJobs,
    calls: list[Call | None],
    origin: str,
) -> list[Answer | None]:
    """One transaction for ``calls``. A call that raises anything but a database error is
    handed back alone (answered None): the batch is rolled back and runs again without it,
    so one request that reaches a bug costs the others a retry, not a trip to the server.
    Each retry hands back one more call; should a call fail again once handed back (it is
    then None: a bug in this function), the batch fails as a whole after as many retries as
    calls."""
    for _ in range(len(calls) + 1):
        try:
            if jobs.sqlite:
                # First in the transaction: the cached step states are checked against other
                # writers.
                fns: list[Callable[[RawTx], Any]] = [jobs.states.validate]
                fns += [
                    functools.partial(_run_call, jobs, index, call=call)
                    for index, call in enumerate(calls)
                ]
                with database.writer_lock():
                    return run_raw_batch_sqlite(dialect, conn.driver_connection, fns)[1:]
            return _postgres_batch(dialect, conn.driver_connection, jobs, calls, origin)
        except _CallRefused as refusal:
            # A refusal the engine raised rather than returned (it may have written before
            # it knew): rolled back with the batch, which runs again with the call answered.
            # An answer, so nothing is logged.
            jobs.states.clear()  # what the batch's jobs remembered was rolled back
            calls = [
                refused(call, refusal.error) if i == refusal.index and call is not None else call
                for i, call in enumerate(calls)
            ]
        except _CallFailed as failed:
            jobs.states.clear()  # what the batch's jobs remembered was rolled back
            _CALL_FAILURES.failed(failed.__cause__)
            calls = [None if i == failed.index else call for i, call in enumerate(calls)]
    raise RuntimeError("the calls of a step batch kept failing one by one")


def _run_call(
    jobs: StepJobs, index: int, tx: RawTx, call: Call | None, engine: StepEngine | None = None
) -> Answer | None:
    """:meth:`StepJobs.run`, telling a refusal or a failure of this call apart from one of
    the database."""
    try:
        return jobs.run(tx, call, engine)
    except NeedsRead:
        raise
    except AgentrtError as exc:
        raise _CallRefused(index, exc) from exc
    except Exception as exc:
        if _is_database_error(exc):
            raise  # the database's, not this call's: the batch as a whole fails
        raise _CallFailed(index) from exc


def _is_database_error(exc: BaseException) -> bool:
    """Whether a driver or SQLAlchemy raised ``exc`` (by module: the child imports psycopg
    only on PostgreSQL)."""
    return type(exc).__module__.partition(".")[0] in ("sqlite3", "psycopg", "sqlalchemy")


class _CallFailed(Exception):
    """The call at ``index`` of a batch raised something other than a database error."""

    def __init__(self, index: int) -> None:
        super().__init__(f"call {index} of the batch failed")
        self.index = index


class _CallRefused(Exception):
    """The call at ``index`` of a batch was refused (``error``) by a raise, not an answer."""

    def __init__(self, index: int, error: AgentrtError) -> None:
        super().__init__(f"call {index} of the batch was refused: {error.message}")
        self.index = index
        self.error = error


def _connect(database: Database) -> Any:
    """A new write connection, or None if the database cannot be reached now."""
    try:
        return database.write_engine.raw_connection()
    except Exception:
        _UNREACHABLE.failed()
        return None


class _CommitUnknown(Exception):
    """The connection broke after the batch's COMMIT was sent: it may have committed."""

    def __init__(self, results: list[Answer | None]) -> None:
        super().__init__("the connection broke during COMMIT")
        self.results = results


def _postgres_batch(
    dialect: Dialect, driver: Any, jobs: StepJobs, calls: list[Call | None], origin: str
) -> list[Answer | None]:
    """A batch on PostgreSQL in two round trips: every call's lock and read, pipelined; then,
    the calls decided from what was read, every write, the NOTIFY and the COMMIT, pipelined.

    Round trips, and the database's own work on its one backend, are what a batch waits for;
    psycopg's per-statement work is what it spends CPU on. At 16 workers (a throwaway load
    script, runs minutes apart): call by call, two round trips each, ~460 Begin+End pairs/s;
    read ahead, ~590; with one ``executemany`` per statement, ~700. The server's writer
    threads, a transaction per call, made ~340."""
    tx = RawTx(dialect, driver)
    writes: list[Writes] = []
    results: list[Answer | None] = []
    later: list[int] = []
    commit_sent = False
    try:
        jobs.read_ahead(tx, calls)
        keys: list[str] = []
        for index, call in enumerate(calls):
            job_tx = DeferredTx(dialect, writes)
            try:
                results.append(_run_call(jobs, index, job_tx, call))
            except NeedsRead:
                # (It wrote nothing.) Run after this batch, on a transaction that reads.
                results.append(None)
                later.append(index)
                continue
            keys += job_tx.wake
        with tx.pipeline():
            send_deferred(tx, writes)
            notify.notify_raw(tx, keys, origin)
            commit_sent = True
            driver.commit()
    except BaseException as exc:
        # A statement the database refused aborts the transaction, COMMIT or not; a broken
        # connection after the COMMIT went out leaves the outcome unknown.
        if commit_sent and driver.broken:
            raise _CommitUnknown(results) from exc
        with contextlib.suppress(Exception):
            driver.rollback()
        raise
    for index in later:
        results[index] = _postgres_alone(dialect, driver, jobs, index, calls[index], origin)
    return results


def _postgres_alone(
    dialect: Dialect, driver: Any, jobs: StepJobs, index: int, call: Call | None, origin: str
) -> Answer | None:
    """One call in a transaction of its own, its views read as it goes (a call its batch
    could not apply from what it read ahead). The batch before it is committed, so whatever
    happens here is this call's alone: a failure answers None (the server's engine takes
    the call), a COMMIT whose outcome is unknown answers so."""
    commit_sent = False
    try:
        tx = RawTx(dialect, driver)
        answer = _run_call(jobs, index, tx, call, jobs.fresh)
        notify.notify_raw(tx, tx.wake, origin)
        commit_sent = True
        driver.commit()
        return answer
    except Exception as exc:
        if commit_sent and driver.broken:
            _FAILURES.failed(exc)
            return COMMIT_UNKNOWN, ()
        with contextlib.suppress(Exception):
            driver.rollback()
        if isinstance(exc, _CallRefused) and call is not None:
            return refused(call, exc.error).result, ()  # an answer (rolled back), no failure
        (_CALL_FAILURES if isinstance(exc, _CallFailed) else _FAILURES).failed(exc)
        return None


def _zygote_main(control_fd: int) -> None:
    """The zygote (:class:`_Zygote`): fork a step writer process for each request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    control = socket.socket(fileno=control_fd)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 1)
        except OSError:
            return
        if not message or not fds:
            return  # the server process has gone
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                origin, settings, database_url = message.decode().split("\n", 2)
                child_main(
                    database_url,
                    socket.socket(fileno=fds[0]),
                    origin,
                    DatabaseSettings(**json.loads(settings)),
                )
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        control.sendall(str(pid).encode())


if __name__ == "__main__":
    # Run the module under its own name, so the zygote and its children have one copy of it.
    from runtime_service.step_writer import _zygote_main as zygote_main

    zygote_main(int(sys.argv[1]))
