"""Every kind of BeginStep/EndStep decision (``step_rules``), applied on each engine, by the
server's own step engine and by the step writer process: the same script stores the same
steps, usage rows, events and totals either way, answers the same errors, and leaves an
intact event chain. (The pure rules are tested value by value in
``tests/unit/test_step_rules.py``.)"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.db_engines import normalise_url
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    digest_of,
    expect,
    get_run,
    list_steps,
    put_blob,
    send,
    start,
)
from tests.support import ServerThread, error_details

#: Columns whose values necessarily differ between two runs (their ids and clocks).
_VARYING = {
    "id",
    "run_id",
    "attempt_id",
    "turn_id",
    "step_id",
    "start_time",
    "end_time",
    "retry_of_step_id",
}
_STORED_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")
E = enum_pb2


@contextlib.contextmanager
def _server(database_url: str, *, step_process: bool) -> Iterator[tuple[ServerThread, Stubs]]:
    thread = ServerThread(database_url, step_process=step_process)
    stubs = Stubs.open(thread.start())
    try:
        yield thread, stubs
    finally:
        stubs.close()
        thread.stop()


@pytest.fixture
def in_process(database_url: str) -> Iterator[Stubs]:
    """A server that runs every step itself (no step writer process)."""
    with _server(database_url, step_process=False) as (_, stubs):
        yield stubs


def _code_and_reason(error: grpc.RpcError) -> tuple[Any, str]:
    info = error_details(error).get("ErrorInfo")
    return error.code(), info.reason if info is not None else ""


def _script(stubs: Stubs, *, publish: bool) -> tuple[str, list[Any]]:
    """Each decision kind once; returns the run and the errors answered, in order."""
    w = start(stubs, publish=publish, budget=message_pb2.Budget(max_steps=8))
    answered: list[Any] = []

    def refused(call: Any, *a: Any, **kw: Any) -> None:
        try:
            call(*a, **kw)
        except grpc.RpcError as error:
            answered.append(_code_and_reason(error))
        else:
            raise AssertionError(f"{call} was not refused")

    output = put_blob(stubs, b"the model's answer").blob.digest
    # Record (a model call, with its resolution), End, Unchanged.
    model = w.model(
        "plan",
        operation="plan",
        input_ref=output,
        estimated_input_tokens=40,
        skills=["repo-debug"],
        tools=["read_file", "apply_patch"],
        context_digest=digest_of(b"context"),
    )
    usage = message_pb2.Usage(input_tokens=30, output_tokens=7, cost_usd=0.25)
    end_kw: dict[str, Any] = {
        "output_ref": output,
        "summary": "planned",
        "usage": usage,
        "reported_model_id": "claude-sonnet-4-20250514",
    }
    w.end(model.step.id, **end_kw)
    w.end(model.step.id, **end_kw)  # repeated: unchanged
    refused(w.end, model.step.id, E.STEP_STATUS_FAILED)  # STEP_ENDED
    # Record a tool call; FAILED; the same key again: its retry (a new step).
    tool = w.tool("read_file", key="read", path="src/app.py")
    w.end(
        tool.step.id,
        E.STEP_STATUS_FAILED,
        error_class=E.ERROR_CLASS_TOOL_ERROR,
        error_message="no such file",
        retryable=True,
        side_effect=True,
    )
    retry = w.tool("read_file", key="read", path="src/app.py")
    assert not retry.existing and retry.step.retry_of_step_id == tool.step.id
    w.end(retry.step.id)
    # Reuse: the same key once more answers the succeeded retry.
    again = w.tool("read_file", key="read", path="src/app.py")
    assert again.existing and again.step.id == retry.step.id
    # Denials the ledger keeps (answered with their errors after the commit).
    refused(w.tool, "rm_rf", path="/")  # not in the definition
    refused(w.model, skills=["no-such-skill"])  # not in the definition
    refused(w.tool, "read_file", path=7)  # arguments against the schema
    # An approval request, asked twice (the second time: reused).
    asked = w.tool("apply_patch", key="patch", patch="--- a\n+++ b\n")
    assert asked.step.status == E.STEP_STATUS_WAITING_APPROVAL
    assert w.tool("apply_patch", key="patch", patch="--- a\n+++ b\n").existing
    # Steers: delivered to the next model call, in the transaction that records it.
    send(stubs, w.run_id, E.INPUT_KIND_STEER, "use the other file")
    steered = w.model()
    assert [i.content for i in steered.steer_inputs] == ["use the other file"]
    w.end(steered.step.id, E.STEP_STATUS_CANCELLED)
    # Refusals that write nothing.
    refused(w.begin, turn_id="trn_nope", type=E.STEP_TYPE_MODEL_CALL, model_call={})
    refused(w.model, input_ref=digest_of(b"never uploaded"))
    refused(w.check, "not-a-check")
    w.check("tests-pass")
    # The budget: max_steps (8) reached, the run ends FAILED.
    refused(w.model)
    return w.run_id, answered


def _stored(url: str, run_id: str) -> dict[str, Any]:
    """What a run left in the database, with its own ids replaced by stable names."""
    engine = sa.create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:

            def rows(sql: str) -> list[dict[str, Any]]:
                return [dict(r._mapping) for r in conn.execute(sa.text(sql), {"r": run_id})]

            steps = rows("SELECT * FROM runtime_steps WHERE run_id = :r ORDER BY sequence")
            usages = rows(
                "SELECT u.* FROM runtime_step_usages u JOIN runtime_steps s ON s.id = u.step_id"
                " WHERE s.run_id = :r ORDER BY s.sequence, u.kind, u.name"
            )
            events = rows(
                "SELECT event_type, sequence, attributes_json FROM runtime_events"
                " WHERE run_id = :r ORDER BY sequence"
            )
            [run] = rows(
                "SELECT status, terminal_reason, step_count, last_step_sequence, input_tokens,"
                " output_tokens, cost_usd, last_event_sequence FROM runtime_runs WHERE id = :r"
            )
            [attempt] = rows(
                "SELECT status, input_tokens, output_tokens, cost_usd FROM runtime_attempts"
                " WHERE run_id = :r"
            )
            inputs = rows("SELECT status, kind FROM runtime_inputs WHERE run_id = :r")
            stored_times: list[Any] = []
            if engine.dialect.name == "sqlite":
                stored_times = [
                    v
                    for r in conn.exec_driver_sql(
                        "SELECT start_time, end_time FROM runtime_steps WHERE run_id = ?",
                        (run_id,),
                    )
                    for v in r
                ]
    finally:
        engine.dispose()
    names = {run_id: "<run>"}
    for step in steps:
        names[step["id"]] = f"<step {step['sequence']}>"
        names[step["attempt_id"]] = "<attempt>"
        names[step["turn_id"]] = "<turn>"

    def named(text: str) -> str:
        for real, name in names.items():
            text = text.replace(real, name)
        return re.sub(r"\b(inp|blb|thr|run|att|trn)_[0-9A-Za-z]+", r"<\1>", text)

    def document(event: dict[str, Any]) -> dict[str, Any]:
        attributes = json.loads(named(event["attributes_json"]))
        # Times and usage of the run's own lifecycle events follow its clock.
        for key in ("create_time", "lease_expire_time", "deadline_time"):
            attributes.pop(key, None)
        return {"event_type": event["event_type"], "attributes": attributes}

    return {
        "steps": [
            {k: named(v) if isinstance(v, str) else v for k, v in s.items() if k not in _VARYING}
            for s in steps
        ],
        "usages": [{k: v for k, v in u.items() if k not in _VARYING} for u in usages],
        # Compared as documents: a Struct's keys (model parameters) come out of protobuf in an
        # order that differs between processes (upb seeds its map hashing per process), and
        # the event hash is taken over the canonical form, so the order is not part of it.
        "step events": [document(e) for e in events if e["event_type"].startswith("step.")],
        "event types": [e["event_type"] for e in events],
        "run": run,
        "attempt": attempt,
        "inputs": sorted((i["kind"], i["status"]) for i in inputs),
        "stored_times": stored_times,
    }


def test_every_decision_kind_is_stored_alike_by_the_server_and_the_step_writer(
    database_url: str,
) -> None:
    runs: dict[str, tuple[str, list[Any]]] = {}
    with _server(database_url, step_process=False) as (_, stubs):
        runs["server"] = _script(stubs, publish=True)
    with _server(database_url, step_process=True) as (thread, stubs):
        runs["step writer"] = _script(stubs, publish=False)
        process = thread.server.step_process
        assert process is not None and process.alive
    [server_errors, writer_errors] = [errors for _, errors in runs.values()]
    assert server_errors == writer_errors
    assert server_errors == [
        (grpc.StatusCode.FAILED_PRECONDITION, "STEP_ENDED"),
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_IN_DEFINITION"),
        (grpc.StatusCode.PERMISSION_DENIED, "NOT_IN_DEFINITION"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),  # the tool's schema
        (grpc.StatusCode.FAILED_PRECONDITION, "TURN_NOT_OPEN"),
        (grpc.StatusCode.FAILED_PRECONDITION, "BLOB_MISSING"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),  # not a check of the policy
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "BUDGET_EXCEEDED"),
    ]
    stored = {way: _stored(database_url, run_id) for way, (run_id, _) in runs.items()}
    server, writer = stored["server"], stored["step writer"]
    for part in ("steps", "usages", "step events", "event types", "run", "attempt", "inputs"):
        assert writer[part] == server[part], part
    steps = server["steps"]
    # model, tool (failed), its retry, 3 denials, approval request, steered model, check.
    assert [(s["type"], s["status"]) for s in steps] == [
        ("MODEL_CALL", "SUCCEEDED"),
        ("TOOL_CALL", "FAILED"),
        ("TOOL_CALL", "SUCCEEDED"),
        ("TOOL_CALL", "DENIED"),
        ("MODEL_CALL", "DENIED"),
        ("TOOL_CALL", "FAILED"),
        ("APPROVAL_REQUEST", "WAITING_APPROVAL"),
        ("MODEL_CALL", "CANCELLED"),
        ("COMPLETION_CHECK", "SUCCEEDED"),
    ]
    assert [s["operation"] for s in steps] == [
        "plan",
        "read_file",
        "read_file",
        "rm_rf",
        "",
        "read_file",
        "apply_patch",
        "",
        "tests-pass",
    ]
    assert server["run"]["status"] == "FAILED"
    assert server["run"]["terminal_reason"] == "BUDGET_EXCEEDED"
    assert (server["run"]["input_tokens"], server["run"]["output_tokens"]) == (30, 7)
    assert server["run"]["step_count"] == 8  # the approval request is not counted
    assert server["inputs"] == [("STEER", "DELIVERED")]
    # Times are stored as SQLAlchemy stores them, so every path's rows sort and compare alike.
    for way, found in stored.items():
        for value in found["stored_times"]:
            assert value is None or _STORED_TIME.match(value), (way, value)
    with _server(database_url, step_process=False) as (_, stubs):
        audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
        for run_id, _ in runs.values():
            verified = audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id))
            assert verified.intact
            assert verified.event_count == server["run"]["last_event_sequence"]


def test_concurrent_repeats_of_a_step_call_record_it_once(stubs: Stubs) -> None:
    """Retries racing each other (a worker that timed out and called again): one step, begun
    once, ended once, its usage counted once, on both engines."""
    w = start(stubs)
    with ThreadPoolExecutor(8) as pool:
        begun = list(pool.map(lambda _: w.model("same-key"), range(8)))
    assert len({b.step.id for b in begun}) == 1
    assert sum(not b.existing for b in begun) == 1
    step_id = begun[0].step.id
    usage = message_pb2.Usage(input_tokens=5, output_tokens=2, cost_usd=0.5)
    with ThreadPoolExecutor(8) as pool:
        ended = list(pool.map(lambda _: w.end(step_id, usage=usage), range(8)))
    assert {e.status for e in ended} == {E.STEP_STATUS_SUCCEEDED}
    run = get_run(stubs, w.run_id)
    assert (run.usage.input_tokens, run.usage.output_tokens, run.step_count) == (5, 2, 1)
    assert [s.id for s in list_steps(stubs, w.run_id)] == [step_id]


@pytest.mark.parametrize("writer", [False, True], ids=["server", "step writer"])
def test_concurrent_usage_adds_up_on_the_attempt_and_the_run(
    database_url: str, writer: bool
) -> None:
    """Parallel EndSteps of one attempt: each adds its usage to the totals it read under the
    run's lock. On PostgreSQL that read must come after the lock, or a call that waited
    would add to a stale total."""
    with _server(database_url, step_process=writer) as (_, stubs):
        w = start(stubs)
        steps = [w.model().step.id for _ in range(8)]
        usage = message_pb2.Usage(input_tokens=1, output_tokens=2, cost_usd=0.25)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda step_id: w.end(step_id, usage=usage), steps))
        run = get_run(stubs, w.run_id)
        [attempt] = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=w.run_id)).attempts
    for total in (run.usage, attempt.usage):
        assert (total.input_tokens, total.output_tokens, total.cost_usd) == (8, 16, 2.0)


def test_a_lost_fence_is_refused_with_nothing_written(stubs: Stubs) -> None:
    w = start(stubs)
    before = get_run(stubs, w.run_id)
    stale = message_pb2.Fence(attempt_id=w.attempt_id, lease_epoch=w.fence.lease_epoch + 1)
    expect(
        grpc.StatusCode.ABORTED,
        w.begin,
        fence=stale,
        type=E.STEP_TYPE_MODEL_CALL,
        model_call={},
        reason="LEASE_LOST",
    )
    after = get_run(stubs, w.run_id)
    assert (after.step_count, after.last_event_sequence) == (
        before.step_count,
        before.last_event_sequence,
    )
