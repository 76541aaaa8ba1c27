"""The login-fix case's agent: its logic, its three tools on a real workspace, and the
scripted model that plays its part deterministically.

The workspace is a small Python project whose login rejects legacy tokens with an exception
(the HTTP 500 of the thread's message); its tests fail until the patch the model proposes is
applied. The tools really read files, apply the unified diff with ``git apply`` and run the
tests with ``unittest`` in a subprocess, so what the ledger records happened.

The logic is written the way resumable logic is (docs/worker-guide.md): its progress lives in
``attempt.state``, saved by checkpoints, and each phase it already finished is skipped when an
attempt resumes; steps it repeats get the keys they had, so the runtime hands back what was
recorded instead of doing it twice.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk.attempt import Attempt
from agentrt_sdk.models.base import ModelRequest, ToolCall
from agentrt_sdk.models.scripted import Fail, Reply, ScriptedModel
from agentrt_sdk.worker import Result

#: The primary candidate of coding-balanced@3 (examples/coding_agent.yaml).
PRIMARY_MODEL = "claude-sonnet-4"

LOGIN_PY = '''\
"""Login: token check."""


def login(token: str) -> int:
    """The HTTP status of a login with ``token``."""
    if token.startswith("v2:"):
        return 200
    kind, _, secret = token.partition(":")
    raise ValueError(f"unknown token kind {kind!r}")
'''

TEST_LOGIN_PY = """\
import unittest

from auth.login import login


class LoginTest(unittest.TestCase):
    def test_v2_token(self) -> None:
        self.assertEqual(login("v2:abc"), 200)

    def test_legacy_token(self) -> None:
        self.assertEqual(login("legacy:abc"), 200)

    def test_unknown_token_is_refused_not_a_crash(self) -> None:
        self.assertEqual(login("nonsense"), 401)
"""

PATCH = '''\
--- a/auth/login.py
+++ b/auth/login.py
@@ -4,6 +4,8 @@
 def login(token: str) -> int:
     """The HTTP status of a login with ``token``."""
     if token.startswith("v2:"):
         return 200
-    kind, _, secret = token.partition(":")
-    raise ValueError(f"unknown token kind {kind!r}")
+    if token.startswith("legacy:"):
+        # Legacy tokens stay valid until every client has migrated.
+        return 200
+    return 401
'''

REGRESSION_TEST = """\
import unittest

from auth.login import login


class LegacyTokenRegressionTest(unittest.TestCase):
    def test_legacy_token_keeps_working(self) -> None:
        self.assertEqual(login("legacy:0123"), 200)
