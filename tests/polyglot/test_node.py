"""The contract from Node (issue 19): the TypeScript client and worker of tests/polyglot/node,
generated from protos/ by protobuf-es and run by Node against a real ``agentrt serve``, and
the cross-language vectors of tests/vectors/ recomputed in Node; and the registry log (issue 31)
verified by a Node verifier written from the specs (tests/polyglot/node/tlog.ts).

The Node programs use node's own test runner; each one's output is shown when it fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cli_support import AGENTRT, ROOT, serve_env, stop, wait_ready
from tests.support import free_port

pytestmark = pytest.mark.e2e

NODE_DIR = ROOT / "tests" / "polyglot" / "node"


@pytest.fixture(scope="module")
def node_build() -> Path:
    """Generate the TypeScript and compile it with the tests (``make node-build``, the one
    place the commands live), so a test never runs a stale build."""
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "node-build"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return NODE_DIR / "dist"


def _node_test(script: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        ["node", "--test", "--test-reporter=tap", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The runner's summary: something ran, nothing failed or was skipped.
    summary = dict(re.findall(r"^# (pass|fail|skipped|todo|cancelled) (\d+)$", result.stdout, re.M))
    assert int(summary["pass"]) > 0, result.stdout
    assert summary["fail"] == summary["skipped"] == summary["todo"] == "0", result.stdout


def test_vectors_recompute_in_node(node_build: Path) -> None:
    _node_test(node_build / "vectors.test.js")


def test_log_verifier_checks_out_against_the_specs_vectors(node_build: Path) -> None:
    """The registry-log verifier of tests/polyglot/node/tlog.ts (written from RFC 6962/9162
    and C2SP signed-note/tlog-checkpoint, no code of this repository) against the specs'
    vectors and small trees built from RFC 6962's definitions (every honest proof accepted,
    every altered one refused), then against the worked example of tests/vectors/log/."""
    _node_test(node_build / "tlog.test.js")


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [*AGENTRT, "serve", "--listen", address, "--database-url", database_url],
        cwd=tmp_path,
        env=serve_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(process)
        # Keep reading its log so that a full pipe never blocks the server.
        assert process.stderr is not None
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield address
    finally:
        stop(process)


def test_node_client_and_worker_against_a_real_server(node_build: Path, server: str) -> None:
    _node_test(node_build / "client.test.js", {**os.environ, "AGENTRT_TARGET": server})


def test_node_verifies_the_registry_log(node_build: Path, server: str) -> None:
    """Issue 31, item 5: a Node client trusting only the server's verifier key verifies the
    inclusion proofs that come back with publishes and tag moves, GetInclusionProof,
    GetConsistencyProof between two checkpoints and GetLogEntries over the whole log, and
    refuses altered proofs, notes, roots and leaves."""
    _node_test(node_build / "verify.test.js", {**os.environ, "AGENTRT_TARGET": server})
