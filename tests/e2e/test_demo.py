"""``agentrt demo`` as a newcomer runs it: a real command that starts a server and two worker
processes, SIGKILLs one, and prints the audit tree. The facts of the tree (its ``--json``
form) are asserted, with the shape of the tree drawn from them and the progress lines it
prints on stderr as it goes, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agentrt_sdk.demo import play
from tests.demo_tree import assert_tree
from tests.e2e.cli_support import AGENTRT, checkout_env, stop

pytestmark = pytest.mark.e2e


def _steps(run: dict, **match: object) -> list[dict]:
    return [s for s in run["steps"] if all(s.get(k) == v for k, v in match.items())]


#: What the demo says on stderr as it goes, in order (each line "agentrt demo: 1.2s  …").
PROGRESS = [
    "starting two worker processes and a server…",
    "server ready; publishing coding_agent@agent_v7 to 127.0.0.1:",
    "published, run created; run 1 run_",
    "checkpoint written, worker A killed; worker B resumes run 1 from the checkpoint",
    "approved; worker B applies run 1's patch (approved as demo-operator)…",
    "run completed; run 2, the follow-up, until its approval…",
    "follow-up approved; run 2 until it completes…",
    "follow-up completed; reading the audit tree back from the server…",
    "audit tree read",
]


def test_demo_plays_the_login_fix_case(database_url: str) -> None:
    env = checkout_env(os.environ)
    demo = subprocess.Popen(
        [*AGENTRT, "demo", "--json", "--database-url", database_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # It says what it does as it goes: its first line comes while the case still plays,
        # not with the tree at the end.
        assert demo.stderr is not None
        first = demo.stderr.readline()
        assert demo.poll() is None, first
        out, rest = demo.communicate(timeout=180)
    finally:
        stop(demo)
    assert demo.returncode == 0, first + rest
    progress = (first + rest).splitlines()
    assert all(line.startswith("agentrt demo: ") for line in progress), progress
    said = iter(progress)
    for expected in PROGRESS:  # each in its place, in order
        assert any(expected in line for line in said), (expected, progress)
    facts = json.loads(out)
    assert_tree(list(play.tree_lines(facts)))
    agent = facts["agent"]
    assert (agent["agent_id"], agent["version_label"], agent["tag"]) == (
        "coding_agent",
        "agent_v7",
        "prod",
    )
    fix, follow_up = facts["runs"]
    assert fix["objective"] == "fix the login failure and keep legacy-token compatibility"
    assert follow_up["objective"] == "add a legacy-token regression test"
    for run in (fix, follow_up):
        assert run["status"] == "COMPLETED"
        assert run["binding"] == {
            "requested_ref": "coding_agent:prod",
            "agent_digest": agent["digest"],
            "version_label": "agent_v7",
            "resolved_via_tag": "prod",
        }
        assert run["chain"]["intact"]
        # Every model call records the resolved skill; every tool call its pinned tool.
        for step in _steps(run, type="MODEL_CALL"):
            assert [(s["name"], s["version"]) for s in step["skills"]] == [("repo-debug", "2.1.0")]
            assert step["model"]["provider"] and step["model"]["requested_model_id"]
        for step in _steps(run, type="TOOL_CALL"):
            (tool,) = step["tools"]
            assert tool["name"] == step["operation"] and tool["schema_digest"].startswith("sha256:")
        checks = _steps(run, type="COMPLETION_CHECK")
        assert {(s["check"], s["status"]) for s in checks} == {
            ("tests-pass", "SUCCEEDED"),
            ("diff-produced", "SUCCEEDED"),
        }
        (approval,) = _steps(run, type="APPROVAL_REQUEST")
        assert approval["operation"] == "apply_patch"
        assert approval["approval"]["decision"] == "APPROVE"
        assert approval["approval"]["approver"] == "demo-operator"

    # Worker A was killed after its checkpoint; attempt 2 on worker B resumed from it.
    assert facts["killed"]["signal"] == "SIGKILL"
    first, second, third = fix["attempts"]
    assert (first["worker_id"], first["status"]) == ("worker-A", "LOST")
    assert (second["worker_id"], second["status"]) == ("worker-B", "ENDED_FOR_APPROVAL")
    assert (third["worker_id"], third["status"]) == ("worker-B", "SUCCEEDED")
    (checkpoint,) = _steps(fix, type="CHECKPOINT", attempt=1)
    # Both later attempts resume from worker A's checkpoint: the third replays the second's
    # recorded steps (no step is made twice) and receives the approval.
    assert not first["resume_from_checkpoint_id"]
    assert second["resume_from_checkpoint_id"]  # the run's one checkpoint, attempt 1's
    assert third["resume_from_checkpoint_id"] == second["resume_from_checkpoint_id"]
    assert len(_steps(fix, type="MODEL_CALL", status="SUCCEEDED", attempt=3)) == 1  # the report
    # What worker A did before the kill is not done again.
    assert [s["operation"] for s in _steps(fix, type="TOOL_CALL", attempt=1)] == [
        "run_tests",
        "read_file",
    ]
    assert not _steps(fix, operation="read_file", attempt=2)
    assert checkpoint["sequence"] < min(s["sequence"] for s in _steps(fix, attempt=2))

    # The primary was rate limited once; the call fell back, and the ledger says from where.
    (limited,) = _steps(fix, type="MODEL_CALL", status="FAILED")
    assert limited["error_class"] == "RATE_LIMITED"
    assert limited["model"]["candidate"] == "primary"
    fallback = next(
        s for s in _steps(fix, type="MODEL_CALL") if s["sequence"] == limited["sequence"] + 1
    )
    assert fallback["model"]["candidate"] == "fallback"
    assert fallback["model"]["reason"] == "FALLBACK_AFTER_ERROR"
    assert fallback["model"]["fallback_from_step_id"] == limited["id"]
    assert fallback["model"]["reported_model_id"] == "gpt-4.1"

    # The patch: applied in attempt 3, after the approval, and its artifact's provenance.
    (patch,) = _steps(fix, type="TOOL_CALL", operation="apply_patch")
    assert (patch["status"], patch["attempt"]) == ("SUCCEEDED", 3)
    (artifact,) = fix["artifacts"]
    assert artifact["name"] == "login-fix.patch"
    assert artifact["step_id"] == patch["id"]
    assert (artifact["attempt"], artifact["worker_id"]) == (3, "worker-B")
    assert artifact["agent_digest"] == agent["digest"]
    (regression,) = follow_up["artifacts"]
    assert regression["name"] == "legacy-token-test.patch"


def test_demo_against_a_running_server(sqlite_url: str) -> None:
    """``--target``: the case is played against a server the caller runs (here one in this
    process), and its runs stay there to be read afterwards."""
    from agentrt_sdk import Client
    from tests.support import running_server

    with running_server(sqlite_url) as address:
        done = subprocess.run(
            [*AGENTRT, "demo", "--json", "--target", address],
            capture_output=True,
            text=True,
            env=checkout_env(os.environ),
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        facts = json.loads(done.stdout)
        assert facts["target"] == address
        with Client(address) as client:
            for run in facts["runs"]:
                assert client.runs.get(run["id"]).agent.agent_digest == facts["agent"]["digest"]
                assert client.audit.verify(run["id"]).intact
