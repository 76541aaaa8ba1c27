"""Running the real ``agentrt`` command from the e2e tests: its command line, an environment
in which it imports this checkout, waiting for ``agentrt serve`` to say it is ready, running
a command in this process the way its console script would, and the checks every CLI test
makes of a command that must succeed (:func:`ok`) or fail (:func:`refused`, :func:`failure`)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from tests.support import signing_key

ROOT = Path(__file__).resolve().parents[2]
AGENTRT = [sys.executable, "-m", "runtime_service.cli.entry"]


def checkout_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with a PYTHONPATH that imports this checkout and its generated code, so the
    child runs the code under test whatever its working directory."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "generated")])
    return env


#: Variables of the machine running the tests that would leak into what a command does: a
#: CI's provenance (publish records it), a developer's target or token.
_LEAKING_PREFIXES = ("GITHUB_", "GITLAB_", "CI_", "AGENTRT_")


def cli_env(target: str, **extra: str) -> dict[str, str]:
    """The environment of a client command under test: this checkout's, none of the
    machine's CI or agentrt variables, no terminal width (a table gets the pipe width), and
    ``AGENTRT_TARGET`` set to ``target``; ``extra`` on top."""
    env = checkout_env({k: v for k, v in os.environ.items() if not k.startswith(_LEAKING_PREFIXES)})
    env.pop("COLUMNS", None)
    env["AGENTRT_TARGET"] = target
    env.update(extra)
    return env


def run(target: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``agentrt ARGS`` against ``target``, in this process (:func:`in_process`)."""
    return in_process(args, cli_env(target, **env))


def ok(target: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """:func:`run` a command that must succeed."""
    result = run(target, *args, **env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def stdout_of(target: str, *args: str, **env: str) -> str:
    """The standard output of a command that must succeed."""
    return ok(target, *args, **env).stdout


def refused(target: str, *args: str, code: int = 1) -> list[str]:
    """Run a command that must fail with ``code``; its stderr lines, each an ``agentrt:``
    line (the first is the report, any others the field violations it does not state)."""
    result = run(target, *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("agentrt: ") for line in lines), result.stderr
    return lines


def failure(target: str, *args: str, code: int = 1) -> str:
    """Run a command that must fail with ``code``; its single stderr line."""
    lines = refused(target, *args, code=code)
    assert len(lines) == 1, lines
    return lines[0]


def serve_env() -> dict[str, str]:
    """This process's environment for ``agentrt serve``, less the listen address and database
    URL a developer's shell may set: each test passes its own."""
    env = checkout_env(os.environ)
    for name in ("AGENTRT_LISTEN", "AGENTRT_DATABASE_URL", "AGENTRT_CONSOLE_LISTEN"):
        env.pop(name, None)
    # A server on PostgreSQL must be given its signing key (a SQLite file's generates one);
    # the tests' servers share one, as an operator's replicas would.
    env.setdefault("AGENTRT_SIGNING_KEYS", signing_key())
    return env


def wait_ready(process: subprocess.Popen[str], timeout: float = 30) -> str:
    """The ``agentrt ready`` line of ``process``'s stderr; fails (killing it) without one."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "agentrt ready" in line:
            return line
    process.kill()
    raise AssertionError("server never became ready:\n" + "".join(lines))


def in_process(
    args: Sequence[str], env: Mapping[str, str], cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``agentrt ARGS`` run by this interpreter: the console script's ``main(argv)`` with
    ``env`` as the whole environment, ``cwd`` as the working directory, an empty stdin and
    stdout/stderr captured; the result is what the process would have given. A process costs
    ~1.3 s here (importing the CLI), the call itself milliseconds: tests of what a command
    says run it here, and real processes are kept for what only a process shows (signals, the
    installed console script, a shell script calling it).

    The exit status is main's return value, or SystemExit's code (argparse's usage errors);
    an exception main lets out is exit 1 with its traceback on stderr, as the interpreter
    would print it, so a test asserting there is no traceback still fails."""
    from runtime_service.cli.main import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
    with (
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.chdir(cwd),
        mock.patch.object(sys, "stdin", stdin),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except Exception:
            traceback.print_exc()
            code = 1
    captured = []
    for stream in (out, err):
        stream.flush()
        buffer = stream.buffer
        assert isinstance(buffer, io.BytesIO)
        captured.append(buffer.getvalue().decode("utf-8"))
    return subprocess.CompletedProcess(["agentrt", *args], code, captured[0], captured[1])


def stop(process: subprocess.Popen[Any], timeout: float = 40.0) -> int | None:
    """SIGTERM ``process`` and wait up to ``timeout`` (agentrt serve's shutdown bound is 3 s
    of grace, then 30 s); kill it if it has not exited by then. Returns its exit status, or
    None when it had to be killed: whatever the test asserts next, nothing outlives it."""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def stop_group(leader: subprocess.Popen[Any], timeout: float = 40.0) -> bool:
    """SIGTERM the process group ``leader`` leads (a shell and its background jobs, `make`
    and the server it started) and wait for every member to exit; SIGKILL what is left after
    ``timeout``. Whether the group ended on SIGTERM alone."""
    pgid = leader.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        leader.wait()
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader.poll()  # reaped as it exits: a zombie still counts as a member
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            leader.wait()
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    leader.wait()
    return False
