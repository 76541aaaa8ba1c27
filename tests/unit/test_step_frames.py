"""The step writer process's wire: length-prefixed frames survive any split of the stream,
the server's setting switches the process off, failing batches do not flood the log, and a
commit of unknown outcome is answered UNAVAILABLE."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from agentrt_base.settings import ServerSettings
from agentrt_core.errors import Unavailable
from runtime_service.notify import Notifier
from runtime_service.step_process import BEGIN_STEP, FrameReader, StepProcess, _Zygote, frame
from runtime_service.step_writer import FailureLog


def test_frames_come_back_whole_however_the_stream_is_cut() -> None:
    messages = [(1, 1, b"x" * 10), [(1, b"answer", ("run:a", "thread:b"))], "ready", (2, 2, b"")]
    stream = b"".join(frame(m) for m in messages)
    for cut in (1, 3, 4, 5, 17, len(stream)):
        reader = FrameReader()
        out = []
        for i in range(0, len(stream), cut):
            out += reader.feed(stream[i : i + cut])
        assert out == messages, cut
    assert FrameReader().feed(frame("x")[:-1]) == []


def test_the_step_process_setting_reads_the_environment() -> None:
    def resolve(value: str | None) -> bool:
        environ = {} if value is None else {"AGENTRT_STEP_PROCESS": value}
        return ServerSettings.resolve(listen=None, database_url=None, environ=environ).step_process

    assert resolve(None) and resolve("1") and resolve("on")
    assert not resolve("0") and not resolve("false") and not resolve(" OFF ")


def test_failed_batches_are_logged_once_a_minute_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = FailureLog(every=60.0, clock=lambda: now[0])
    for at in (0.0, 1.0, 2.0, 59.0, 61.0, 62.0, 130.0):
        now[0] = at
        try:
            raise OSError("disk full")
        except OSError:
            failures.failed()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "a batch of step writes failed; the server takes its calls",
        "a batch of step writes failed (3 more since the last report); the server takes its calls",
        "a batch of step writes failed (1 more since the last report); the server takes its calls",
    ]
    assert all(r.exc_info is not None for r in caplog.records)


def test_a_failure_of_the_database_is_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A locked, full or vanished database is the database's, not a bug of ours.
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5  # SQLITE_BUSY, as the driver sets it
    try:
        raise locked
    except sqlite3.OperationalError:
        FailureLog().failed()
    [record] = caplog.records
    assert record.exc_info is None
    assert record.getMessage() == (
        "a batch of step writes failed (DATABASE_BUSY: database is locked);"
        " the server takes its calls"
    )


#: A stand-in for the step writer process, speaking its wire: it answers a call whose
#: request is b"lost" as one whose COMMIT outcome it never learnt, any other as one the
#: server is to take, and exits when the server closes the stream.
_FAKE_WRITER = """
import socket, sys
from runtime_service.step_process import COMMIT_UNKNOWN, FrameReader, frame
sock = socket.socket(fileno=int(sys.argv[1]))
sock.sendall(frame("ready"))
reader = FrameReader()
while data := sock.recv(65536):
    for job, _method, request in reader.feed(data):
        answers = [(job, COMMIT_UNKNOWN if request == b"lost" else None, ())]
        sock.sendall(frame((0.001, answers)))  # (the batch's seconds, its answers)
"""


def test_a_commit_of_unknown_outcome_is_answered_unavailable_not_taken_by_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[subprocess.Popen[bytes]] = []

    def fork(database_url: str, origin: str, sock: socket.socket, settings: str = "") -> int:
        started.append(
            subprocess.Popen(
                [sys.executable, "-c", _FAKE_WRITER, str(sock.fileno())],
                pass_fds=(sock.fileno(),),
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        )
        return started[-1].pid

    monkeypatch.setattr(_Zygote, "fork", fork)

    async def scenario() -> list[Any]:
        process = StepProcess("sqlite:///unused.db", Notifier())
        await process.start()
        try:
            return await asyncio.gather(
                process.call(BEGIN_STEP, b"lost"),
                process.call(BEGIN_STEP, b"other"),
                return_exceptions=True,
            )
        finally:
            await process.stop()

    try:
        unknown, handed_back = asyncio.run(scenario())
    finally:
        for child in started:
            child.kill()
            child.wait()
    assert isinstance(unknown, Unavailable) and unknown.reason == "COMMIT_OUTCOME_UNKNOWN"
    assert handed_back is None  # the server takes this one
    assert len(started) == 1
