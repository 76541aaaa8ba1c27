"""The operator commands (threads, runs, send, approve, watch) as a person or a script runs
them, against a real server on SQLite and PostgreSQL: each command through the console
script's ``main(argv)`` with its own environment (``cli_support.in_process``), and
``agentrt watch`` as a real process, stopped by signals as a terminal stops it. The worker
side is played with the raw worker stubs, as a worker in another language would, so what the
commands show is what the ledger holds.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from typing import Any

import pytest

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.e2e.cli_support import AGENTRT, ROOT, cli_env, in_process, refused, run, stdout_of
from tests.runtime_support import Stubs
from tests.support import ServerThread

pytestmark = pytest.mark.e2e

V7 = str(ROOT / "examples" / "coding_agent.yaml")


def json_lines(target: str, *args: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout_of(target, *args, "--json").splitlines()]


#: Runs its arguments with SIGINT ignored, as `nohup … &` or a CI runner starts a command
#: (exec keeps an ignored signal ignored). Not preexec_fn: that forks this process, whose
#: gRPC threads (the in-process server, in-process commands) do not survive a fork.
SIGINT_IGNORED = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]


def watcher(target: str, *args: str) -> subprocess.Popen[str]:
    """``agentrt watch`` started as `nohup … &` or a CI runner starts it: SIGINT inherited as
    ignored, which Ctrl-C (the test's SIGINT) must stop all the same."""
    return subprocess.Popen(
        [*SIGINT_IGNORED, *AGENTRT, "watch", *args],
        env=cli_env(target),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def publish_and_thread(target: str) -> str:
    stdout_of(target, "publish", V7, "--tag", "prod")
    thread = stdout_of(
        target,
        "threads",
        "create",
        "login returns 500",
        "--message",
        "POST /login answers 500 since the deploy",
        "--concurrency",
        "ALLOW",
    ).strip()
    assert thread and "\n" not in thread
    return thread


def create_run(target: str, thread: str, objective: str) -> str:
    return stdout_of(target, "runs", "create", thread, "coding_agent:prod", objective).strip()


def model_call(stubs: Stubs, fence: Any, turn: str, key: str) -> str:
    step = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key=key,
            model_call=message_pb2.ModelCallSpec(estimated_input_tokens=100),
        ),
        timeout=10,
    ).step
    end_step(stubs, fence, step.id, reported_model_id="claude-sonnet-4-20250514")
    return str(step.id)


def apply_patch(stubs: Stubs, fence: Any, turn: str) -> Any:
    arguments = message_pb2.ToolCallSpec(tool="apply_patch")
    arguments.arguments.update({"patch": "--- a/login.py\n+++ b/login.py\n"})
    return stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="patch-1",
            tool_call=arguments,
        ),
        timeout=10,
    ).step


def end_step(stubs: Stubs, fence: Any, step_id: str, **kw: Any) -> None:
    kw.setdefault("status", enum_pb2.STEP_STATUS_SUCCEEDED)
    stubs.worker.EndStep(wpb.EndStepRequest(fence=fence, step_id=step_id, **kw), timeout=10)


def begin_turn(stubs: Stubs, fence: Any) -> str:
    return str(stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id)


def wait_for_approval(stubs: Stubs) -> str:
    """Attempt 1: a model call, then apply_patch, which the permission policy holds for a
    human; the attempt ends WAITING_APPROVAL. Returns the approval step's id."""
    fence = stubs.acquire("worker-a").fence
    turn = begin_turn(stubs, fence)
    model_call(stubs, fence, turn, "model-1")
    approval = apply_patch(stubs, fence, turn)
    assert approval.type == enum_pb2.STEP_TYPE_APPROVAL_REQUEST
    stubs.finish(fence, enum_pb2.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    return str(approval.id)


def complete(stubs: Stubs) -> None:
    """Attempt 2 (after the approval): the patch, then the completion checks, then done."""
    fence = stubs.acquire("worker-b").fence
    turn = begin_turn(stubs, fence)
    patch = apply_patch(stubs, fence, turn)
    assert patch.type == enum_pb2.STEP_TYPE_TOOL_CALL
    end_step(stubs, fence, patch.id, side_effect=True)
    for check in ("tests-pass", "diff-produced"):
        step = stubs.worker.BeginStep(
            wpb.BeginStepRequest(
                fence=fence,
                turn_id=turn,
                type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
                completion_check=message_pb2.CompletionCheckSpec(check=check),
            ),
            timeout=10,
        ).step
        end_step(stubs, fence, step.id)
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn), timeout=10)
    stubs.finish(fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)