"""


def make_workspace(root: Path) -> Path:
    """A fresh copy of the broken project under ``root``."""
    (root / "auth").mkdir(parents=True, exist_ok=True)
    (root / "auth" / "__init__.py").write_text("")
    (root / "auth" / "login.py").write_text(LOGIN_PY)
    (root / "test_login.py").write_text(TEST_LOGIN_PY)
    return root


# -- the tools -------------------------------------------------------------------------------


def _inside(workspace: Path, relative: str) -> Path:
    path = (workspace / relative).resolve()
    if workspace.resolve() not in path.parents and path != workspace.resolve():
        raise ValueError(f"{relative!r} is outside the workspace")
    return path


def tools_for(workspace: Path) -> dict[str, Any]:
    """The three tools of coding_agent@agent_v7, acting on ``workspace``."""

    async def read_file(args: dict[str, Any]) -> dict[str, Any]:
        lines = _inside(workspace, args["path"]).read_text().splitlines()
        start = int(args.get("start_line", 1))
        end = int(args.get("end_line", len(lines)))
        return {
            "content": "\n".join(lines[start - 1 : end]),
            "total_lines": len(lines),
            "truncated": end < len(lines),
        }

    async def apply_patch(args: dict[str, Any]) -> dict[str, Any]:
        patch = args["patch"]
        done = await asyncio.to_thread(
            subprocess.run,
            ["git", "apply", "--verbose", "-"],
            input=patch,
            cwd=workspace,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return {"applied": False, "rejects": [done.stderr.strip()]}
        changed = [
            line.removeprefix("+++ b/") for line in patch.splitlines() if line.startswith("+++ b/")
        ]
        return {"applied": True, "files_changed": changed}

    async def run_tests(args: dict[str, Any]) -> dict[str, Any]:
        selection = [s.removesuffix(".py") for s in args.get("selection", [])]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "unittest", *selection],
            cwd=workspace,
            capture_output=True,
            text=True,
            check=False,
            timeout=int(args.get("timeout_seconds", 600)),
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        summary = done.stderr.strip().splitlines()
        failed = sum(1 for line in summary if line.startswith(("FAIL:", "ERROR:")))
        ran = next((line for line in summary if line.startswith("Ran ")), "Ran 0 tests")
        return {
            "passed": done.returncode == 0,
            "total": int(ran.split()[1]),
            "failed": failed,
            "output": "\n".join(summary[-20:]),
        }

    return {"read_file": read_file, "apply_patch": apply_patch, "run_tests": run_tests}


# -- the model's part ------------------------------------------------------------------------


def _call(name: str, **arguments: Any) -> Reply:
    return Reply(
        content="",
        tool_calls=[ToolCall(id=f"call_{name}", name=name, arguments=arguments)],
    )


def scripted_model(*, rate_limit_primary_once: bool) -> ScriptedModel:
    """The model's answers, by what the conversation has reached (so any worker process can
    pick the case up where another left it); the primary candidate answers 429 once when
    ``rate_limit_primary_once``."""
    limited: list[bool] = []

    def answer(request: ModelRequest, index: int) -> Reply | Fail:
        if rate_limit_primary_once and request.model_id == PRIMARY_MODEL and not limited:
            limited.append(True)
            return Fail(enum_pb2.ERROR_CLASS_RATE_LIMITED, "429 Too Many Requests")
        phase = request.messages[-1].get("phase", "") if request.messages else ""
        if phase == "reproduce":
            return _call("run_tests", selection=["test_login.py"])
        if phase == "locate":
            return _call("read_file", path="auth/login.py")
        if phase == "fix":
            return _call("apply_patch", patch=PATCH)
        if phase == "regression":
            return _call(
                "apply_patch", patch=new_file_patch("test_legacy_token.py", REGRESSION_TEST)
            )
        return Reply(content="Done: legacy tokens log in again, unknown ones get 401.")

    return ScriptedModel(answer)


def new_file_patch(path: str, content: str) -> str:
    lines = content.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


# -- the logic -------------------------------------------------------------------------------


def _ask(attempt: Attempt, phase: str) -> list[dict[str, Any]]:
    """The conversation so far plus the next instruction; ``phase`` rides along so the
    scripted model knows where the case is (a real model reads the text)."""
    history = [{"role": "user", "content": attempt.run.goal.objective}]
    history += [{"role": "user", "content": i.content} for i in attempt.inputs]
    return [*history, {"role": "user", "content": f"next: {phase}", "phase": phase}]


async def login_fix(attempt: Attempt) -> Result:
    """Reproduce, locate, checkpoint, fix (with approval), verify, attest, report; for the
    follow-up run, add a regression test."""
    state = attempt.state
    follow_up = attempt.run.labels.get("case") == "regression-test"
    if follow_up:
        return await _regression(attempt)
    if "diagnosis" not in state:
        answer = await attempt.generate(_ask(attempt, "reproduce"))
        call = answer.tool_calls[0]
        failing = await attempt.tool(call.name, call.arguments)
        answer = await attempt.generate(_ask(attempt, "locate"))
        call = answer.tool_calls[0]
        source = await attempt.tool(call.name, call.arguments)
        state["diagnosis"] = {
            "failing": failing.output["failed"],
            "cause": "legacy tokens raise ValueError (HTTP 500) instead of logging in",
            "source_lines": source.output["total_lines"],
        }
        await attempt.checkpoint()
        if os.environ.get("AGENTRT_DEMO_HANG_AFTER_CHECKPOINT"):
            # Worker A of the demo: wait here to be killed (SIGKILL), after the checkpoint.
            await asyncio.Event().wait()
    tests = await _patch_and_verify(attempt, "fix", "login-fix.patch")
    if tests is None:
        return Result(summary="the patch was denied; nothing changed")
    answer = await attempt.generate(_ask(attempt, "report"))
    return Result(summary=answer.content, output={"tests": tests})


async def _regression(attempt: Attempt) -> Result:
    tests = await _patch_and_verify(attempt, "regression", "legacy-token-test.patch")
    if tests is None:
        return Result(summary="the regression test was denied")
    return Result(summary="added a legacy-token regression test", output={"tests": tests})


async def _patch_and_verify(attempt: Attempt, phase: str, artifact: str) -> dict[str, Any] | None:
    """Ask the model for a patch, apply it (the permission policy asks a human first), keep it
    as an artifact, run the suite and attest the completion checks: the suite's result, or
    None when the approver denied the patch. After the approval the next attempt replays this
    from the last checkpoint: the model's answer and the decision come back as recorded."""
    answer = await attempt.generate(_ask(attempt, phase))
    patch = str(answer.tool_calls[0].arguments["patch"])
    applied = await attempt.tool("apply_patch", {"patch": patch})
    if applied.denied:
        return None
    await attempt.artifact(
        artifact,
        patch.encode(),
        step_id=applied.step.id,
        media_type="text/x-diff",
        labels={"kind": "diff"},
    )
    verified = await attempt.tool("run_tests", {})
    output: dict[str, Any] = verified.output
    await attempt.check("tests-pass", bool(output["passed"]), output["output"])
    await attempt.check("diff-produced", True, artifact)
    return output
