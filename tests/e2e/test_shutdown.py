"""``agentrt serve`` stops in bounded time, whenever the signal comes (issue 27, item 2).

A supervisor (or ``make serve``'s terminal) signals the server's whole process group: the
step writer and its zygote get nothing (they have their own group and are stopped by the
server), nothing is restarted once the stop has begun, and past the shutdown deadline the
process exits 1 naming what it abandoned instead of hanging on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentrt.runtime.v1 import enum_pb2
from tests.e2e.cli_support import AGENTRT, serve_env, stop_group, wait_ready
from tests.runtime_support import Stubs
from tests.service import steps_support
from tests.support import free_port

pytestmark = pytest.mark.e2e

#: The deadline the servers here run with, and how long a test waits for an exit: past the
#: deadline the process must have gone (exit 1), so a hang shows as a failure, not a stall.
DEADLINE = 15.0
WAIT = DEADLINE + 10.0
#: Lines that must never follow a signal: a traceback, or a helper restarted mid-stop.
FORBIDDEN = ("Traceback", "running again", "cannot restart", "stopped unexpectedly")


def _start(database_url: str, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    address = f"127.0.0.1:{free_port()}"
    env = {**serve_env(), "AGENTRT_SHUTDOWN_DEADLINE": str(DEADLINE)}
    process = subprocess.Popen(
        [*AGENTRT, "serve", "--listen", address, "--database-url", database_url],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal or a supervisor gives it
    )
    return process, address


def _signal_group_and_wait(process: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Signal the process's group as a terminal or ``kill -- -PGID`` does; return stderr
    once it has exited (failing if it did not exit within WAIT, or not cleanly)."""
    os.killpg(process.pid, sig)
    try:
        _, stderr = process.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        stop_group(process)
        _, stderr = process.communicate()
        pytest.fail(f"the server did not exit within {WAIT} s of {sig.name}:\n{stderr}")
    # SIGINT ends every command with 130 (serve too, after its stop), or, in the first
    # milliseconds before Python installs its handler, by the signal itself (a shell says
    # 130 for both); SIGTERM ends serve's stop with 0, or, before its handler is in, by the
    # signal's default action.
    allowed = (130, -signal.SIGINT) if sig == signal.SIGINT else (0, -signal.SIGTERM)
    assert process.returncode in allowed, stderr
    found = [line for line in stderr.splitlines() if any(word in line for word in FORBIDDEN)]
    assert not found, stderr
    return stderr


@pytest.mark.parametrize("delay", [0.05, 0.4, 1.0, 2.0, 3.5])
def test_group_signal_during_start_up_exits_cleanly_within_the_bound(
    database_url: str, tmp_path: Path, delay: float
) -> None:
    """From the interpreter's first import to serving: each moment ends with exit 0, no
    traceback, no restarted helper, and no "ready" line once a stop has begun."""
    process, _ = _start(database_url, tmp_path)
    try:
        time.sleep(delay)
        # SIGINT is what a terminal's Ctrl-C sends to the group.
        stderr = _signal_group_and_wait(process, signal.SIGINT if delay < 1 else signal.SIGTERM)
    finally:
        stop_group(process)
    lines = stderr.splitlines()
    stopping = [i for i, line in enumerate(lines) if "stopping" in line]
    if stopping:  # (a signal before the handlers are in ends the process at once)
        assert not [line for line in lines[stopping[0] :] if "agentrt ready" in line], stderr


@pytest.fixture
def serving(database_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process, address = _start(database_url, tmp_path)
    try:
        wait_ready(process)
        yield process, address
    finally:
        stop_group(process)


def test_group_signal_under_step_load_exits_cleanly_within_the_bound(
    serving: tuple[subprocess.Popen[str], str],
) -> None:
    """SIGTERM to the group while workers record steps as fast as they can: the step writer
    is not restarted, the drain ends, the process exits 0 within the bound."""
    process, address = serving
    recorded = [0]
    stop_load = threading.Event()

    def load(publish: bool) -> None:
        with Stubs.open(address) as stubs:
            worker = steps_support.start(stubs, publish=publish)
            while not stop_load.is_set():
                try:
                    step = worker.model(estimated_input_tokens=1).step
                    worker.end(step.id, enum_pb2.STEP_STATUS_SUCCEEDED)
                except grpc.RpcError:
                    return  # (the server is going away)
                recorded[0] += 1

    first = threading.Thread(target=load, args=(True,))
    first.start()
    deadline = time.monotonic() + 20
    while recorded[0] < 20 and time.monotonic() < deadline and first.is_alive():
        time.sleep(0.05)
    others = [threading.Thread(target=load, args=(False,)) for _ in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.5)
    assert recorded[0] >= 20, "the load never got going"
    try:
        _signal_group_and_wait(process, signal.SIGTERM)
    finally:
        stop_load.set()
        for thread in [first, *others]:
            thread.join(10)


_STUCK_STOP = textwrap.dedent(
    """
    import asyncio, sys
    from runtime_service.step_process import StepProcess

    async def stuck(self):  # a stop that never finishes, wherever the bug would be
        self.begin_stop()
        await asyncio.sleep(3600)

    StepProcess.stop = stuck
    from runtime_service.cli.main import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_stop_that_hangs_ends_at_the_deadline_naming_what_it_abandoned(
    tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    url = f"sqlite:///{tmp_path / 'agentrt.db'}"
    process = subprocess.Popen(
        [sys.executable, "-c", _STUCK_STOP, "serve", "--listen", address, "--database-url", url],
        cwd=tmp_path,
        env={**serve_env(), "AGENTRT_SHUTDOWN_DEADLINE": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_ready(process)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=WAIT)
        took = time.monotonic() - started
    finally:
        stop_group(process)
    assert process.returncode == 1, stderr
    assert 2 <= took < 2 + 8, took
    assert (
        "shutdown did not finish within 2 s (AGENTRT_SHUTDOWN_DEADLINE); exiting, abandoning: "
        "stopping the step writer process"
    ) in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_a_malformed_shutdown_deadline_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [*AGENTRT, "serve", "--listen", f"127.0.0.1:{free_port()}"],
        cwd=tmp_path,
        env={**serve_env(), "AGENTRT_SHUTDOWN_DEADLINE": "soon"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "agentrt: AGENTRT_SHUTDOWN_DEADLINE='soon' is not a number of seconds"
    ], result.stderr