def test_threads_runs_inputs_and_run_control(server_address: str) -> None:
    target = server_address
    thread = publish_and_thread(target)

    listed = stdout_of(target, "threads", "list")
    assert thread in listed and "login returns 500" in listed and "ALLOW" in listed
    assert any(t["id"] == thread for t in json_lines(target, "threads", "list"))
    shown = stdout_of(target, "threads", "show", thread)
    assert "POST /login answers 500 since the deploy" in shown and "USER" in shown
    [detail] = json_lines(target, "threads", "show", thread)
    assert detail["thread"]["title"] == "login returns 500"
    assert [m["content"] for m in detail["messages"]] == [
        "POST /login answers 500 since the deploy"
    ]

    run_id = stdout_of(
        target,
        "runs",
        "create",
        thread,
        "coding_agent:prod",
        "fix the login failure and keep legacy-token compatibility",
        "--scope",
        "src/auth/",
        "--criterion",
        "the suite passes",
        "--max-steps",
        "40",
        "--label",
        "ticket=LOGIN-500",
    ).strip()
    table = stdout_of(target, "runs", "list", "--thread", thread)
    assert run_id in table and "coding_agent@agent_v7 (via :prod)" in table and "QUEUED" in table
    [listed_run] = json_lines(target, "runs", "list", "--thread", thread)
    assert listed_run["id"] == run_id and listed_run["status"] == "RUN_STATUS_QUEUED"
    assert listed_run["labels"] == {"ticket": "LOGIN-500"}
    assert listed_run["budget"]["max_steps"] == "40"
    assert (
        stdout_of(target, "runs", "list", "--thread", thread, "--status", "RUNNING", "--json") == ""
    )
    assert run_id in stdout_of(target, "threads", "show", thread)

    shown = stdout_of(target, "runs", "show", run_id)
    for fact in ("QUEUED", "coding_agent:prod", "src/auth/", "the suite passes", "steps 40"):
        assert fact in shown, shown
    [detail] = json_lines(target, "runs", "show", run_id)
    assert detail["run"]["goal"]["objective"].startswith("fix the login failure")
    assert detail["attempts"] == [] and detail["steps"] == []

    steer = stdout_of(target, "send", run_id, "--steer", "prefer small diffs").strip()
    [follow] = json_lines(target, "send", run_id, "--follow-up", "then add a regression test")
    assert follow["kind"] == "INPUT_KIND_FOLLOW_UP" and follow["run_id"] == run_id
    assert steer and steer != follow["id"]
    usage = run(target, "send", run_id)  # argparse's own report, exit 2
    assert usage.returncode == 2
    assert "one of the arguments --steer --follow-up is required" in usage.stderr

    assert "PAUSED" in stdout_of(target, "runs", "pause", run_id, "--reason", "lunch")
    [resumed] = json_lines(target, "runs", "resume", run_id)
    assert resumed["status"] == "RUN_STATUS_QUEUED"
    assert "CANCELLED" in stdout_of(target, "runs", "cancel", run_id, "--reason", "wrong ticket")
    [cancelled] = json_lines(target, "runs", "show", run_id)
    assert cancelled["run"]["status"] == "RUN_STATUS_CANCELLED"

    # Refusals: one line with the code, message and a reason that says more than the code
    # (a plain NOT_FOUND's reason is NOT_FOUND: said once); field violations the message does
    # not state already beneath it (the message names the first: one bad field, one line).
    [line] = refused(target, "runs", "show", "run_doesnotexist")
    assert line.startswith("agentrt: NOT_FOUND: ") and "run_doesnotexist" in line
    assert line.count("NOT_FOUND") == 1, line
    [line] = refused(target, "runs", "pause", run_id)
    assert line.startswith("agentrt: FAILED_PRECONDITION: ")
    [line] = refused(target, "runs", "create", thread, "coding_agent:prod", "")
    assert line.startswith("agentrt: INVALID_ARGUMENT: ") and "goal.objective: required" in line
    [line] = refused(target, "runs", "create", thread, "no_such_agent:prod", "x")
    assert line.startswith("agentrt: NOT_FOUND: ")


