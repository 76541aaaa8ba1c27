"""The step writer process, on both engines: it answers every BeginStep and EndStep with the
step engine's result (refusals included, the same as the server's own engine gives), writes
side by side with the server's own writer, and when it dies its calls fail UNAVAILABLE and
the server carries on alone until it restarts the process
(``test_step_process_supervision.py``: restarts under load). What is particular to an
engine: on SQLite what it remembers between its writes and the thread cursors; on PostgreSQL
its batches read ahead, commit all or nothing, and run a call the read-ahead cannot serve
right after, in a transaction of its own."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db import Database
from agentrt_base.db_engines import normalise_url, writer_lock_path
from agentrt_base.raw import Statement
from agentrt_core.errors import FailedPrecondition
from runtime_service.step_engine import StepEngine
from runtime_service.step_process import (
    BEGIN_STEP,
    COMMIT_UNKNOWN,
    END_STEP,
    StepProcess,
    _Zygote,
    child_database_url,
)
from runtime_service.step_writer import StepJobs, _commit
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    OK,
    T,
    Worker,
    acquire,
    digest_of,
    expect,
    get_run,
    get_step,
    list_steps,
    rpc_error,
    send,
    start,
)
from tests.support import ServerThread, error_details, serving


@contextlib.contextmanager
def _serving(url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with serving(url, step_process=True) as thread, Stubs.open(thread.address) as stubs:
        process = thread.server.step_process
        assert process is not None and process.alive
        yield process, stubs


@pytest.fixture
def server(database_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with _serving(database_url) as served:
        yield served


@pytest.fixture
def sqlite_server(sqlite_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with _serving(sqlite_url) as served:
        yield served


def verified(stubs: Stubs, run_id: str) -> bool:
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    return bool(audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id), timeout=T).intact)


def begin_request(w: Worker, key: str = "") -> wpb.BeginStepRequest:
    return wpb.BeginStepRequest(
        fence=w.fence,
        turn_id=w.turn_id,
        type=enum_pb2.STEP_TYPE_MODEL_CALL,
        idempotency_key=key,
        model_call=message_pb2.ModelCallSpec(),
    )


def end_request(w: Worker, step_id: str, status: Any = OK, tokens: int = 0) -> wpb.EndStepRequest:
    return wpb.EndStepRequest(
        fence=w.fence,
        step_id=step_id,
        status=status,
        usage=message_pb2.Usage(input_tokens=tokens, output_tokens=tokens // 2),
    )


class Writer:
    """The step writer's jobs driven here, in the test process, on the server's database:
    each :meth:`batch` is one batch as the child runs it (``step_writer._commit``), answered
    as the child answers it (the engine's result; None: the server is to take the call)."""

    def __init__(self, database_url: str) -> None:
        self.database = Database(
            child_database_url(normalise_url(database_url)),
            read_pool_size=1,
            writer_lock=True,
            group_commit=False,
        )
        self.jobs = StepJobs(self.database)
        self.conn: Any = self.database.write_engine.raw_connection()
        self._ids = itertools.count(1)

    def batch(self, *calls: tuple[int, Any]) -> list[Any]:
        answers, self.conn = _commit(
            self.database,
            self.database.write_engine.dialect,
            self.conn,
            self.jobs,
            [(next(self._ids), method, r.SerializeToString()) for method, r in calls],
            "@test",
        )
        return [answer for _, answer, _ in answers]

    def begin(self, w: Worker, key: str = "") -> Any:
        [begun] = self.batch((BEGIN_STEP, begin_request(w, key)))
        return begun

    def end(self, w: Worker, step_id: str, status: Any = OK) -> Any:
        [ended] = self.batch((END_STEP, end_request(w, step_id, status)))
        return ended

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.database.dispose()


@contextlib.contextmanager
def writer(database_url: str) -> Iterator[Writer]:
    opened = Writer(database_url)
    try:
        yield opened
    finally:
        opened.close()


def _reason(error: Any) -> str:
    """The ErrorInfo reason of an error the engine answered."""
    assert error is not None
    return str(error.reason)


def _refusals(stubs: Stubs, *, publish: bool) -> list[tuple[Any, ...]]:
    """Every way BeginStep and EndStep refuse a call, and a repeated key, on fresh runs; each
    outcome as a worker sees it: the code, the reason, the fields named, and the step a
    refusal the ledger keeps recorded (by sequence: ids differ from run to run)."""
    outcomes: list[tuple[Any, ...]] = []

    def refused(call: Callable[..., Any], *a: Any, **kw: Any) -> None:
        error = rpc_error(call, *a, **kw)
        details = error_details(error)
        info = details.get("ErrorInfo")
        bad = details.get("BadRequest")
        recorded: tuple[Any, ...] = ()
        if info is not None and info.metadata.get("step_id"):
            step = get_step(stubs, info.metadata["step_id"])
            recorded = (step.type, step.status, step.sequence, step.error_class, step.tool_name)
        outcomes.append(
            (
                error.code(),
                info.reason if info is not None else "",
                [v.field for v in bad.field_violations] if bad is not None else [],
                recorded,
            )
        )

    w = start(stubs, publish=publish)
    first = w.model("first")
    w.end(first.step.id, usage=message_pb2.Usage(input_tokens=3, output_tokens=1))
    again = w.model("first")
    outcomes.append(("repeated key", again.existing, again.step.sequence))

    # Refused as they are, before anything is read.
    refused(w.model, estimated_input_tokens=-1)
    refused(w.begin, type=enum_pb2.STEP_TYPE_MODEL_CALL)  # no model_call
    refused(w.begin, model_call=message_pb2.ModelCallSpec())  # no type
    refused(w.end, first.step.id, enum_pb2.STEP_STATUS_STARTED)
    # Refused on what was read: nothing recorded.
    stale = message_pb2.Fence(attempt_id=w.attempt_id, lease_epoch=w.fence.lease_epoch + 1)
    refused(
        w.begin,
        fence=stale,
        type=enum_pb2.STEP_TYPE_MODEL_CALL,
        model_call=message_pb2.ModelCallSpec(),
    )
    refused(
        w.begin,
        fence=message_pb2.Fence(),
        type=enum_pb2.STEP_TYPE_MODEL_CALL,
        model_call=message_pb2.ModelCallSpec(),
    )
    refused(w.model, input_ref=digest_of(b"never uploaded"))
    refused(w.model, retry_of_step_id="stp_none")
    refused(
        w.begin,
        type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="no-such-check"),
    )
    # Denials the ledger keeps: a step recorded DENIED (or FAILED), the error answered.
    refused(w.tool, "rm_rf", path="/")
    refused(w.tool, "run_tests")
    refused(w.tool, "read_file")  # its schema requires a path
    refused(w.model, skills=["no-such-skill"])
    # EndStep's refusals.
    open_step = w.model().step
    refused(w.end, "stp_none")
    refused(w.end, first.step.id, enum_pb2.STEP_STATUS_FAILED)
    refused(w.end, open_step.id, output_ref=digest_of(b"never uploaded"))
    refused(w.end, open_step.id, fence=stale)
    w.end(open_step.id)
    # A turn the server ended, then a run the worker ended (cancelled), a step still open.
    w.end_turn()
    refused(w.model)
    w.begin_turn()
    open_step = w.model().step
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id), timeout=T)
    w.finish(enum_pb2.ATTEMPT_OUTCOME_CANCELLED)
    refused(w.model)
    refused(w.end, open_step.id)
    outcomes.append(
        ("steps", [(s.type, s.status, s.sequence) for s in list_steps(stubs, w.run_id)])
    )

    # A budget used up: refused, and the run ends FAILED.
    b = start(stubs, publish=False, budget=message_pb2.Budget(max_steps=1))
    b.end(b.model().step.id)
    refused(b.model)
    run = get_run(stubs, b.run_id)
    outcomes.append(("budget", run.status, run.terminal_reason, run.step_count))
    assert verified(stubs, w.run_id) and verified(stubs, b.run_id)
    return outcomes


