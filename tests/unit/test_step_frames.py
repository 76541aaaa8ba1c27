"""The step writer process's wire: length-prefixed frames survive any split of the stream,
and the server's setting switches the process off."""

from __future__ import annotations

from agentrt_base.settings import ServerSettings
from runtime_service.step_process import FrameReader, frame


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
