"""The step writer process's wire: length-prefixed frames survive any split of the stream,
the server's setting switches the process off, and failing batches do not flood the log."""

from __future__ import annotations

import pytest

from agentrt_base.settings import ServerSettings
from runtime_service.step_process import FailureLog, FrameReader, frame


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