def test_it_answers_every_call_as_the_server_itself_would(
    database_url: str, server: tuple[StepProcess, Stubs]
) -> None:
    """Refusals (a malformed request, a lost fence, a turn not open, a missing blob, a
    denial the ledger keeps, a used-up budget, ...) and repeated keys are answered by the
    step writer, not handed back, with the same code, reason, fields and recorded steps as a
    server without one gives."""
    process, stubs = server
    w = start(stubs)
    begun = w.model("first", estimated_input_tokens=10)
    assert begun.resolved.model.model_id and begun.resolved.system_prompt_text
    w.end(begun.step.id, usage=message_pb2.Usage(input_tokens=3, output_tokens=1))
    assert (process.answered, process.handed_back) == (2, 0)

    with_process = _refusals(stubs, publish=False)
    # Every call reached the writer, which answered each one itself.
    assert process.alive and process.restarts == 0
    assert process.handed_back == 0 and process.answered > 2 + len(with_process)
    if database_url.startswith("sqlite"):
        assert Path(writer_lock_path(normalise_url(database_url)) or "").exists()

    in_process = ServerThread(database_url, step_process=False)
    in_process_stubs = Stubs.open(in_process.start())
    try:
        assert in_process.server.step_process is None
        alone = _refusals(in_process_stubs, publish=False)
    finally:
        in_process_stubs.close()
        in_process.stop()
    assert with_process == alone
    # What the scenario covers, so that the comparison cannot pass on an empty script.
    refusals = [o for o in with_process if isinstance(o[0], grpc.StatusCode)]
    reasons = {o[1] for o in refusals}
    assert {
        "LEASE_LOST",
        "TURN_NOT_OPEN",
        "BLOB_MISSING",
        "NOT_IN_DEFINITION",
        "TOOL_DENIED",
        "BUDGET_EXCEEDED",
        "STEP_ENDED",
    } <= reasons
    assert len([o for o in refusals if o[3]]) == 4  # the denials, each with its step


