"""``agentrt demo``: the login-fix case of the design notes, end to end, with real processes.

1. Start an embedded server (``agentrt serve`` on a free loopback port, an SQLite file in a
   temporary folder), unless ``--target`` names one.
2. Publish ``coding_agent@agent_v7`` (examples/coding_agent.yaml: its skill, three tools
   and policies) and tag it ``prod``.
3. Thread "login returns 500" with its message; a run "fix the login failure and keep
   legacy-token compatibility" via ``coding_agent:prod``.
4. Worker A (a process) reproduces the failure, reads the code, checkpoints, and is killed
   with SIGKILL. Its lease expires; worker B (another process) takes attempt 2, resumes from
   the checkpoint; the primary model answers 429 once and the call falls back; ``apply_patch``
   needs approval, which this command grants as the operator; attempt 3 applies the patch,
   records it as an artifact, runs the tests and attests the completion checks.
5. A follow-up run in the same thread: "add a legacy-token regression test".
6. The audit tree, read back from the server (attempts, the resume point, each step's
   resolved versions, the approval, the artifacts' provenance, the chain verified).

Everything printed is read from the server's API, not remembered by this command; ``--json``
prints the same facts as one JSON document (what the demo's test asserts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core.proto_json import short_name
from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.demo import telemetry
from agentrt_sdk.demo.login_fix import make_workspace
from agentrt_sdk.tracing import tracer_for
from agentrt_sdk.transport import RetryPolicy

THREAD_TITLE = "login returns 500"
THREAD_MESSAGE = (
    "POST /login answers 500 for every user still on a legacy token since Tuesday's deploy."
)
FIX_OBJECTIVE = "fix the login failure and keep legacy-token compatibility"
FOLLOW_UP_OBJECTIVE = "add a legacy-token regression test"
OPERATOR = "demo-operator"
#: The demo's spans (the global provider's: ``telemetry.configure`` installs one when the
#: ``OTEL_*`` variables ask for traces; otherwise they are no-ops).
_tracer = tracer_for(None)


def definition_file() -> Path:
    """coding_agent@agent_v7's bundle: shipped in the wheel beside this module, or the
    checkout's examples/ (one file, not a copy: the wheel force-includes it)."""
    shipped = resources.files("agentrt_sdk.demo").joinpath("coding_agent.yaml")
    if shipped.is_file():
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"


class DemoFailed(Exception):
    """The case did not play out (a step timed out, a run ended other than COMPLETED)."""


@dataclass
class Processes:
    """The child processes the demo started, stopped whatever happens."""

    children: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Any:
        handle = log.open("w")
        child = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _log_text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