def _whole(ids: list[str], out: str) -> None:
    """Every id in ``ids`` is on some line whole, and wherever one starts it is whole: not
    wrapped onto the next line, not cut at the edge."""
    tokens = out.replace("│", " ").replace("┃", " ").split()
    for ident in ids:
        assert ident in tokens, (ident, out)
        # A piece of it alone (its head cut at a column's edge, its tail wrapped below).
        pieces = [t for t in tokens if t != ident and len(t) >= 4 and t in ident]
        assert not pieces, (ident, pieces, out)


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_tables_keep_ids_whole_at_any_terminal_width(
    server_address: str, stubs: Stubs, columns: int
) -> None:
    target = server_address
    thread = publish_and_thread(target)
    run_id = create_run(target, thread, "fix the login failure and keep legacy-token compatibility")
    step_id = wait_for_approval(stubs)  # an attempt and steps for `runs show`

    def shown(*args: str) -> str:
        env = cli_env(target)
        env["COLUMNS"] = str(columns)
        result = in_process(args, env)
        assert result.returncode == 0, result.stderr
        assert all(len(line) <= columns for line in result.stdout.splitlines()), result.stdout
        return result.stdout

    listed = shown("runs", "list", "--thread", thread)
    _whole([run_id] + ([thread] if columns >= 120 else []), listed)
    for word in ("fix", "login", "legacy-token", "compatibility"):
        assert word in listed.replace("│", " ").split(), listed
    _whole([thread], shown("threads", "list", "--limit", "0"))
    _whole([thread, run_id], shown("threads", "show", thread))
    [detail] = json_lines(target, "runs", "show", run_id)
    digest = detail["run"]["agent"]["agent_digest"]
    _whole([run_id, step_id, digest], shown("runs", "show", run_id))