def test_it_writes_side_by_side_with_the_server(server: tuple[StepProcess, Stubs]) -> None:
    """Steps in the child while the server writes heartbeats, inputs and turns: every write
    lands, counters and sequences add up, and every chain verifies."""
    process, stubs = server
    workers = [start(stubs) for _ in range(4)]
    stop = threading.Event()

    def server_side_writes() -> int:
        done = 0
        while not stop.is_set():
            for w in workers:
                stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=w.fence), timeout=T)
                stubs.runtime.SendInput(
                    pb.SendInputRequest(
                        run_id=w.run_id, kind=enum_pb2.INPUT_KIND_FOLLOW_UP, content="later"
                    ),
                    timeout=T,
                )
                done += 1
        return done

    def steps(w: Worker) -> None:
        for i in range(15):
            step = w.model(f"k{i}").step
            w.end(step.id, usage=message_pb2.Usage(input_tokens=1, output_tokens=1))

    with ThreadPoolExecutor(5) as pool:
        background = pool.submit(server_side_writes)
        list(pool.map(steps, workers))
        stop.set()
        inputs = background.result()
    # (The child wrote the steps: otherwise this would test the server beside itself.)
    assert inputs > 0 and process.answered == 4 * 30
    for w in workers:
        run = get_run(stubs, w.run_id)
        assert (run.step_count, run.usage.input_tokens) == (15, 15)
        assert [s.sequence for s in list_steps(stubs, w.run_id)] == list(range(1, 16))
        assert verified(stubs, w.run_id)


