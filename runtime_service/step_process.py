"""The server's side of the step writer process (``step_writer``): start it, send it each
BeginStep and EndStep, take its answers, restart it when it dies.

Why a second process, and what it runs: see ``step_writer``. It runs the same step engine as
the server's in-process path, so a call goes one way or the other with the same result; the
server takes a call itself only when the process cannot (it is restarting, or the call broke
its code: it answers None then). If the child dies, the calls it held fail ``UNAVAILABLE``
(each step may or may not be recorded; a retry with the same idempotency key is safe), later
calls take the in-process path, and :class:`StepProcess` starts a new child after a
:class:`Backoff`.

Two writers on one SQLite file: both hold the database's
:class:`~agentrt_base.db_engines.WriterLock` around each transaction, so neither ever sleeps in
SQLite's busy handler. On PostgreSQL a batch takes two round trips and row locks order the two
writers as they order the server's own transactions; its NOTIFY carries the server's origin
(passed at fork), so other replicas wake and the server skips the echo.

Wire: length-prefixed pickles over a private socketpair between the two processes (nothing
else can write to it). Server to child: ``(job, method, request bytes)``. Child to server, per
committed batch: the seconds its transaction took (for the metrics) and a list of ``(job,
answer or None, keys to wake)``, where the answer is the engine's result
(``step_engine.Begun`` / ``Ended``: records and errors, no messages): the server settles it
and builds the response, which keeps the child, the busier of the two, to the writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from agentrt_base.settings import DatabaseSettings
from agentrt_core import reasons
from agentrt_core.errors import Unavailable
from runtime_service.notify import Notifier

log = logging.getLogger("agentrt.step_process")

BEGIN_STEP = 1
END_STEP = 2

_HEADER = struct.Struct(">I")
#: Jobs per transaction in the child (the server's group commit uses the same bound).
MAX_BATCH = 64
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
        for seconds, answers in self._reader.feed(data):
            self._owner._answered(answers)
            if self._owner.on_batch is not None:
                self._owner.on_batch(len(answers), seconds)

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
        #: Told each committed batch: how many calls it held and how long its transaction
        #: took in the child (the metrics); None: nobody.
        self.on_batch: Callable[[int, float], None] | None = None

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
                        reason=reasons.COMMIT_OUTCOME_UNKNOWN,
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
                        reason=reasons.STEP_WRITER_STOPPED,
                    )
                )

    def begin_stop(self) -> None:
        """The server has begun to stop: from now on nothing restarts the child, and a start
        under way gives up. Called first thing in the server's stop, because the drain that
        follows can outlast the child (a SIGTERM to the process group reaches it too): a
        restart then would race the stop and hold it up."""
        self._stopping = True
        self._stop_requested.set()
        self._halt.set()

    async def stop(self) -> None:
        """End the child's input: it answers what it holds, closes its end and exits. No
        restart follows, and the database file is closed when this returns."""
        self.begin_stop()
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
            [sys.executable, "-m", "runtime_service.step_writer", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
            # Its own process group: a terminal's Ctrl-C or a supervisor's signal to the
            # server's group must not kill the zygote and the step writers under the server,
            # which stops them itself, in order (and they exit with it: see the class doc).
            process_group=0,
        )
        theirs.close()
        # A zygote that hangs must not hold fork() (and the server's start or stop) forever.
        ours.settimeout(_START_TIMEOUT)
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
