"""``--log-format json`` (issue 29, item 3): one JSON object a line, with the call's method,
principal and ids where known; in-process through the real composition, and as a process."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import runtime_service_pb2_grpc as pb_grpc
from agentrt_base.auth import CALLER, Principal
from agentrt_base.call_context import CALL, Call
from agentrt_base.log_format import JsonFormatter
from runtime_service.services.runs import RunsService
from tests.e2e.cli_support import AGENTRT, serve_env, stop, wait_ready
from tests.support import ServerThread, free_port, serving


def _record(message: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("agentrt.test", logging.WARNING, __file__, 1, message, (), info)


def test_a_line_outside_a_call_has_the_four_keys() -> None:
    line = json.loads(JsonFormatter().format(_record("plain")))
    assert set(line) == {"time", "level", "logger", "message"}
    assert line["level"] == "WARNING" and line["logger"] == "agentrt.test"
    assert line["message"] == "plain" and line["time"].endswith("+00:00")


def test_a_line_in_a_call_names_its_method_principal_and_ids() -> None:
    call = CALL.set(Call("/agentrt.runtime.v1.WorkerService/BeginStep", (("run_id", "run_1"),)))
    caller = CALLER.set(Principal("ci-bot"))
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            line = json.loads(JsonFormatter().format(_record("failed", exc)))
    finally:
        CALLER.reset(caller)
        CALL.reset(call)
    assert line["method"] == "/agentrt.runtime.v1.WorkerService/BeginStep"
    assert line["run_id"] == "run_1" and line["principal"] == "ci-bot"
    assert "RuntimeError: boom" in line["exception"]


@pytest.fixture(scope="module")
def json_server(shared_database_url: str) -> Iterator[ServerThread]:
    with serving(shared_database_url, log_format="json") as thread:
        yield thread


def test_an_internal_error_is_logged_with_the_calls_method_and_ids(
    json_server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: RunsService, run_id: str) -> None:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(RunsService, "get_run", broken)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    errors = logging.getLogger("agentrt.errors")
    errors.addHandler(handler)
    try:
        with (
            grpc.insecure_channel(json_server.address) as channel,
            pytest.raises(grpc.RpcError) as info,
        ):
            pb_grpc.RuntimeServiceStub(channel).GetRun(pb.GetRunRequest(run_id="run_abc"))
    finally:
        errors.removeHandler(handler)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["level"] == "ERROR" and line["logger"] == "agentrt.errors"
    assert line["method"] == "/agentrt.runtime.v1.RuntimeService/GetRun"
    assert line["run_id"] == "run_abc"
    assert "a bug of ours" in line["exception"]


@pytest.mark.e2e
def test_serve_writes_json_lines(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*AGENTRT, "serve", "--listen", f"127.0.0.1:{port}", "--log-format", "json"],
        cwd=tmp_path,
        env={**serve_env(), "AGENTRT_DATABASE_URL": f"sqlite:///{tmp_path / 'j.db'}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(wait_ready(process))
    finally:
        assert stop(process) == 0
    assert ready["logger"] == "agentrt" or ready["logger"].startswith("agentrt")
    assert ready["message"].startswith("agentrt ready: listening on 127.0.0.1:")
    assert process.stderr is not None
    for text in process.stderr.read().splitlines():
        line = json.loads(text)  # every line is an object, the stop's lines too
        assert {"time", "level", "logger", "message"} <= set(line), line


def test_an_unknown_log_format_is_refused_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [*AGENTRT, "serve", "--listen", f"127.0.0.1:{free_port()}"],
        cwd=tmp_path,
        env={**serve_env(), "AGENTRT_LOG_FORMAT": "xml"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        "agentrt: AGENTRT_LOG_FORMAT='xml': expected one of text, json"
    ), result.stderr