def test_what_it_remembers_never_hides_a_change_the_server_made(
    server: tuple[StepProcess, Stubs],
) -> None:
    """The child answers from state it did not just read (``store/step_states.py``: on SQLite
    what it wrote last, on PostgreSQL what it read ahead for the batch); every write the
    server makes in between is seen (a steer, a closed turn, a lapsed lease), and what the
    child itself added counts (the step, token and cost budgets)."""
    process, stubs = server
    w = start(stubs, budget=message_pb2.Budget(max_steps=6))

    def step() -> None:
        begun = w.model()
        w.end(begun.step.id, usage=message_pb2.Usage(input_tokens=2, output_tokens=1))

    step()
    step()
    steer = send(stubs, w.run_id, enum_pb2.INPUT_KIND_STEER, "focus on the tests")
    delivered = w.model()
    assert [i.id for i in delivered.steer_inputs] == [steer.id]
    w.end(delivered.step.id, usage=message_pb2.Usage(input_tokens=2, output_tokens=1))
    step()
    ended_turn = w.turn_id
    w.end_turn()
    expect(grpc.StatusCode.FAILED_PRECONDITION, w.model, reason="TURN_NOT_OPEN")
    assert w.turn_id == ended_turn
    w.begin_turn()
    step()
    step()  # the sixth step: the budget allows it
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, w.model, reason="BUDGET_EXCEEDED")
    run = get_run(stubs, w.run_id)
    assert (run.step_count, run.usage.input_tokens, run.usage.output_tokens) == (6, 12, 6)
    assert [s.sequence for s in list_steps(stubs, w.run_id)] == list(range(1, 7))
    assert verified(stubs, w.run_id)
    assert process.handed_back == 0  # the child answered throughout, refusals too

    # The token and cost budgets count the usage the child added (3 tokens a step here).
    for budget in (message_pb2.Budget(max_model_tokens=9), message_pb2.Budget(max_cost_usd=0.3)):
        b = start(stubs, publish=False, budget=budget)
        for _ in range(3):
            begun = b.model()
            b.end(
                begun.step.id,
                usage=message_pb2.Usage(input_tokens=2, output_tokens=1, cost_usd=0.1),
            )
        expect(grpc.StatusCode.RESOURCE_EXHAUSTED, b.model, reason="BUDGET_EXCEEDED")

    # A lease that lapses while a step is open: neither the open step's end nor a new step
    # gets through, whatever the child remembers of the run.
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    lapsing = acquire(stubs, ttl=1.0)
    first = lapsing.model()
    lapsing.end(first.step.id)
    open_step = lapsing.model()
    time.sleep(1.2)
    expect(grpc.StatusCode.ABORTED, lapsing.model, reason="LEASE_LOST")
    expect(grpc.StatusCode.ABORTED, lapsing.end, open_step.step.id, reason="LEASE_LOST")
    assert verified(stubs, lapsing.run_id)


def test_its_next_answer_follows_what_another_connection_committed(
    server: tuple[StepProcess, Stubs], database_url: str
) -> None:
    """The step writer's jobs, driven here in the test process on the server's database, as
    a writer that has just written the run (on SQLite it answers the next call from that
    while no other connection commits): whatever the server commits meanwhile, behind its
    back, shows in its next answer. A steer is delivered; an ended turn refuses
    TURN_NOT_OPEN; a step the server ended cannot end again another way; a renewed lease
    holds past the expiry it first read; an attempt the worker finished loses its fence."""
    _, stubs = server
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    w = acquire(stubs, ttl=3.0)
    leased = time.monotonic()  # (the lease ends at most 3 s from here)
    with writer(database_url) as child:

        def step() -> Any:
            begun = child.begin(w)
            assert begun.error is None
            ended = child.end(w, begun.step.id)
            assert ended.error is None
            return begun

        step()
        steer = send(stubs, w.run_id, enum_pb2.INPUT_KIND_STEER, "stop and think")
        delivered = child.begin(w)
        assert [i.id for i in delivered.steers] == [steer.id]
        assert child.end(w, delivered.step.id).error is None

        # A heartbeat on the server's path: the lease now ends 3 s after it, which the
        # writer must read rather than keep the expiry it read at first.
        time.sleep(max(0.0, leased + 1.5 - time.monotonic()))
        stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=w.fence), timeout=T)
        time.sleep(max(0.0, leased + 3.2 - time.monotonic()))
        renewed = step()
        assert renewed.step.sequence == 3

        step()
        w.end_turn()
        assert _reason(child.begin(w).error) == "TURN_NOT_OPEN"
        w.begin_turn()

        open_step = child.begin(w).step
        w.end(open_step.id)  # through the server (and its own step writer)
        assert _reason(child.end(w, open_step.id, enum_pb2.STEP_STATUS_FAILED).error) == (
            "STEP_ENDED"
        )

        last = child.begin(w).step
        stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id), timeout=T)
        w.finish(enum_pb2.ATTEMPT_OUTCOME_CANCELLED)
        assert _reason(child.begin(w).error) == "LEASE_LOST"
        assert _reason(child.end(w, last.id).error) == "LEASE_LOST"
    steps = list_steps(stubs, w.run_id)
    assert [s.sequence for s in steps] == list(range(1, 7))
    assert [s.status for s in steps] == [OK] * 5 + [enum_pb2.STEP_STATUS_CANCELLED]
    assert get_run(stubs, w.run_id).step_count == 6
    assert verified(stubs, w.run_id)