async def _wait_for_line(log: Path, text: str, child: Any, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if text in await asyncio.to_thread(_log_text, log):
            return
        if child.poll() is not None:
            tail = (await asyncio.to_thread(_log_text, log))[-2000:]
            raise DemoFailed(f"{' '.join(child.args[2:4])} exited early: {tail}")
        await asyncio.sleep(0.05)
    raise DemoFailed(f"no {text!r} within {limit:.0f}s; see {log}")


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _signing_key(url: str, workdir: Path) -> list[str]:
    """A server on PostgreSQL must be given its signing key (a SQLite file's makes its own):
    the one ``AGENTRT_SIGNING_KEYS`` names, else a key made for the demo in its folder."""
    if url.startswith("sqlite") or os.environ.get("AGENTRT_SIGNING_KEYS"):
        return []
    path = workdir / "signing-key.pem"
    subprocess.run(
        _python("runtime_service.cli.entry", "keygen", str(path)),
        check=True,
        capture_output=True,
    )
    return ["--signing-key", str(path)]


async def _until_event(
    client: AgentrtClient, run_id: str, after: int, wanted: set[int], limit: float
) -> event_pb2.Event:
    """The first event of ``run_id`` after ``after`` whose type is in ``wanted``."""
    async with asyncio.timeout(limit):
        async for event in client.watch_run(run_id, after_sequence=after):
            if event.event_type in wanted:
                return event
    raise DemoFailed(f"run {run_id} ended before {sorted(wanted)}")


async def _until_status(client: AgentrtClient, run_id: str, status: int, limit: float) -> None:
    async with asyncio.timeout(limit):
        while (await client.runs.get(run_id)).status != status:  # noqa: ASYNC110 - server state
            await asyncio.sleep(0.05)


async def _approve_next(client: AgentrtClient, run_id: str, after: int) -> int:
    """Wait for the run's next approval request, approve it as the operator; the sequence
    to watch on from."""
    requested = await _until_event(
        client, run_id, after, {enum_pb2.EVENT_TYPE_APPROVAL_REQUESTED}, 20
    )
    await _until_status(client, run_id, enum_pb2.RUN_STATUS_WAITING_APPROVAL, 20)
    steps = await client.runs.steps(run_id)
    waiting = next(s for s in steps if s.status == enum_pb2.STEP_STATUS_WAITING_APPROVAL)
    await client.runs.resolve_approval(
        run_id, waiting.id, approve=True, approver=OPERATOR, comment="patch reviewed"
    )
    return int(requested.sequence)


async def play(target: str | None, database_url: str | None, workdir: Path) -> dict[str, Any]:
    """Play the case; answers the facts of the audit tree."""
    started = time.monotonic()
    timeline: list[tuple[str, float]] = []

    def say(text: str) -> None:
        """A progress line on stderr, as it happens: the seconds before the tree are not
        silent, and stdout keeps the tree (or the JSON) alone."""
        elapsed = time.monotonic() - started
        print(f"agentrt demo: {elapsed:5.1f}s  {text}", file=sys.stderr, flush=True)

    def mark(milestone: str, waiting_for: str = "") -> None:
        """A milestone of the facts' timeline (bench/demo_time.py's columns), said with what
        the demo waits for next."""
        timeline.append((milestone, round(time.monotonic() - started, 2)))
        say(f"{milestone}; {waiting_for}…" if waiting_for else milestone)

    processes = Processes()
    say(
        "starting two worker processes"
        + (f" for the server at {target}" if target else " and a server")
        + "…"
    )
    try:
        server: Any = None
        if target is None:
            port = _free_port()
            target = f"127.0.0.1:{port}"
            url = database_url or f"sqlite:///{workdir / 'agentrt.db'}"
            server_log = workdir / "server.log"
            server = processes.start(
                _python(
                    "runtime_service.cli.entry",
                    "serve",
                    "--listen",
                    target,
                    "--database-url",
                    url,
                    *_signing_key(url, workdir),
                ),
                server_log,
            )
        workspace = make_workspace(workdir / "workspace")

        def worker(name: str, *extra: str, env: dict[str, str] | None = None) -> Any:
            log = workdir / f"{name}.log"
            child = processes.start(
                _python(
                    "agentrt_sdk.demo.worker_main",
                    "--target",
                    target,
                    "--worker-id",
                    name,
                    "--workspace",
                    str(workspace),
                    "--label",
                    f"demo={workdir.name}",
                    *extra,
                ),
                log,
                env,
            )
            return child, log

        # Both workers start with the server, so the three processes' start-up overlaps;
        # worker B takes no run before worker A is gone (its go file).
        go_b = workdir / "worker-B.go"
        worker_a, _ = worker("worker-A", env={"AGENTRT_DEMO_HANG_AFTER_CHECKPOINT": "1"})
        worker("worker-B", "--rate-limit-once", "--start-after", str(go_b))
        if server is not None:
            await _wait_for_line(server_log, "agentrt ready", server, 30)
            mark("server ready", f"publishing coding_agent@agent_v7 to {target}")
        fast = RetryPolicy(attempts=20, initial_backoff=0.05, max_backoff=0.5)
        async with AgentrtClient(target, retry=fast) as client:
            published = await client.registry.publish(definition_file(), tag="prod")
            thread = await client.threads.create(THREAD_TITLE)
            await client.threads.append_message(thread.id, THREAD_MESSAGE)
            # The label keeps the demo's workers to the demo's runs on a shared server.
            labels = {"demo": workdir.name}
            # As a backend would: its span around the call, whose context CreateRun continues.
            with _tracer.start_as_current_span("agentrt demo: create run 1"):
                run = await client.runs.create(
                    thread.id, "coding_agent:prod", FIX_OBJECTIVE, labels=labels
                )
            mark("published, run created", f"run 1 {run.id}: worker A works to its checkpoint")

            checkpoint = await _until_event(
                client, run.id, 0, {enum_pb2.EVENT_TYPE_CHECKPOINT_WRITTEN}, 30
            )
            worker_a.send_signal(signal.SIGKILL)
            worker_a.wait()
            mark(
                "checkpoint written, worker A killed",
                "worker B resumes run 1 from the checkpoint until apply_patch asks for approval",
            )
            go_b.touch()
            approved_at = await _approve_next(client, run.id, checkpoint.sequence)
            mark("approved", f"worker B applies run 1's patch (approved as {OPERATOR})")
            await _until_status(client, run.id, enum_pb2.RUN_STATUS_COMPLETED, 30)
            mark("run completed", "run 2, the follow-up, until its approval")

            with _tracer.start_as_current_span("agentrt demo: create run 2"):
                follow = await client.runs.create(
                    thread.id,
                    "coding_agent:prod",
                    FOLLOW_UP_OBJECTIVE,
                    labels={**labels, "case": "regression-test"},
                )
            await _approve_next(client, follow.id, 0)
            mark("follow-up approved", "run 2 until it completes")
            await _until_status(client, follow.id, enum_pb2.RUN_STATUS_COMPLETED, 30)
            mark("follow-up completed", "reading the audit tree back from the server")
            facts = {
                "target": target,
                "agent": {
                    "agent_id": published.agent_version.agent_id,
                    "version_label": published.agent_version.version_label,
                    "digest": published.agent_version.digest,
                    "tag": "prod",
                },
                "thread": {"id": thread.id, "title": thread.title},
                "killed": {"worker_id": "worker-A", "pid": worker_a.pid, "signal": "SIGKILL"},
                "approved_after_sequence": approved_at,
                "runs": [await _run_facts(client, r) for r in (run.id, follow.id)],
            }
        mark("audit tree read")
        facts["timeline"] = timeline
        facts["elapsed_seconds"] = round(time.monotonic() - started, 2)
        return facts
    finally:
        processes.stop_all()


async def _run_facts(client: AgentrtClient, run_id: str) -> dict[str, Any]:
    run = await client.runs.get(run_id)
    attempts = await client.runs.attempts(run_id)
    steps = await client.runs.steps(run_id)
    artifacts = await client.runs.artifacts(run_id=run_id)
    verified = await client.audit.verify(run_id)
    number = {a.id: a.number for a in attempts}
    step_facts = []
    for step in steps:
        fact: dict[str, Any] = {
            "id": step.id,
            "sequence": step.sequence,
            "attempt": number.get(step.attempt_id, 0),
            "type": short_name(enum_pb2.StepType, "STEP_TYPE_", step.type, "type"),
            "operation": step.operation,
            "status": short_name(enum_pb2.StepStatus, "STEP_STATUS_", step.status, "status"),
        }
        if step.error_class:
            fact["error_class"] = short_name(
                enum_pb2.ErrorClass, "ERROR_CLASS_", step.error_class, "error_class"
            )
        model = step.versions.model
        if model.candidate_name:
            fact["model"] = {
                "candidate": model.candidate_name,
                "reason": short_name(
                    enum_pb2.CandidateReason, "CANDIDATE_REASON_", model.reason, "reason"
                ),
                "provider": model.provider,
                "requested_model_id": model.requested_model_id,
                "reported_model_id": model.reported_model_id,
                "fallback_from_step_id": model.fallback_from_step_id,
            }
        if step.versions.skills:
            fact["skills"] = [
                {"name": s.name, "version": s.version, "digest": s.digest}
                for s in step.versions.skills
            ]
        if step.versions.tools:
            fact["tools"] = [
                {"name": t.name, "version": t.version, "schema_digest": t.schema_digest}
                for t in step.versions.tools
            ]
        if step.HasField("approval"):
            fact["approval"] = {
                "decision": short_name(
                    enum_pb2.ApprovalDecision,
                    "APPROVAL_DECISION_",
                    step.approval.decision,
                    "decision",
                ),
                "approver": step.approval.approver,
                "approver_principal": step.approval.approver_principal,
            }
        if step.completion_check:
            fact["check"] = step.completion_check
        step_facts.append(fact)
    artifact_facts = []
    for artifact in artifacts:
        provenance = await client.audit.provenance(artifact_id=artifact.id)
        record = provenance.records[0]
        artifact_facts.append(
            {
                "id": artifact.id,
                "name": artifact.name,
                "blob_digest": artifact.blob_digest,
                "step_id": record.step.id,
                "step_operation": record.step.operation,
                "attempt": record.attempt.number,
                "worker_id": record.attempt.worker_id,
                "agent_digest": record.agent_version.digest,
                "version_label": record.agent_version.version_label,
            }
        )
    return {
        "id": run.id,
        "objective": run.goal.objective,
        "status": short_name(enum_pb2.RunStatus, "RUN_STATUS_", run.status, "status"),
        "result_summary": run.result_summary,
        "binding": {
            "requested_ref": run.agent.requested_ref,
            "agent_digest": run.agent.agent_digest,
            "version_label": run.agent.version_label,
            "resolved_via_tag": run.agent.resolved_via_tag,
        },
        "attempts": [
            {
                "number": a.number,
                "id": a.id,
                "worker_id": a.worker_id,
                "status": short_name(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", a.status, "status"),
                "reason": short_name(enum_pb2.AttemptReason, "ATTEMPT_REASON_", a.reason, "reason"),
                "resume_from_checkpoint_id": a.resume_from_checkpoint_id,
            }
            for a in attempts
        ],
        "steps": step_facts,
        "artifacts": artifact_facts,
        "chain": {
            "intact": verified.intact,
            "events": verified.event_count,
            "rows_checked": verified.rows_checked,
        },
    }


@dataclass
class Node:
    """A line of the audit tree, the lines that say more about it, and its children."""

    text: str
    details: list[str] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)


def draw(nodes: list[Node], prefix: str = "") -> Iterator[str]:
    """``nodes`` as a tree: the last child of every node gets ``└─``, the others ``├─``, and
    a ``│`` carries each one that has a sibling below it past its details and children."""
    for index, node in enumerate(nodes):
        last = index == len(nodes) - 1
        yield f"{prefix}{'└─' if last else '├─'} {node.text}"
        below = prefix + ("   " if last else "│  ")
        for detail in node.details:
            yield below + detail
        yield from draw(node.children, below)


def tree_lines(facts: dict[str, Any]) -> Iterator[str]:
    """The audit tree as text."""
    agent = facts["agent"]
    yield f"{agent['agent_id']}@{agent['version_label']}  {agent['digest']}  (tag {agent['tag']})"
    yield f"thread {facts['thread']['id']}  {facts['thread']['title']!r}"
    yield from draw([_run_node(run) for run in facts["runs"]])
    yield f"killed {facts['killed']['worker_id']} with {facts['killed']['signal']}; " + (
        f"done in {facts['elapsed_seconds']}s"
    )


def _run_node(run: dict[str, Any]) -> Node:
    binding, chain = run["binding"], run["chain"]
    attempts = []
    for attempt in run["attempts"]:
        resume = attempt["resume_from_checkpoint_id"]
        steps = [s for s in run["steps"] if s["attempt"] == attempt["number"]]
        attempts.append(
            Node(
                f"attempt {attempt['number']}  {attempt['worker_id']}  {attempt['status']}"
                f"  ({attempt['reason']})" + (f"  resumes from {resume}" if resume else ""),
                children=[Node(_step_line(step)) for step in steps],
            )
        )
    artifacts = [
        Node(
            f"artifact {artifact['name']}  {artifact['blob_digest'][:19]}…  made by "
            f"{artifact['step_operation']} (attempt {artifact['attempt']}, "
            f"{artifact['worker_id']}) with {artifact['version_label']}"
        )
        for artifact in run["artifacts"]
    ]
    return Node(
        f"run {run['id']}  {run['status']}  {run['objective']!r}",
        details=[
            f"bound to {binding['agent_digest']} ({binding['version_label']}) via "
            f"{binding['requested_ref']}",
            f"chain {'intact' if chain['intact'] else 'BROKEN'}: {chain['events']} events, "
            f"{chain['rows_checked']} rows re-derived",
        ],
        children=attempts + artifacts,
    )


def _step_line(step: dict[str, Any]) -> str:
    line = f"#{step['sequence']} {step['type']} {step['operation']} {step['status']}"
    if "error_class" in step:
        line += f" ({step['error_class']})"
    if "model" in step:
        m = step["model"]
        line += (
            f"  model {m['candidate']} {m['provider']}/{m['requested_model_id']}"
            f" → reported {m['reported_model_id'] or '-'} [{m['reason']}]"
        )
    if "skills" in step:
        line += "  skills " + ", ".join(f"{s['name']}@{s['version']}" for s in step["skills"])
    if "tools" in step and step["type"] == "TOOL_CALL":
        line += "  " + ", ".join(
            f"{t['name']}@{t['version']} schema {t['schema_digest'][:15]}…" for t in step["tools"]
        )
    if "approval" in step:
        a = step["approval"]
        line += f"  {a['decision']} by {a['approver']}"
    return line


def main(target: str | None, database_url: str | None, as_json: bool, keep: bool) -> int:
    """The command: play, print, exit 0 when the case played out."""
    workdir = Path(tempfile.mkdtemp(prefix="agentrt-demo-"))
    stop_tracing = telemetry.configure("agentrt-demo")
    try:
        facts = asyncio.run(play(target, database_url, workdir))
    except (DemoFailed, TimeoutError) as exc:
        print(f"agentrt demo: {exc or 'timed out'} (logs in {workdir})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: play() has stopped its processes on the way out; nothing is worth keeping.
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        stop_tracing()
    if as_json:
        print(json.dumps(facts, indent=2, sort_keys=True))
    else:
        for line in tree_lines(facts):
            print(line)
    if keep:
        print(f"(files kept in {workdir})", file=sys.stderr)
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    return 0
