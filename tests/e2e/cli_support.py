"""Running the real ``agentrt`` command from the e2e tests: its command line, an environment
in which it imports this checkout, and waiting for ``agentrt serve`` to say it is ready."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTRT = [sys.executable, "-m", "runtime_service.cli.main"]


def checkout_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with a PYTHONPATH that imports this checkout and its generated code, so the
    child runs the code under test whatever its working directory."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "generated")])
    return env


def serve_env() -> dict[str, str]:
    """This process's environment for ``agentrt serve``, less the listen address and database
    URL a developer's shell may set: each test passes its own."""
    env = checkout_env(os.environ)
    for name in ("AGENTRT_LISTEN", "AGENTRT_DATABASE_URL"):
        env.pop(name, None)
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
