"""BeginStep and EndStep have two ways to write: plain SQL for the common case
(``CommonPath``), run in the server or, on SQLite, in the step writer process, and the ORM
for everything else. The same script run each way must store the same steps, usages, events
and counters, in the same stored form, with an intact event chain; and the common case must
really take the fast way."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.db import normalise_url
from runtime_service.services.steps import CommonPath
from tests.runtime_support import Stubs
from tests.service.steps_support import digest_of, get_run, list_steps, put_blob, start
from tests.support import ServerThread

#: Columns whose values necessarily differ between two runs (their ids and clocks).
_VARYING = {"id", "run_id", "attempt_id", "turn_id", "step_id", "start_time", "end_time"}
_STORED_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")


@pytest.fixture
def stubs(server_address: str) -> Iterator[Stubs]:
    s = Stubs.open(server_address)
    yield s
    s.close()


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
    """A server that writes every step itself (no step writer process), so the tests can
    watch or switch off its common path."""
    with _server(database_url, step_process=False) as (_, stubs):
        yield stubs


def _script(stubs: Stubs, *, publish: bool) -> str:
    """Every kind of step the common path takes, ended every way it takes."""
    w = start(stubs, publish=publish)
    output = put_blob(stubs, b"the model's answer").blob.digest
    model = w.model(
        "plan",
        operation="plan",
        input_ref=output,
        estimated_input_tokens=40,
        skills=["repo-debug"],
        tools=["read_file", "apply_patch"],
        context_digest=digest_of(b"context"),
    )
    w.end(
        model.step.id,
        output_ref=output,
        summary="planned",
        usage=message_pb2.Usage(input_tokens=30, output_tokens=7, cost_usd=0.25),
        reported_model_id="claude-sonnet-4-20250514",
    )
    tool = w.tool("read_file", key="read", path="src/app.py")
    w.end(
        tool.step.id,
        enum_pb2.STEP_STATUS_FAILED,
        error_class=enum_pb2.ERROR_CLASS_TOOL_ERROR,
        error_message="no such file",
        retryable=True,
        side_effect=True,
    )
    w.check("tests-pass")
    plain = w.model()
    w.end(plain.step.id, enum_pb2.STEP_STATUS_CANCELLED)
    return w.run_id


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
            # The step events (the others, such as run.created, carry the run's own clock).
            events = rows(
                "SELECT event_type, sequence, attributes_json FROM runtime_events"
                " WHERE run_id = :r AND event_type LIKE 'step.%' ORDER BY sequence"
            )
            [run] = rows(
                "SELECT step_count, last_step_sequence, input_tokens, output_tokens, cost_usd,"
                " last_event_sequence FROM runtime_runs WHERE id = :r"
            )
            [attempt] = rows(
                "SELECT input_tokens, output_tokens, cost_usd FROM runtime_attempts"
                " WHERE run_id = :r"
            )
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
        return text

    return {
        "steps": [{k: v for k, v in s.items() if k not in _VARYING} for s in steps],
        "usages": [{k: v for k, v in u.items() if k not in _VARYING} for u in usages],
        # Compared as documents: a Struct's keys (model parameters) come out of protobuf in an
        # order that differs between processes (upb seeds its map hashing per process), and
        # the event hash is taken over the canonical form, so the order is not part of it.
        "events": [
            {**e, "attributes_json": json.loads(named(e["attributes_json"]))} for e in events
        ],
        "run": run,
        "attempt": attempt,
        "stored_times": stored_times,
    }


def test_the_common_path_stores_exactly_what_the_orm_path_stores(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[str] = []
    begin, end = CommonPath.begin, CommonPath.end

    def spy_begin(self: CommonPath, *a: Any) -> Any:
        result = begin(self, *a)
        taken.append("begin" if result is not None else "begin: ORM")
        return result

    def spy_end(self: CommonPath, *a: Any) -> Any:
        result = end(self, *a)
        taken.append("end" if result is not None else "end: ORM")
        return result

    runs: dict[str, str] = {}
    with _server(database_url, step_process=False) as (_, stubs):
        monkeypatch.setattr(CommonPath, "begin", spy_begin)
        monkeypatch.setattr(CommonPath, "end", spy_end)
        runs["common path in the server"] = _script(stubs, publish=True)
        assert taken == ["begin", "end"] * 4

        monkeypatch.setattr(CommonPath, "begin", lambda *a: None)
        monkeypatch.setattr(CommonPath, "end", lambda *a: None)
        runs["ORM"] = _script(stubs, publish=False)
        monkeypatch.undo()
    with _server(database_url, step_process=True) as (thread, stubs):
        runs["step writer process"] = _script(stubs, publish=False)
        process = thread.server.step_process
        assert process is not None and (process.answered, process.handed_back) == (8, 0)

    stored = {way: _stored(database_url, run_id) for way, run_id in runs.items()}
    orm = stored["ORM"]
    for way, fast in stored.items():
        for part in ("steps", "usages", "events", "run", "attempt"):
            assert fast[part] == orm[part], (way, part)
        assert len(fast["steps"]) == 4 and len(fast["usages"]) == 11 and len(fast["events"]) == 8
        # Times are stored as SQLAlchemy stores them, so all paths' rows sort and compare alike.
        for value in fast["stored_times"]:
            assert value is None or _STORED_TIME.match(value), (way, value)

    with _server(database_url, step_process=False) as (_, stubs):
        audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
        for run_id in runs.values():
            verified = audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id))
            assert verified.intact and verified.event_count == orm["run"]["last_event_sequence"]


def test_concurrent_repeats_of_a_step_call_record_it_once(stubs: Stubs) -> None:
    """Retries racing each other (a worker that timed out and called again) on the common
    path: one step, begun once, ended once, its usage counted once, on both engines."""
    w = start(stubs)
    with ThreadPoolExecutor(8) as pool:
        begun = list(pool.map(lambda _: w.model("same-key"), range(8)))
    assert len({b.step.id for b in begun}) == 1
    assert sum(not b.existing for b in begun) == 1
    step_id = begun[0].step.id
    usage = message_pb2.Usage(input_tokens=5, output_tokens=2, cost_usd=0.5)
    with ThreadPoolExecutor(8) as pool:
        ended = list(pool.map(lambda _: w.end(step_id, usage=usage), range(8)))
    assert {e.status for e in ended} == {enum_pb2.STEP_STATUS_SUCCEEDED}
    run = get_run(stubs, w.run_id)
    assert (run.usage.input_tokens, run.usage.output_tokens, run.step_count) == (5, 2, 1)
    assert [s.id for s in list_steps(stubs, w.run_id)] == [step_id]


def test_the_orm_path_adds_concurrent_usage_to_the_attempt_without_losing_any(
    in_process: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parallel EndSteps of one attempt on the ORM path (the plain-SQL path switched off):
    each adds its usage to the attempt it read under the run's lock. On PostgreSQL that read
    must come after the lock, or a call that waited would add to a stale total."""
    monkeypatch.setattr(CommonPath, "end", lambda *a: None)
    stubs = in_process
    w = start(stubs)
    steps = [w.model().step.id for _ in range(8)]
    usage = message_pb2.Usage(input_tokens=1, output_tokens=2, cost_usd=0.25)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda step_id: w.end(step_id, usage=usage), steps))
    run = get_run(stubs, w.run_id)
    [attempt] = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=w.run_id)).attempts
    for total in (run.usage, attempt.usage):
        assert (total.input_tokens, total.output_tokens, total.cost_usd) == (8, 16, 2.0)
