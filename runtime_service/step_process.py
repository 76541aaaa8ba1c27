"""The step writer process: BeginStep and EndStep's common case, off the server's GIL.

Why a second process: the server is one CPython process whose gRPC, handlers and database
writers share one GIL. At 16 workers the step path kept ~1 of this machine's 2 cores busy and
left the other mostly idle (``bench/results/steps.md``). A step's common case
(:class:`~runtime_service.services.steps.CommonPath`: a handful of statements and one
hash-chained event) is self-contained: given the request's bytes it needs only the database
and the run's bound definition. So a child process takes it: the server forwards the
request's bytes, the child parses and checks them and writes the step in a group commit of
its own, and the server builds the answer from the step the child recorded.

Everything else stays with the server. For a request that is not the common case (one to
refuse, a denial or budget stop to record, a steer to deliver, a repeated idempotency key, an
invalid request, an error of any kind) the child answers None having written nothing, and the
server's own path handles the call exactly as it would without the child; so does a request
that breaks the child's own code (it catches every exception of a call). If the child dies
anyway, the calls it held fail ``UNAVAILABLE`` (each step may or may not be recorded; a retry
with the same idempotency key is safe), later calls take the in-process path, and
:class:`StepProcess` starts a new child after a :class:`Backoff`.

Two writers on one SQLite file: both hold the database's
:class:`~agentrt_base.db_engines.WriterLock` around each transaction, so neither ever sleeps in
SQLite's busy handler. On PostgreSQL a batch takes two round trips (:func:`_postgres_batch`)
and row locks order the two writers as they order the server's own transactions; its NOTIFY
carries the server's origin (passed at fork), so other replicas wake and the server skips
the echo.

Wire: length-prefixed pickles over a private socketpair between the two processes (nothing
else can write to it). Server to child: ``(job, method, request bytes)``. Child to server, per
committed batch: a list of ``(job, answer or None, keys to wake)``, where the answer is the
step's columns (and, for BeginStep, the run's agent digest): the server builds the response
protos, which keeps the child, the busier of the two, to the writing. The child commits a
batch before it answers any of it, so an answer still means the step is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, Dialect

from agentrt.runtime.v1 import worker_service_pb2 as pb
from agentrt_base import gc_policy
from agentrt_base.db import Database
from agentrt_base.db_failures import database_failure
from agentrt_base.errors import AgentrtError, Unavailable
from agentrt_base.group_commit import run_raw_batch_sqlite
from agentrt_base.raw import DeferredTx, RawTx, Writes, send_deferred
from agentrt_base.settings import DatabaseSettings
from runtime_service import notify
from runtime_service.notify import Notifier
from runtime_service.servicers.step_messages import step_end_of, step_request
from runtime_service.services.bound import Bound, BoundAgents
from runtime_service.services.steps import CommonPath, StepEnd, StepRequest, check_step_request
from runtime_service.store.step_sql import step_tuple
from runtime_service.store.step_states import CachedStepStates, PrefetchedStepStates

log = logging.getLogger("agentrt.step_process")

BEGIN_STEP = 1
END_STEP = 2

_HEADER = struct.Struct(">I")
#: Jobs per transaction in the child (the server's group commit uses the same bound).
_MAX_BATCH = 64
#: How long start-up waits for the child to open the database and say it is ready.
_START_TIMEOUT = 60.0

#: What the child answers for one call: its result and the keys to wake.
Answer = tuple[Any, tuple[str, ...]]
#: The child's answer for a call whose writes went with a COMMIT whose outcome it never
#: learnt (the connection broke): the server answers UNAVAILABLE, never takes the call itself.
COMMIT_UNKNOWN = "commit-outcome-unknown"


def frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream back into the objects :func:`frame` framed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        out: list[Any] = []
        buffer, pos = self._buffer, 0
        while len(buffer) - pos >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer, pos)
            end = pos + _HEADER.size + size
            if end > len(buffer):
                break
            out.append(pickle.loads(buffer[pos + _HEADER.size : end]))
            pos = end
        del buffer[:pos]
        return out


def child_database_url(url: URL) -> str:
    """The URL the child opens: the same database; for SQLite the same file by absolute path
    (its working directory is not the server's)."""
    if url.get_backend_name() != "sqlite":
        return url.render_as_string(hide_password=False)
    assert url.database
    return url.set(database=os.path.abspath(url.database)).render_as_string(hide_password=False)


# -- the server's side ------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    def __init__(self, owner: StepProcess) -> None:
        self._owner = owner
        self._reader = FrameReader()

    def data_received(self, data: bytes) -> None:
        for answers in self._reader.feed(data):
            self._owner._answered(answers)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost(exc)


@dataclass
class Backoff:
    """How long the supervisor waits before starting the step writer process again: ``first``
    seconds after a death, doubling with each start that fails or each child that dies young,
    up to ``cap``; back to ``first`` once a child stayed up ``stable`` seconds. A request that
    kept killing the child could then cost at most one start every ``cap`` seconds, never a
    spinning server."""

    first: float = 0.1
    cap: float = 10.0
    stable: float = 30.0
    _next: float = 0.0

    def delay(self, up_for: float | None) -> float:
        """The wait before the next start; ``up_for``: how long the child that has just died
        had been up (None: the last start failed)."""
        if self._next == 0.0 or (up_for is not None and up_for >= self.stable):
            self._next = self.first
        delay, self._next = self._next, min(self._next * 2, self.cap)
        return delay


class StepProcess:
    """The server's handle on the step writer process: start it, send it calls, restart it
    when it dies, stop it."""

    def __init__(
        self,
        database_url: str,
        notifier: Notifier,
        backoff: Backoff | None = None,
        settings: DatabaseSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = database_url
        # The server's deadlines, so the child's database calls end when the server's do.
        self._settings = json.dumps(dataclasses.asdict(settings or DatabaseSettings()))
        self._notifier = notifier
        self._backoff = backoff if backoff is not None else Backoff()
        self._clock = clock
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Answer | None]] = {}
        self._transport: asyncio.Transport | None = None
        self._closed: asyncio.Event | None = None
        self._pid: int | None = None
        self._started_at = 0.0
        self._stopping = False
        #: Set by stop(): the supervisor's wait ends, a start-up in progress gives up.
        self._stop_requested = asyncio.Event()
        self._halt = threading.Event()
        self._supervisor: asyncio.Task[None] | None = None
        #: Calls the child answered, and calls it handed back to the server.
        self.answered = 0
        self.handed_back = 0
        #: Times the child was started again after it died, and starts that failed.
        self.restarts = 0
        self.failed_starts = 0

    @staticmethod
    def supported() -> bool:
        """Whether this platform has what the process needs (Linux: SOCK_SEQPACKET socket
        pairs, pidfd, passing descriptors); elsewhere the server writes every step itself."""
        return sys.platform.startswith("linux")

    @property
    def alive(self) -> bool:
        return self._transport is not None

    @property
    def pid(self) -> int | None:
        return self._pid

    async def start(self) -> None:
        """Start the child and wait until it has opened the database; raise if it cannot.
        From then on it is restarted whenever it dies, until :meth:`stop`."""
        await self._spawn()
        self._supervisor = asyncio.create_task(
            self._supervise(), name="agentrt-step-writer-supervisor"
        )

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._pid = await asyncio.to_thread(
                _Zygote.fork, self._url, self._notifier.origin, theirs, self._settings
            )
            theirs.close()
            if not await asyncio.to_thread(_wait_ready, ours, self._halt):
                raise RuntimeError(
                    "the step writer process exited before it was ready; its error is logged above"
                )
        except BaseException:
            ours.close()
            theirs.close()
            await self._reap()
            raise
        loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        transport, _ = await loop.create_unix_connection(lambda: _Connection(self), sock=ours)
        self._transport = transport
        self._started_at = self._clock()

    async def _supervise(self) -> None:
        """Start the child again each time it dies, after :class:`Backoff`'s wait; meanwhile
        calls take the in-process path. Ends when :meth:`stop` is called (a start already
        under way finishes, and stop() then stops that child)."""
        try:
            while not self._stopping:
                assert self._closed is not None
                await _either(self._closed, self._stop_requested)
                if self._stopping:
                    return
                up_for: float | None = self._clock() - self._started_at
                # Gone for good (it holds no lock or transaction) before another opens the
                # database.
                await self._reap()
                while not self._stopping:
                    delay = self._backoff.delay(up_for)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop_requested.wait(), delay)
                    if self._stopping:
                        return
                    try:
                        await self._spawn()
                    except (OSError, RuntimeError) as exc:
                        self.failed_starts += 1
                        up_for = None
                        if not self._stopping:
                            log.error("cannot restart the step writer process: %s", exc)
                        continue
                    self.restarts += 1
                    log.info("the step writer process is running again (pid %s)", self._pid)
                    break
        except Exception:
            # A bug of ours: the server goes on writing every step itself.
            log.exception("the step writer process supervisor failed; it is not restarted")

    async def call(self, method: int, request: bytes) -> Any:
        """The child's answer to one BeginStep or EndStep, or None: the server must take the
        call itself (not the common case, or no child)."""
        transport = self._transport
        if transport is None:
            return None
        job = next(self._ids)
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._pending[job] = future
        transport.write(frame((job, method, request)))
        answer = await future
        return None if answer is None else answer[0]

    def _answered(self, answers: list[tuple[int, Any, tuple[str, ...]]]) -> None:
        woken: list[str] = []
        for job, answer, wake in answers:
            woken.extend(wake)
            if answer is None:
                self.handed_back += 1
            else:
                self.answered += 1
            future = self._pending.pop(job, None)
            if future is None or future.done():
                continue
            if answer == COMMIT_UNKNOWN:
                future.set_exception(
                    Unavailable(
                        "the database connection broke while the step was being committed:"
                        " it may or may not be recorded; retry with the same idempotency key",
                        reason="COMMIT_OUTCOME_UNKNOWN",
                    )
                )
            else:
                future.set_result(None if answer is None else (answer, wake))
        # Committed steps wake their watchers even if the caller has gone meanwhile.
        self._notifier.wake(woken)

    def _lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._closed is not None:
            self._closed.set()
        pending, self._pending = self._pending, {}
        if not self._stopping:
            # One line: how it ended (a reset connection when it was killed) is all there is
            # to tell; a traceback of our socket read would say nothing more.
            log.error(
                "the step writer process (pid %s) stopped unexpectedly (%s); steps take the"
                " in-process path until it is restarted",
                self._pid,
                exc or "end of stream",
            )
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    Unavailable(
                        "the step writer process stopped during the call: the step may or may"
                        " not be recorded; retry with the same idempotency key",
                        reason="STEP_WRITER_STOPPED",
                    )
                )

    async def stop(self) -> None:
        """End the child's input: it answers what it holds, closes its end and exits. No
        restart follows, and the database file is closed when this returns."""
        self._stopping = True
        self._stop_requested.set()
        self._halt.set()
        if self._supervisor is not None:
            await self._supervisor  # (a start under way ends first: its child is stopped below)
            self._supervisor = None
        # Calls from now on take the in-process path (there should be none: the server
        # stops serving first).
        transport, self._transport = self._transport, None
        if transport is not None and self._closed is not None:
            transport.write_eof()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), 10)
            transport.abort()  # (a no-op once the child has closed its end)
        await self._reap()

    async def _reap(self) -> None:
        """Wait for the child to exit (killing it after 10 s), so the database file is
        closed when this returns."""
        pid, self._pid = self._pid, None
        if pid is not None and not await asyncio.to_thread(_wait_exit, pid, 10.0):
            log.error("the step writer process did not exit; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(_wait_exit, pid, 5.0)


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    """Wait until ``a`` or ``b`` is set."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _wait_exit(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (not our child: the zygote's) exited within ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:  # a kernel without pidfd (before Linux 5.3): ask every 10 ms
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.01)
        return False
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


class _Zygote:
    """A clean Python process that has imported the step path once and forks a step writer
    for each server start.

    Not ``multiprocessing``: its spawn and forkserver modes re-import the parent's
    ``__main__`` in every child (an embedding program would run again there), and forking the
    server itself is unsafe (its gRPC threads do not survive a fork). A fork of this
    single-threaded process costs milliseconds; starting an interpreter and importing the
    step path costs most of a second, on every server start (the tests start hundreds).
    It exits when this process closes its end of the control socket, so when this one exits.
    """

    _lock = threading.Lock()
    _process: subprocess.Popen[bytes] | None = None
    _control: socket.socket | None = None

    @classmethod
    def fork(cls, database_url: str, origin: str, sock: socket.socket, settings: str = "{}") -> int:
        """Start a step writer process on ``sock`` for ``database_url``, notifying as
        ``origin`` (PostgreSQL), with ``settings`` (a :class:`DatabaseSettings` as JSON);
        return its pid."""
        with cls._lock:
            for _ in range(2):
                if cls._process is None or cls._process.poll() is not None:
                    cls._start()
                assert cls._control is not None
                try:
                    socket.send_fds(
                        cls._control,
                        [f"{origin}\n{settings}\n{database_url}".encode()],
                        [sock.fileno()],
                    )
                    reply = cls._control.recv(64)
                except OSError:
                    reply = b""
                if reply:
                    return int(reply)
                cls._process = None  # it died: start another, once
            raise RuntimeError("the step writer zygote process exits at once; see its error")

    @classmethod
    def _start(cls) -> None:
        if cls._control is not None:
            cls._control.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The zygote imports this package as this process does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cls._process = subprocess.Popen(
            [sys.executable, "-m", "runtime_service.step_process", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        cls._control = ours


def _wait_ready(sock: socket.socket, halt: threading.Event) -> bool:
    """Whether the child said it is ready, within the start timeout and before ``halt``."""
    deadline = time.monotonic() + _START_TIMEOUT
    reader = FrameReader()
    # Short waits, so that stop() need not sit out a start-up stuck on the database.
    sock.settimeout(0.1)
    try:
        while not halt.is_set() and time.monotonic() < deadline:
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # (reset: it was killed while starting)
                return False
            if not data:
                return False
            if reader.feed(data):
                return True
        return False
    finally:
        sock.settimeout(None)


# -- the child's side -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BeginCall:
    req: StepRequest


@dataclass(frozen=True, slots=True)
class EndCall:
    attempt_id: str
    lease_epoch: int
    step_id: str
    outcome: StepEnd


Call = BeginCall | EndCall


class StepJobs:
    """What the child runs for each call: the common path, or None for the server to take it."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._bound = BoundAgents()
        self.sqlite = database.is_sqlite
        #: SQLite: what this writer wrote, while nothing else writes. PostgreSQL: each batch's
        #: states, read ahead in one round trip (``store/step_states.py``).
        self.states = CachedStepStates()
        self.prefetched = PrefetchedStepStates()
        self._common = CommonPath(self._definition, self.states if self.sqlite else self.prefetched)

    def _definition(self, digest: str) -> Bound:
        # A run's definition is immutable and committed before the run: a read connection
        # beside the write transaction sees it.
        cached = self._bound.cached(digest)
        if cached is None:
            cached = self._database.read_sync(lambda session: self._bound.get(session, digest))
        return cached

    @staticmethod
    def parse(method: int, payload: bytes) -> Call | None:
        """The call in a request's bytes, or None if it is invalid (the server answers the
        error, from the same checks) or cannot be read here for any other reason.

        Any exception, not only our own errors: a request the server let through may still
        break a conversion here (a non-finite number in a Struct once did), and an exception
        escaping would end the process and every call it holds."""
        try:
            if method == BEGIN_STEP:
                req = step_request(pb.BeginStepRequest.FromString(payload))
                check_step_request(req)
                return BeginCall(req)
            request = pb.EndStepRequest.FromString(payload)
            fence = request.fence
            return EndCall(
                fence.attempt_id, fence.lease_epoch, request.step_id, step_end_of(request)
            )
        except AgentrtError:
            return None  # a refusal: the server's path answers it
        except Exception:
            _CALL_FAILURES.failed()
            return None

    def run(self, tx: RawTx, call: Call | None) -> Answer | None:
        """One call's writes: BeginStep answers the step's columns and the run's agent
        digest, EndStep the step's columns; None: not the common case, nothing written."""
        if call is None:
            return None
        if isinstance(call, BeginCall):
            outcome = self._common.begin(tx, call.req)
            if outcome is None:
                return None
            return (step_tuple(outcome.step), outcome.agent_digest), tuple(tx.wake)
        step = self._common.end(tx, call.attempt_id, call.lease_epoch, call.step_id, call.outcome)
        if step is None:
            return None
        # The server wakes these after the answer (on PostgreSQL the batch also notifies them
        # to other replicas).
        return step_tuple(step), tuple(tx.wake)

    def read_ahead(self, tx: RawTx, calls: list[Call | None]) -> None:
        """PostgreSQL: lock and read every call's state in one pipelined round trip, for
        :attr:`prefetched` to answer from."""
        states = self.prefetched
        states.reset()
        with tx.pipeline():
            for call in calls:
                if isinstance(call, BeginCall):
                    r = call.req
                    states.read_begin(tx, r.attempt_id, r.turn_id, r.idempotency_key, r.input_ref)
                elif call is not None:
                    states.read_end(tx, call.attempt_id, call.step_id, call.outcome.output_ref)
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
            batch, queued = queued[:_MAX_BATCH], queued[_MAX_BATCH:]
            answers, conn = _commit(database, dialect, conn, jobs, batch, origin)
            sock.sendall(frame(answers))
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
        # Calls that wrote nothing can still go to the server; the others may be committed.
        _FAILURES.failed()
        with contextlib.suppress(Exception):
            conn.invalidate()
        conn = _connect(database)
        results = [None if result is None else (COMMIT_UNKNOWN, ()) for result in unknown.results]
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
        except _CallFailed as failed:
            jobs.states.clear()  # what the batch's jobs remembered was rolled back
            _CALL_FAILURES.failed(failed.__cause__)
            calls = [None if i == failed.index else call for i, call in enumerate(calls)]
    raise RuntimeError("the calls of a step batch kept failing one by one")


def _run_call(jobs: StepJobs, index: int, tx: RawTx, call: Call | None) -> Answer | None:
    """:meth:`StepJobs.run`, telling a failure of this call apart from one of the database."""
    try:
        return jobs.run(tx, call)
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
    commit_sent = False
    try:
        jobs.read_ahead(tx, calls)
        keys: list[str] = []
        for index, call in enumerate(calls):
            job_tx = DeferredTx(dialect, writes)
            results.append(_run_call(jobs, index, job_tx, call))
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
    return results


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
    from runtime_service.step_process import _zygote_main as zygote_main

    zygote_main(int(sys.argv[1]))
