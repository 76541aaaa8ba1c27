"""``agentrt demo``'s audit tree (agentrt_sdk/demo/play.py): its glyphs at every level."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt_sdk.demo import play
from tests.demo_tree import assert_tree


def _run(run_id: str, attempts: list[list[str]], artifacts: list[str]) -> dict[str, Any]:
    steps = [
        {"sequence": n, "attempt": a, "type": "TOOL_CALL", "operation": op, "status": "SUCCEEDED"}
        for a, ops in enumerate(attempts, 1)
        for n, op in enumerate(ops, 1)
    ]
    return {
        "id": run_id,
        "status": "COMPLETED",
        "objective": "fix it",
        "binding": {"agent_digest": "sha256:a", "version_label": "v7", "requested_ref": "a:prod"},
        "chain": {"intact": True, "events": 9, "rows_checked": 9},
        "attempts": [
            {
                "number": a,
                "worker_id": "w",
                "status": "SUCCEEDED",
                "reason": "INITIAL",
                "resume_from_checkpoint_id": "",
            }
            for a in range(1, len(attempts) + 1)
        ],
        "steps": steps,
        "artifacts": [
            {
                "name": name,
                "blob_digest": "sha256:" + "b" * 64,
                "step_operation": "apply_patch",
                "attempt": 1,
                "worker_id": "w",
                "version_label": "v7",
            }
            for name in artifacts
        ],
    }


def _facts(*runs: dict[str, Any]) -> dict[str, Any]:
    return {
        "agent": {"agent_id": "a", "version_label": "v7", "digest": "sha256:a", "tag": "prod"},
        "thread": {"id": "thr_1", "title": "t"},
        "runs": list(runs),
        "killed": {"worker_id": "worker-A", "signal": "SIGKILL"},
        "elapsed_seconds": 6.5,
    }


def test_the_last_child_gets_the_corner_at_every_level() -> None:
    lines = list(
        play.tree_lines(
            _facts(
                _run("run_1", [["read_file", "checkpoint"], ["apply_patch"]], ["fix.patch"]),
                _run("run_2", [[], ["run_tests", "apply_patch"]], []),
            )
        )
    )
    assert_tree(lines)
    runs = [line for line in lines if "run run_" in line]
    assert [line[:3] for line in runs] == ["├─ ", "└─ "]
    # run 1's last child is its artifact; run 2, without one, ends with its attempt 2, whose
    # last step is apply_patch.
    assert "│  └─ artifact fix.patch" in "\n".join(lines)
    assert "   └─ attempt 2" in "\n".join(lines)
    assert lines[-2].startswith("      └─ #2 TOOL_CALL apply_patch")
    assert "│  │  └─ #2 TOOL_CALL checkpoint" in "\n".join(lines)


def test_the_check_finds_a_wrong_glyph() -> None:
    """The shape check itself: both runs drawn with a corner (as before) is refused."""
    lines = ["thread thr_1", "└─ run run_1", "│  └─ attempt 1", "└─ run run_2", "done"]
    with pytest.raises(AssertionError):
        assert_tree(lines)