def test_a_stale_workers_call_changes_nothing_for_the_current_one(
    server: tuple[StepProcess, Stubs], database_url: str
) -> None:
    """A worker whose attempt has ended still calls (it has not noticed): it is refused, and
    the run's current attempt goes on as before, its lease and usage its own. (The SQLite
    writer once kept the run as read for the stale call: the current worker then got
    LEASE_LOST for the old attempt's expiry, and the old attempt's usage in its own.)"""
    _, stubs = server
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    old = acquire(stubs, ttl=1.0)
    ended_at = time.monotonic() + 1.0  # (its lease ends before this)
    first = old.model().step
    old.end(first.id, usage=message_pb2.Usage(input_tokens=5, output_tokens=5))
    old.finish(enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    time.sleep(max(0.0, ended_at + 0.1 - time.monotonic()))
    current = acquire(stubs)
    assert current.run_id == old.run_id and current.attempt_id != old.attempt_id
    with writer(database_url) as child:
        begun = child.begin(current)
        assert begun.error is None and child.end(current, begun.step.id).error is None
        assert _reason(child.begin(old).error) == "LEASE_LOST"
        assert _reason(child.end(old, begun.step.id).error) == "LEASE_LOST"
        begun = child.begin(current)
        assert begun.error is None and begun.step.sequence == 3
        [ended] = child.batch((END_STEP, end_request(current, begun.step.id, tokens=4)))
        assert ended.error is None
    attempts = stubs.runtime.ListAttempts(
        pb.ListAttemptsRequest(run_id=current.run_id), timeout=T
    ).attempts
    usage = {a.id: (a.usage.input_tokens, a.usage.output_tokens) for a in attempts}
    assert usage == {old.attempt_id: (5, 5), current.attempt_id: (4, 2)}
    run = get_run(stubs, current.run_id)
    assert (run.step_count, run.usage.input_tokens, run.usage.output_tokens) == (3, 9, 7)
    assert verified(stubs, current.run_id)


@pytest.mark.parametrize("engine", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_postgres_batch_reads_ahead_then_writes_and_commits_at_once(
    server: tuple[StepProcess, Stubs], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the child reads every call's state in one round trip and sends every
    write with the commit in a second: calls on different runs in one batch commit together;
    a call on a run an earlier call of the batch wrote to (its state was read before that
    write) runs right after the batch, in a transaction of its own, and is answered all the
    same; a batch that fails anywhere leaves nothing behind; and one whose connection breaks
    after its COMMIT went out is never handed to the server."""
    _, stubs = server
    a, b = start(stubs), start(stubs, publish=False)
    child = Writer(database_url)
    jobs = child.jobs

    def begin(w: Worker, key: str = "") -> tuple[int, Any]:
        return BEGIN_STEP, begin_request(w, key)

    def end(w: Worker, begun: Any) -> tuple[int, Any]:
        return END_STEP, end_request(w, begun.step.id, tokens=5)

    try:
        first_a, first_b, again_a = child.batch(begin(a), begin(b), begin(a, "again"))
        assert [x.step.sequence for x in (first_a, first_b, again_a)] == [1, 1, 2]
        assert not any(x.error or x.existing for x in (first_a, first_b, again_a))
        # An EndStep and the next BeginStep of one run, in one batch.
        ended_a, third_a, ended_b = child.batch(end(a, first_a), begin(a, "third"), end(b, first_b))
        assert ended_a.step.status == ended_b.step.status == "SUCCEEDED"
        assert third_a.error is None and third_a.step.sequence == 3

        # A write that fails at the database, in the batch's last call: the whole batch is
        # rolled back and handed back, and the next batch runs on a fresh connection.
        run = jobs.run

        def failing(tx: Any, call: Any, engine: Any = None) -> Any:
            answer = run(tx, call, engine)
            if call is not None and call.req.idempotency_key == "fails":
                tx.execute(Statement("SELECT 1 / 0"), {})
            return answer

        monkeypatch.setattr(jobs, "run", failing)
        assert child.batch(begin(a), begin(b, "fails")) == [None, None]
        assert child.conn is not None

        # The same while the database cannot be reached (restarting): no new connection
        # opens, the server takes this batch's and the next batch's calls, and once the
        # database is back the next batch connects again.
        def refuse() -> Any:
            raise sa.exc.OperationalError("connect", {}, Exception("connection refused"))

        monkeypatch.setattr(child.database.write_engine, "raw_connection", refuse)
        assert child.batch(begin(a), begin(b, "fails")) == [None, None]
        assert child.conn is None
        monkeypatch.setattr(jobs, "run", run)
        assert child.batch(begin(a)) == [None]
        assert child.conn is None
        monkeypatch.undo()
        fourth_a, second_b = child.batch(begin(a), begin(b))
        assert (fourth_a.step.sequence, second_b.step.sequence) == (4, 2)

        # The connection breaks after the COMMIT went out: the calls that wrote may be
        # committed, so they are answered COMMIT_UNKNOWN (the server answers UNAVAILABLE and
        # never writes them again); a refusal, which wrote nothing, keeps its answer; the
        # call left for after the batch, which never ran, still goes to the server.
        driver = child.conn.driver_connection
        commit = driver.commit

        def commit_on_a_dead_connection() -> None:
            with contextlib.closing(
                psycopg.connect(
                    normalise_url(database_url)
                    .set(drivername="postgresql")
                    .render_as_string(hide_password=False)
                )
            ) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (driver.pgconn.backend_pid,))
            commit()

        driver.commit = commit_on_a_dead_connection
        stale = begin_request(b)
        stale.fence.lease_epoch += 1
        lost, refused, later = child.batch(begin(a, "lost"), (BEGIN_STEP, stale), begin(a, "again"))
        assert (lost, later) == (COMMIT_UNKNOWN, None)
        assert refused.error is not None and refused.error.reason == "LEASE_LOST"
        assert child.conn is not None and child.conn.driver_connection is not driver
        assert child.begin(b, "after").step.sequence == 3  # on the new connection
    finally:
        child.close()
    # (The database never saw the "lost" step's COMMIT: the backend was gone before it.)
    for w, steps in ((a, 4), (b, 3)):
        assert [s.status for s in list_steps(stubs, w.run_id)] == [
            enum_pb2.STEP_STATUS_SUCCEEDED,
            *[enum_pb2.STEP_STATUS_STARTED] * (steps - 1),
        ]
        run_ = get_run(stubs, w.run_id)
        assert (run_.step_count, run_.usage.input_tokens) == (steps, 5)
        assert verified(stubs, w.run_id)


def test_calls_on_one_run_that_share_a_batch_are_all_answered_in_order(
    server: tuple[StepProcess, Stubs],
) -> None:
    """An EndStep and the next steps of the same run, sent together, reach the step writer
    as one batch (it is stopped while the server forwards them). On PostgreSQL the batch
    read every call's state ahead, before the first call wrote, so the calls after it on that
    run go in a transaction of their own after the batch; on SQLite they follow the first in
    the same transaction. Either way the writer answers all of them, and the run reads as if
    they had come one at a time: consecutive sequences, every total, an intact chain."""
    process, stubs = server
    w, other = start(stubs), start(stubs, publish=False)
    first = w.model("first")
    answered, handed_back = process.answered, process.handed_back
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        calls = [
            stubs.worker.EndStep.future(end_request(w, first.step.id, tokens=8), timeout=T),
            stubs.worker.BeginStep.future(begin_request(w, "second"), timeout=T),
            stubs.worker.BeginStep.future(begin_request(other, "other"), timeout=T),
            stubs.worker.BeginStep.future(begin_request(w, "third"), timeout=T),
        ]
        # Time for the server to forward all four: the stopped child reads them in one go
        # when it goes on. (Were the machine too slow for that, they would make smaller
        # batches and this would still check the outcome; the batch itself is checked
        # deterministically in test_a_postgres_batch_reads_ahead_then_writes_and_commits_at_once.)
        time.sleep(0.5)
        assert not any(call.done() for call in calls)
    finally:
        os.kill(pid, signal.SIGCONT)
    ended, second, elsewhere, third = [call.result() for call in calls]
    assert ended.step.status == OK and ended.step.usage.input_tokens == 8
    assert sorted((second.step.sequence, third.step.sequence)) == [2, 3]
    assert elsewhere.step.sequence == 1
    assert (process.answered, process.handed_back) == (answered + 4, handed_back)
    steps = list_steps(stubs, w.run_id)
    assert [s.sequence for s in steps] == [1, 2, 3]
    assert {s.id: s.sequence for s in steps} == {
        first.step.id: 1,
        second.step.id: second.step.sequence,
        third.step.id: third.step.sequence,
    }
    run = get_run(stubs, w.run_id)
    assert (run.step_count, run.usage.input_tokens, run.usage.output_tokens) == (3, 8, 4)
    assert verified(stubs, w.run_id) and verified(stubs, other.run_id)


def test_thread_cursors_grow_in_commit_order_across_both_writers(
    sqlite_server: tuple[StepProcess, Stubs], sqlite_url: str
) -> None:
    """On SQLite an event's thread cursor is its position in the event table (events.py), for
    the server's events and the child's step events alike; on a file whose cursors were
    handed out by the thread counters before, they keep growing."""
    process, stubs = sqlite_server
    w = start(stubs)
    thread_id = w.acquired.run.thread_id
    path = normalise_url(sqlite_url).database
    assert path is not None
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        # What the thread counter would have handed out: 1, 2, 3 ... per thread.
        db.execute(
            "UPDATE runtime_events SET thread_cursor = -thread_cursor WHERE thread_id = ?",
            (thread_id,),
        )
        db.execute(
            "UPDATE runtime_events SET thread_cursor = (SELECT count(*) FROM runtime_events e"
            " WHERE e.thread_id = runtime_events.thread_id AND e.rowid <= runtime_events.rowid)"
            " WHERE thread_id = ?",
            (thread_id,),
        )
    for i in range(3):
        step = w.model().step
        stubs.runtime.AppendMessage(
            pb.AppendMessageRequest(
                thread_id=thread_id, role=enum_pb2.MESSAGE_ROLE_USER, content=f"note {i}"
            ),
            timeout=T,
        )
        w.end(step.id)
    assert process.answered == 6
    with contextlib.closing(sqlite3.connect(path)) as db:
        cursors = [
            c
            for (c,) in db.execute(
                "SELECT thread_cursor FROM runtime_events WHERE thread_id = ? ORDER BY rowid",
                (thread_id,),
            )
        ]
    assert len(cursors) > 9 and cursors == sorted(set(cursors))
    replayed = stubs.runtime.WatchThread(pb.WatchThreadRequest(thread_id=thread_id), timeout=T)
    assert [int(next(replayed).cursor) for _ in cursors] == cursors
    replayed.cancel()


def test_when_it_dies_its_calls_fail_unavailable_and_the_server_carries_on(
    server: tuple[StepProcess, Stubs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls the child held fail UNAVAILABLE; until a new child is up (here its starts
    fail, fewer and fewer of them: backoff) the server takes every call; then the new child
    takes them again."""
    process, stubs = server
    w = start(stubs)
    pid = process.pid
    assert pid is not None
    starts: list[float] = []

    def cannot_start(*args: Any) -> int:
        starts.append(time.monotonic())
        raise RuntimeError("no step writer for this test")

    monkeypatch.setattr(_Zygote, "fork", cannot_start)
    os.kill(pid, signal.SIGSTOP)  # the call reaches the child, which never answers it
    try:
        call = stubs.worker.BeginStep.future(
            wpb.BeginStepRequest(
                fence=w.fence,
                turn_id=w.turn_id,
                type=enum_pb2.STEP_TYPE_MODEL_CALL,
                idempotency_key="in-flight",
                model_call=message_pb2.ModelCallSpec(),
            ),
            timeout=T,
        )
        time.sleep(0.3)
        assert not call.done()
    finally:
        os.kill(pid, signal.SIGKILL)
    died = time.monotonic()
    error = call.exception()
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details(error)["ErrorInfo"].reason == "STEP_WRITER_STOPPED"
    deadline = time.monotonic() + 5
    while process.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.alive

    # The retry (same key) is taken by the server itself, records the step once, and the
    # run goes on without the child meanwhile.
    answered = process.answered
    retried = w.model("in-flight")
    assert not retried.existing
    w.end(retried.step.id)
    later = w.model("next")
    w.end(later.step.id)
    assert process.answered == answered
    time.sleep(max(0.0, died + 2.0 - time.monotonic()))
    # Starts 0.1 s after the death, then 0.2, 0.4, 0.8 s apart: four in two seconds, not a
    # spin (the machine being slow only spaces them further).
    assert 2 <= len(starts) <= 5, starts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0.9 * 0.2 * 2**i for i, gap in enumerate(gaps)), gaps
    assert process.failed_starts == len(starts) and process.restarts == 0

    monkeypatch.undo()
    deadline = time.monotonic() + 20
    while not process.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.alive and process.pid not in (None, pid) and process.restarts == 1
    again = w.model("after")
    w.end(again.step.id)
    assert process.answered == answered + 2  # the new child's
    assert [s.sequence for s in list_steps(stubs, w.run_id)] == [1, 2, 3]
    assert verified(stubs, w.run_id)


def test_it_is_not_started_when_switched_off(database_url: str) -> None:
    thread = ServerThread(database_url, step_process=False)
    thread.start()
    try:
        assert thread.server.step_process is None
    finally:
        thread.stop()


def test_a_refusal_is_an_answer_and_not_a_failure_in_its_log(
    stubs: Stubs,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal (here NO_MODEL_CANDIDATE: no candidate of the policy admits the context) is
    the call's answer, whether the engine returns it or raises it (having begun to write):
    the writer answers it, keeps the rest of its batch, and logs nothing of it (no "a batch
    of step writes failed", no traceback)."""
    w = start(stubs)
    closed = begin_request(w, "closed")
    closed.turn_id = "trn_not_open"  # refused by the engine's rules: returned, not raised
    caplog.set_level(logging.DEBUG, logger="agentrt")
    original = StepEngine.begin

    def begin(engine: StepEngine, tx: Any, req: Any) -> Any:
        if req.idempotency_key == "raised":
            # Written, then refused: the refusal must roll back what was written.
            original(engine, tx, dataclasses.replace(req, idempotency_key="written-then-refused"))
            raise FailedPrecondition("no candidate left", reason="NO_MODEL_CANDIDATE")
        return original(engine, tx, req)

    # Every engine of the writer (on PostgreSQL a second call on a run runs on its own).
    monkeypatch.setattr(StepEngine, "begin", begin)
    with writer(database_url) as wr:
        first, refused, second, not_open = wr.batch(
            (BEGIN_STEP, begin_request(w, "a")),
            (BEGIN_STEP, begin_request(w, "raised")),
            (BEGIN_STEP, begin_request(w, "b")),
            (BEGIN_STEP, closed),
        )
    assert first is not None and first.error is None
    assert second is not None and second.error is None
    assert refused is not None and _reason(refused.error) == "NO_MODEL_CANDIDATE"
    assert not_open is not None and _reason(not_open.error) == "TURN_NOT_OPEN"
    assert [s.idempotency_key for s in list_steps(stubs, w.run_id)] == ["a", "b"]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
