"""The step writer process, on both engines: it takes BeginStep and EndStep's common case,
hands everything else back to the server, writes side by side with the server's own writer,
and when it dies its calls fail UNAVAILABLE and the server carries on alone until it restarts
the process (``test_step_process_supervision.py``: restarts under load). What is
particular to an engine: on SQLite what it remembers between its writes and the thread
cursors; on PostgreSQL its batches read ahead and commit all or nothing."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
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
from agentrt_base.db import Database, normalise_url, writer_lock_path
from agentrt_base.raw import Statement
from runtime_service.step_process import (
    BEGIN_STEP,
    COMMIT_UNKNOWN,
    END_STEP,
    StepJobs,
    StepProcess,
    _commit,
    _Zygote,
    child_database_url,
)
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    T,
    Worker,
    acquire,
    expect,
    get_run,
    list_steps,
    send,
    start,
)
from tests.support import ServerThread, error_details


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentrt.db'}"


@contextlib.contextmanager
def _serving(url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    thread = ServerThread(url)
    stubs = Stubs.open(thread.start())
    process = thread.server.step_process
    assert process is not None and process.alive
    try:
        yield process, stubs
    finally:
        stubs.close()
        thread.stop()


@pytest.fixture
def server(database_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with _serving(database_url) as served:
        yield served


@pytest.fixture
def sqlite_server(sqlite_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with _serving(sqlite_url) as served:
        yield served


def test_it_takes_the_common_case_and_hands_back_everything_else(
    server: tuple[StepProcess, Stubs], database_url: str
) -> None:
    process, stubs = server
    w = start(stubs)
    begun = w.model("first", estimated_input_tokens=10)
    w.end(begun.step.id, usage=message_pb2.Usage(input_tokens=3, output_tokens=1))
    assert (process.answered, process.handed_back) == (2, 0)
    assert begun.resolved.model.model_id and begun.resolved.system_prompt_text

    # A repeated key, a tool outside the definition (recorded as denied), a malformed
    # request, an EndStep of an ended step: all answered by the server, as without the child.
    again = w.model("first")
    assert again.existing and again.step.id == begun.step.id
    expect(grpc.StatusCode.PERMISSION_DENIED, w.tool, "rm_rf", path="/")
    details = expect(grpc.StatusCode.INVALID_ARGUMENT, w.model, estimated_input_tokens=-1)
    assert [v.field for v in details["BadRequest"].field_violations] == [
        "model_call.estimated_input_tokens"
    ]
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        w.end,
        begun.step.id,
        enum_pb2.STEP_STATUS_FAILED,
        reason="STEP_ENDED",
    )
    assert (process.answered, process.handed_back) == (2, 4)
    steps = list_steps(stubs, w.run_id)
    assert [s.status for s in steps] == [
        enum_pb2.STEP_STATUS_SUCCEEDED,
        enum_pb2.STEP_STATUS_DENIED,
    ]
    assert [s.sequence for s in steps] == [1, 2]  # one gap-free sequence across both writers
    if database_url.startswith("sqlite"):
        assert Path(writer_lock_path(normalise_url(database_url)) or "").exists()


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
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, w.model)
    run = get_run(stubs, w.run_id)
    assert (run.step_count, run.usage.input_tokens, run.usage.output_tokens) == (6, 12, 6)
    assert [s.sequence for s in list_steps(stubs, w.run_id)] == list(range(1, 7))
    assert verified(stubs, w.run_id)
    assert process.answered >= 10  # the child took the common case throughout

    # The token and cost budgets count the usage the child added (3 tokens a step here).
    for budget in (message_pb2.Budget(max_model_tokens=9), message_pb2.Budget(max_cost_usd=0.3)):
        b = start(stubs, publish=False, budget=budget)
        for _ in range(3):
            begun = b.model()
            b.end(
                begun.step.id,
                usage=message_pb2.Usage(input_tokens=2, output_tokens=1, cost_usd=0.1),
            )
        expect(grpc.StatusCode.RESOURCE_EXHAUSTED, b.model)

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


def test_it_reads_the_database_again_once_another_connection_commits(
    sqlite_server: tuple[StepProcess, Stubs], sqlite_url: str
) -> None:
    """The step writer's jobs, driven here in the test process on the server's database:
    a run's next step is answered from memory while only this writer commits, and read
    again after the server commits anything (SQLite)."""
    _, stubs = sqlite_server
    w = start(stubs)
    database = Database(
        child_database_url(normalise_url(sqlite_url)),
        read_pool_size=1,
        writer_lock=True,
        group_commit=False,
    )
    jobs = StepJobs(database)
    dialect = database.write_engine.dialect
    conn = database.write_engine.raw_connection()
    requests = iter(range(1, 1000))

    def call(method: int, request: Any) -> Any:
        nonlocal conn
        answers, conn = _commit(
            database, dialect, conn, jobs, [(next(requests), method, request.SerializeToString())]
        )
        return answers[0][1]

    def begin() -> Any:
        return call(
            BEGIN_STEP,
            wpb.BeginStepRequest(
                fence=w.fence,
                turn_id=w.turn_id,
                type=enum_pb2.STEP_TYPE_MODEL_CALL,
                model_call=message_pb2.ModelCallSpec(),
            ),
        )

    def end(begun: Any) -> Any:
        step_id = begun[0][0]
        return call(
            END_STEP,
            wpb.EndStepRequest(
                fence=w.fence, step_id=step_id, status=enum_pb2.STEP_STATUS_SUCCEEDED
            ),
        )

    try:
        first = begin()
        assert first is not None and end(first) is not None
        assert (jobs.states.hits, jobs.states.misses) == (1, 1)  # the end was remembered
        second = begin()
        assert second is not None and end(second) is not None
        assert (jobs.states.hits, jobs.states.misses) == (3, 1)
        send(stubs, w.run_id, enum_pb2.INPUT_KIND_STEER, "stop and think")
        assert begin() is None  # a steer waits: the server takes the call
        assert jobs.states.misses == 2
        assert [s.sequence for s in list_steps(stubs, w.run_id)] == [1, 2]
        assert get_run(stubs, w.run_id).step_count == 2
        assert verified(stubs, w.run_id)
    finally:
        conn.close()
        database.dispose()


@pytest.mark.parametrize("engine", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_postgres_batch_reads_ahead_then_writes_and_commits_at_once(
    server: tuple[StepProcess, Stubs], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the child reads every call's state in one round trip and sends every
    write with the commit in a second: calls on different runs in one batch commit together,
    a second call on a run an earlier call of the batch wrote to is handed back (its state
    was read before that write), a batch that fails anywhere leaves nothing behind, and one
    whose connection breaks after its COMMIT went out is never handed to the server."""
    _, stubs = server
    a, b = start(stubs), start(stubs, publish=False)
    database = Database(database_url, read_pool_size=1, group_commit=False)
    jobs = StepJobs(database)
    dialect = database.write_engine.dialect
    conn = database.write_engine.raw_connection()
    jobs_ids = iter(range(1, 1000))

    def batch(*calls: tuple[int, Any]) -> list[Any]:
        nonlocal conn
        answers, conn = _commit(
            database,
            dialect,
            conn,
            jobs,
            [(next(jobs_ids), method, r.SerializeToString()) for method, r in calls],
            "@test",
        )
        return [answer for _, answer, _ in answers]

    def begin(w: Worker, key: str = "") -> tuple[int, Any]:
        return BEGIN_STEP, wpb.BeginStepRequest(
            fence=w.fence,
            turn_id=w.turn_id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key=key,
            model_call=message_pb2.ModelCallSpec(),
        )

    def end(w: Worker, begun: Any) -> tuple[int, Any]:
        return END_STEP, wpb.EndStepRequest(
            fence=w.fence,
            step_id=begun[0][0],
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            usage=message_pb2.Usage(input_tokens=5, output_tokens=2),
        )

    try:
        first_a, first_b, again_a = batch(begin(a), begin(b), begin(a, "again"))
        assert first_a is not None and first_b is not None
        assert again_a is None  # a's state was read before first_a's write: the server's
        ended = batch(end(a, first_a), end(b, first_b))
        assert all(answer is not None for answer in ended)

        # A write that fails at the database, in the batch's last call: the whole batch is
        # rolled back and handed back, and the next batch runs on a fresh connection.
        run = jobs.run

        def failing(tx: Any, call: Any) -> Any:
            answer = run(tx, call)
            if call is not None and call.req.idempotency_key == "fails":
                tx.execute(Statement("SELECT 1 / 0"), {})
            return answer

        monkeypatch.setattr(jobs, "run", failing)
        assert batch(begin(a), begin(b, "fails")) == [None, None]
        assert conn is not None

        # The same while the database cannot be reached (restarting): no new connection
        # opens, the server takes this batch's and the next batch's calls, and once the
        # database is back the next batch connects again.
        def refuse() -> Any:
            raise sa.exc.OperationalError("connect", {}, Exception("connection refused"))

        monkeypatch.setattr(database.write_engine, "raw_connection", refuse)
        assert batch(begin(a), begin(b, "fails")) == [None, None]
        assert conn is None
        monkeypatch.setattr(jobs, "run", run)
        assert batch(begin(a)) == [None]
        assert conn is None
        monkeypatch.undo()
        assert all(answer is not None for answer in batch(begin(a), begin(b)))

        # The connection breaks after the COMMIT went out: the calls that wrote may be
        # committed, so they are answered COMMIT_UNKNOWN (the server answers UNAVAILABLE and
        # never writes them again); a call that wrote nothing still goes to the server.
        assert conn is not None
        driver = conn.driver_connection
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
        assert batch(begin(a, "lost"), begin(a, "again")) == [COMMIT_UNKNOWN, None]
        assert conn is not None and conn.driver_connection is not driver
        assert batch(begin(b, "after"))[0] is not None  # on the new connection
    finally:
        if conn is not None:
            conn.close()
        database.dispose()
    # (The database never saw the "lost" step's COMMIT: the backend was gone before it.)
    for w, steps in ((a, 2), (b, 3)):
        assert [s.status for s in list_steps(stubs, w.run_id)] == [
            enum_pb2.STEP_STATUS_SUCCEEDED,
            *[enum_pb2.STEP_STATUS_STARTED] * (steps - 1),
        ]
        run_ = get_run(stubs, w.run_id)
        assert (run_.step_count, run_.usage.input_tokens) == (steps, 5)
        assert verified(stubs, w.run_id)


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


def verified(stubs: Stubs, run_id: str) -> bool:
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    return bool(audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id), timeout=T).intact)


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