def test_approve_and_watch_a_run_until_it_ends(server_address: str, stubs: Stubs) -> None:
    target = server_address
    thread = publish_and_thread(target)
    thread_watch = watcher(target, "--thread", thread, "--json")
    run_watch: Any = None
    try:
        run_id = create_run(target, thread, "fix the login failure")
        run_watch = watcher(target, run_id, "--json")

        step_id = wait_for_approval(stubs)
        shown = stdout_of(target, "runs", "show", run_id)
        for fact in (
            "WAITING_APPROVAL",
            "APPROVAL_REQUEST",
            "apply_patch",
            "claude-sonnet-4 -> claude-sonnet-4-20250514 via primary/anthropic (PRIMARY)",
            "worker-a",
            step_id,
        ):
            assert fact in shown, shown
        [detail] = json_lines(target, "runs", "show", run_id)
        assert [s["type"] for s in detail["steps"]] == [
            "STEP_TYPE_MODEL_CALL",
            "STEP_TYPE_APPROVAL_REQUEST",
        ]
        model = detail["steps"][0]["versions"]["model"]
        assert (model["candidate_name"], model["requested_model_id"]) == (
            "primary",
            "claude-sonnet-4",
        )

        approved = stdout_of(
            target, "approve", run_id, step_id, "--comment", "small and safe", "--actor", "alice"
        )
        assert f"step {step_id} SUCCEEDED" in approved and "QUEUED" in approved
        [line] = refused(target, "approve", run_id, step_id, "--deny")
        assert line.startswith("agentrt: FAILED_PRECONDITION: ")

        complete(stubs)
        out, err = run_watch.communicate(timeout=120)
        assert run_watch.returncode == 0, err
        events = [json.loads(line) for line in out.splitlines()]
        assert [int(e["sequence"]) for e in events] == list(range(1, len(events) + 1))
        assert events[0]["event_type"] == "EVENT_TYPE_RUN_CREATED"
        assert events[-1]["event_type"] == "EVENT_TYPE_RUN_ENDED"
        assert events[-1]["run_ended_attributes"]["status"] == "RUN_STATUS_COMPLETED"
        resolved = [e for e in events if e["event_type"] == "EVENT_TYPE_APPROVAL_RESOLVED"]
        assert resolved[0]["approval_resolved_attributes"]["comment"] == "small and safe"
        assert resolved[0]["approval_resolved_attributes"]["approver"] == "alice"

        # The run has ended: a human watch replays its events, one line each, and exits.
        human = stdout_of(target, "watch", run_id).splitlines()
        assert len(human) == len(events)
        assert human[0].split()[:1] == ["1"] and "run.created" in human[0]
        assert "approval.resolved" in human[events.index(resolved[0])]
        assert "run.ended" in human[-1] and "status=COMPLETED" in human[-1]
        after = stdout_of(
            target, "watch", run_id, "--after", str(len(events) - 1), "--json"
        ).splitlines()
        assert [json.loads(line)["sequence"] for line in after] == [str(len(events))]

        # A thread's watch goes on until interrupted: it has seen the run end, then Ctrl-C.
        assert thread_watch.stdout is not None
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["event"]["event_type"] != "EVENT_TYPE_RUN_ENDED":
            line = thread_watch.stdout.readline()
            assert line, thread_watch.stderr.read() if thread_watch.stderr else ""
            seen.append(json.loads(line))
        thread_watch.send_signal(signal.SIGINT)
        thread_watch.communicate(timeout=60)
        assert thread_watch.returncode == 130
        assert [e["event"]["sequence"] for e in seen if e["event"].get("run_id") == run_id] == [
            e["sequence"] for e in events
        ]
        assert all(item["cursor"] for item in seen)

        finished = stdout_of(target, "runs", "show", run_id)
        assert "COMPLETED" in finished and "worker-b" in finished and "tests-pass" in finished
    finally:
        # Whatever failed, nothing this test started outlives it.
        for process in (thread_watch, run_watch):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()


def test_watch_prints_one_line_per_event_whatever_a_summary_holds(
    server_address: str, stubs: Stubs
) -> None:
    target = server_address
    thread = publish_and_thread(target)
    run_id = stdout_of(
        target,
        "runs",
        "create",
        thread,
        "coding_agent:prod",
        "fix the login failure\nand keep legacy tokens",
        "--label",
        "ticket=LOGIN 500",
    ).strip()
    fence = stubs.acquire("worker-a").fence
    step = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=begin_turn(stubs, fence),
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key="model-1",
            model_call=message_pb2.ModelCallSpec(estimated_input_tokens=100),
        ),
        timeout=10,
    ).step
    end_step(stubs, fence, step.id, summary="found the cause:\n  the token check")
    stubs.finish(
        fence, enum_pb2.ATTEMPT_OUTCOME_FAILED_PERMANENT, result_summary="gave up:\nno tests"
    )

    events = json_lines(target, "watch", run_id)
    lines = stdout_of(target, "watch", run_id).splitlines()
    # One line per event, each starting with its sequence: no summary breaks one in two.
    assert [line.split()[0] for line in lines] == [e["sequence"] for e in events], lines
    assert 'labels.ticket="LOGIN 500"' in lines[0]
    assert 'goal.objective="fix the login failure and keep legacy tokens"' in lines[0]
    assert any('summary="found the cause: the token check"' in line for line in lines), lines
    assert 'terminal_message="gave up: no tests"' in lines[-1]


