"""``agentrt serve`` as a real process: ready line, health, clean SIGTERM, clear start failures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.e2e.cli_support import AGENTRT, serve_env, stop, wait_ready
from tests.support import free_port

pytestmark = pytest.mark.e2e


def _start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*AGENTRT, "serve", *args],
        cwd=cwd,
        env=serve_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def serve_process(database_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    process = _start("--listen", f"127.0.0.1:{port}", "--database-url", database_url, cwd=tmp_path)
    try:
        wait_ready(process)
        yield process, f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_serves_health_then_exits_on_signal(
    serve_process: tuple[subprocess.Popen[str], str], sig: signal.Signals, code: int
) -> None:
    """SIGTERM is a supervisor's stop (0); SIGINT is Ctrl-C (130, as every command)."""
    process, address = serve_process
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    helpers = _descendants(process.pid)
    # The step writer process and the zygote it was forked from, on either engine.
    assert len(helpers) == 2, helpers
    # A terminal's Ctrl-C goes to the server's process group: not to its helpers, which
    # the server stops (the zygote, reached while still importing, printed a traceback).
    assert all(os.getpgid(pid) != os.getpgid(process.pid) for pid in helpers)
    started = time.monotonic()
    process.send_signal(sig)
    assert process.wait(timeout=5) == code
    assert time.monotonic() - started < 5
    # Its helper processes end with it: nothing is left holding the database file.
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [pid for pid in helpers if Path(f"/proc/{pid}").exists()]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def test_default_database_is_sqlite_file_in_working_directory(tmp_path: Path) -> None:
    port = free_port()
    process = _start("--listen", f"127.0.0.1:{port}", cwd=tmp_path)
    try:
        line = wait_ready(process)
        assert "sqlite:///./agentrt.db" in line
        assert (tmp_path / "agentrt.db").exists()
    finally:
        assert stop(process) == 0


def test_environment_configures_listen_and_database(tmp_path: Path) -> None:
    port = free_port()
    env = serve_env()
    env["AGENTRT_LISTEN"] = f"127.0.0.1:{port}"
    env["AGENTRT_DATABASE_URL"] = f"sqlite:///{tmp_path / 'from-env.db'}"
    process = subprocess.Popen(
        [*AGENTRT, "serve"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        line = wait_ready(process)
        assert f"127.0.0.1:{port}" in line
        assert (tmp_path / "from-env.db").exists()
    finally:
        assert stop(process) == 0


def _run_to_failure(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGENTRT, "serve", *args],
        cwd=cwd,
        env=serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////nonexistent-dir/sub/agentrt.db",
        "postgresql://postgres@127.0.0.1:1/test",
    ],
)
def test_unreachable_database_refuses_to_start_with_one_line(url: str, tmp_path: Path) -> None:
    result = _run_to_failure(
        "--listen", f"127.0.0.1:{free_port()}", "--database-url", url, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentrt: cannot open database")


def test_port_in_use_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _run_to_failure(
            "--listen",
            f"127.0.0.1:{port}",
            "--database-url",
            f"sqlite:///{tmp_path / 'a.db'}",
            cwd=tmp_path,
        )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"agentrt: cannot listen on 127.0.0.1:{port}: ")
    # Refused before the database is opened: no SQLite file (or its lock) is left behind.
    assert list(tmp_path.iterdir()) == []


def test_second_server_on_same_port_fails(
    serve_process: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    """gRPC's default SO_REUSEPORT would let two servers share a port silently."""
    _, address = serve_process
    result = _run_to_failure(
        "--listen", address, "--database-url", f"sqlite:///{tmp_path / 'b.db'}", cwd=tmp_path
    )
    assert result.returncode != 0
    assert "cannot listen on" in result.stderr
    assert not (tmp_path / "b.db").exists()


def test_db_upgrade_alone(database_url: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [*AGENTRT, "db", "upgrade", "--database-url", database_url],
        cwd=tmp_path,
        env=serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "at revision" in result.stdout
