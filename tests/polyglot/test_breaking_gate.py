"""The breaking-change gate (``make breaking``, run by CI) catches a deliberate break: in a
throwaway git repository holding this checkout's contract, a commit that deletes a field fails
the gate, and one that adds a field passes it. The gate is the Makefile's own recipe, run there
with the pinned buf."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli_support import ROOT

BUF = ROOT / "node_modules" / ".bin" / "buf"
EVENT_PROTO = Path("protos/agentrt/runtime/v1/event.proto")
MAKE = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile")]
#: A field of the contract, as written in event.proto.
FIELD = "  string title = 1;\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=gate", "-c", "user.email=gate@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _gate(repo: Path) -> subprocess.CompletedProcess[str]:
    # -o: node_modules is this checkout's (BUF), nothing to install in the throwaway repo.
    return subprocess.run(
        [*MAKE, "-o", "node_modules/.stamp", "breaking", f"BUF={BUF}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    assert BUF.exists(), "node_modules is not installed: make node_modules/.stamp"
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    assert (tmp_path / EVENT_PROTO).read_text().count(FIELD) == 1
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "the contract")
    return tmp_path


def _commit_edit(repo: Path, old: str, new: str) -> None:
    path = repo / EVENT_PROTO
    path.write_text(path.read_text().replace(old, new, 1))
    _git(repo, "commit", "-q", "-am", "an edit")


def test_deleting_a_field_fails_the_gate(repo: Path) -> None:
    _commit_edit(repo, FIELD, "")
    result = _gate(repo)
    assert result.returncode != 0, result.stdout + result.stderr
    assert 'Previously present field "1" with name "title"' in result.stdout + result.stderr


def test_renaming_a_field_fails_the_gate(repo: Path) -> None:
    _commit_edit(repo, FIELD, "  string name = 1;\n")
    result = _gate(repo)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "title" in result.stdout + result.stderr


def test_adding_a_field_passes_the_gate(repo: Path) -> None:
    _commit_edit(
        repo,
        FIELD,
        FIELD + "  // A field added by the gate's self-test.\n  string subtitle = 90;\n",
    )
    result = _gate(repo)
    assert result.returncode == 0, result.stdout + result.stderr
