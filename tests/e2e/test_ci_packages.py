""".ci/run's package step installs only the Debian packages that are missing (issue 27, item
9: run by a developer it `apt-get install`ed every package, and that upgraded the machine's
openjdk-17), and refuses rather than installing when not run as root.

``.ci/missing-packages`` runs against this machine's real dpkg database; ``.ci/run`` runs for
real with the commands around its package step faked on ``PATH`` (``pg_isready`` answers,
``dpkg-query`` knows a chosen set of installed packages, ``apt-get`` records its arguments,
``id`` says who runs it, ``make`` stops the script at the step after)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli_support import ROOT

pytestmark = pytest.mark.e2e

MISSING = ROOT / ".ci" / "missing-packages"
NOT_A_PACKAGE = "agentrt-no-such-package"


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system")
def test_missing_packages_prints_only_those_not_installed() -> None:
    # bash is installed wherever this runs (the script itself is bash).
    result = subprocess.run(
        [MISSING, "bash", NOT_A_PACKAGE], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{NOT_A_PACKAGE}\n"
    nothing = subprocess.run([MISSING, "bash"], capture_output=True, text=True, timeout=30)
    assert (nothing.returncode, nothing.stdout) == (0, "")


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(0o755)


def _run_ci(tmp_path: Path, installed: list[str], uid: int) -> tuple[int, str, list[str]]:
    """.ci/run up to its setup step: its exit status, its output, and apt-get's calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-get.calls"
    known = " ".join(installed)
    _fake(bin_dir, "pg_isready", "exit 0")
    _fake(
        bin_dir,
        "dpkg-query",
        # dpkg-query -W -f=FORMAT PACKAGE: the real one's answers for installed or unknown.
        f'for p in {known}; do [[ $p == "$3" ]] && {{ echo "install ok installed"; exit 0; }};'
        ' done; echo "dpkg-query: no packages found matching $3" >&2; exit 1',
    )
    _fake(bin_dir, "apt-get", f'echo "$*" >> {calls}')
    _fake(bin_dir, "id", f"echo {uid}")
    _fake(bin_dir, "make", 'echo "make $*"; exit 42')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", ROOT / ".ci" / "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return result.returncode, result.stdout + result.stderr, recorded


def test_ci_installs_only_the_missing_packages(tmp_path: Path) -> None:
    status, output, apt = _run_ci(tmp_path, ["openjdk-17-jdk-headless", "libguava-java"], uid=0)
    assert status == 42, output  # it went on to `make setup`
    assert apt[0] == "update -qq", apt
    install = apt[1].split()
    assert install[:4] == ["install", "-y", "-qq", "--no-install-recommends"], apt
    assert "protobuf-compiler" in install[4:], apt
    assert "openjdk-17-jdk-headless" not in install and "libguava-java" not in install, apt
    assert len(apt) == 2, apt


def test_ci_changes_nothing_when_nothing_is_missing(tmp_path: Path) -> None:
    everything = [
        "openjdk-17-jdk-headless",
        "protobuf-compiler",
        "libprotobuf-java",
        "protobuf-compiler-grpc-java-plugin",
        "libgrpc-java",
        "libguava-java",
        "libjsr305-java",
        "libgeronimo-annotation-1.3-spec-java",
        "prometheus",
        "chromium",
        "chromium-driver",
    ]
    status, output, apt = _run_ci(tmp_path, everything, uid=1000)
    assert status == 42, output
    assert apt == []


def test_ci_as_a_developer_names_the_missing_and_installs_nothing(tmp_path: Path) -> None:
    status, output, apt = _run_ci(tmp_path, ["openjdk-17-jdk-headless"], uid=1000)
    assert status == 1, output
    assert apt == []
    assert "missing Debian packages: protobuf-compiler" in output
    assert "make setup" not in output