def test_a_label_with_a_line_break_or_a_blank_key_is_refused_naming_it(server_address: str) -> None:
    """A label key is a word and a value one line (runtime_service/labels.py): the refusal
    names the entry, and nothing is created."""
    target = server_address
    thread = publish_and_thread(target)
    for label, entry in (
        ("ticket\nid=LOGIN", 'labels["ticket\\nid"]'),
        ("ticket id=LOGIN", 'labels["ticket id"]'),
        ("ticket=LOGIN\n500", 'labels["ticket"]'),
    ):
        lines = refused(
            target, "runs", "create", thread, "coding_agent:prod", "x", "--label", label
        )
        assert lines[0].startswith("agentrt: INVALID_ARGUMENT"), lines
        assert any(entry in line for line in lines), lines
    assert stdout_of(target, "runs", "list", "--thread", thread, "--json") == ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_watch_carries_on_across_a_server_restart(database_url: str) -> None:
    port = _free_port()
    first = ServerThread(database_url, listen=f"127.0.0.1:{port}")
    target = first.start()
    thread = publish_and_thread(target)
    run_id = create_run(target, thread, "fix the login failure")
    watch = watcher(target, run_id, "--json")
    assert watch.stdout is not None
    created = json.loads(watch.stdout.readline())
    assert created["event_type"] == "EVENT_TYPE_RUN_CREATED"
    with Stubs.open(target) as stubs:
        step_id = wait_for_approval(stubs)
    first.stop()  # the watch's stream breaks; it reconnects once a server answers again

    second = ServerThread(database_url, listen=f"127.0.0.1:{port}")
    second.start()
    try:
        stdout_of(target, "approve", run_id, step_id)
        with Stubs.open(target) as stubs:
            complete(stubs)
        out, err = watch.communicate(timeout=120)
    finally:
        second.stop()
    assert watch.returncode == 0, err
    events = [created, *(json.loads(line) for line in out.splitlines())]
    assert [int(e["sequence"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event_type"] == "EVENT_TYPE_RUN_ENDED"


def test_failures_before_any_answer_are_one_line_with_their_exit_code(tmp_path: Any) -> None:
    nowhere = "127.0.0.1:1"
    [line] = refused(nowhere, "runs", "list")  # retried with backoff, then reported
    assert line.startswith("agentrt: UNAVAILABLE: ") and "127.0.0.1:1" in line
    missing = str(tmp_path / "ca.pem")
    [line] = refused(nowhere, "runs", "list", "--tls-ca", missing, code=2)
    assert line == f"agentrt: {missing}: No such file or directory"
    [line] = refused(nowhere, "runs", "list", "--tls-cert", missing, code=2)
    assert "--tls-key" in line
    bad = run(nowhere, "runs", "list", "--status", "SLEEPING")
    assert bad.returncode == 2 and "invalid choice: 'SLEEPING'" in bad.stderr


def test_agentrt_alone_or_a_group_alone_prints_its_help_and_exits_2() -> None:
    """No command is a bad command line (exit 2, as argparse's usage errors), but the reply is
    the help, not argparse's "the following arguments are required: COMMAND"; on stderr, so
    a script's `agentrt $EMPTY` gets nothing on stdout."""
    alone = in_process([], cli_env("127.0.0.1:1"))
    assert alone.returncode == 2
    assert alone.stdout == ""
    assert alone.stderr.startswith("usage: agentrt ")
    assert "agentrt: error:" not in alone.stderr
    for command in ("serve", "publish", "runs", "watch", "audit", "demo"):
        assert f"\n    {command} " in alone.stderr, alone.stderr
    helped = in_process(["--help"], cli_env("127.0.0.1:1"))
    assert helped.returncode == 0 and helped.stdout == alone.stderr
    # So does a command group alone: its own commands.
    runs = in_process(["runs"], cli_env("127.0.0.1:1"))
    assert runs.returncode == 2 and runs.stdout == ""
    assert runs.stderr.startswith("usage: agentrt runs ") and "agentrt: error:" not in runs.stderr
    assert "\n    list " in runs.stderr and "\n    cancel " in runs.stderr
    # What is not a group alone is argparse's as before.
    wrong = in_process(["runs", "sleep"], cli_env("127.0.0.1:1"))
    assert wrong.returncode == 2 and "invalid choice: 'sleep'" in wrong.stderr
