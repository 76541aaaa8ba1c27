"""The step writer process's wire: length-prefixed frames survive any split of the stream,
the server's setting switches the process off, failing batches do not flood the log, and a
commit of unknown outcome is answered UNAVAILABLE."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from agentrt_base.errors import Unavailable
from agentrt_base.settings import ServerSettings
from runtime_service.notify import Notifier
from runtime_service.step_process import (
    COMMIT_UNKNOWN,
    FailureLog,
    FrameReader,
    StepProcess,
    frame,
)


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


def test_a_commit_of_unknown_outcome_is_answered_unavailable_not_taken_by_the_server() -> None:
    async def scenario() -> tuple[BaseException | None, Any]:
        process = StepProcess("sqlite:///unused.db", Notifier())
        loop = asyncio.get_running_loop()
        unknown, handed_back = loop.create_future(), loop.create_future()
        process._pending.update({1: unknown, 2: handed_back})
        process._answered([(1, COMMIT_UNKNOWN, ()), (2, None, ())])
        return unknown.exception(), handed_back.result()

    error, handed_back = asyncio.run(scenario())
    assert isinstance(error, Unavailable) and error.reason == "COMMIT_OUTCOME_UNKNOWN"
    assert handed_back is None  # the server takes this one
