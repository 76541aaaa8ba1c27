"""Stateful property test of the run lifecycle through real gRPC.

A hypothesis ``RuleBasedStateMachine`` drives random sequences of client, worker and reaper
operations against an in-process server, keeps a model of what each run must look like (the
lifecycle of ``docs/lifecycle.md``), and after every step reads everything back over gRPC
(ListRuns, ListAttempts, WatchRun) to check:

- every run is exactly as the model predicts (status, terminal reason, stop flags, attempts,
  input revision, the live fence and its epoch); from the run rows, the fencing epoch and the
  ENQUEUE block too;
- a terminal status is final, and an ended attempt never changes again;
- at most one ACTIVE attempt per run, present exactly while the run is RUNNING, and it is the
  run's ``current_attempt_id``; attempt numbers are 1..N with N = ``attempt_count``;
- the run's events are sequences 1..N without gaps, each ``prev_hash`` is the previous
  ``hash``, each hash recomputes from the event as received (``event_chain.event_hash`` over the
  proto3 JSON mapping of the attributes, which is exactly the stored form), the
  ``attempt.started``/``attempt.ended``/``run.ended`` counts agree with the attempts and the
  status, a WatchRun resumed after the last seen sequence delivers exactly the later events
  (and closes by itself on an ended run), and a full replay still matches what was seen;
- a refused call (and a repeated FinishAttempt, or a no-op cancel or pause) changes nothing:
  every stored column of the example's thread, runs, attempts and events reads back equal.

Time is simulated, not waited for: the reaper's background loop is parked (a one-hour
interval) and the test calls ``LeasesService.reap_once`` itself after moving a lease expiry, a
stop deadline or a run deadline into the past with a direct UPDATE through the server's own
``Database.write_sync``. Waiting for a real expiry (the shortest lease is 1 s, the stop grace
10 s) would make each step take seconds and race the background reaper; the UPDATE makes the
moment of expiry exact and the outcome deterministic.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import json_format
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import message_pb2 as registry_message_pb2
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core import event_chain
from runtime_service import server as server_module
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.servicers.worker import WorkerServicer
from runtime_service.store.tables import AttemptRow, EventRow, RunRow, ThreadRow
from tests import registry_data
from tests.runtime_support import Stubs
from tests.support import ServerThread, error_details

QUEUED, RUNNING, WAITING, PAUSED = "QUEUED", "RUNNING", "WAITING_APPROVAL", "PAUSED"
COMPLETED, FAILED, CANCELLED, TIMED_OUT = "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"
TERMINAL = {COMPLETED, FAILED, CANCELLED, TIMED_OUT}
ACTIVE = {QUEUED, RUNNING, WAITING, PAUSED}
OUTCOMES = (
    "SUCCEEDED_COMPLETE_RUN",
    "FAILED_RETRYABLE",
    "FAILED_PERMANENT",
    "CANCELLED",
    "PAUSED",
)
#: The attempt status each FinishAttempt outcome leaves (runtime_service/services/leases.py).
OUTCOME_STATUS = {
    "SUCCEEDED_COMPLETE_RUN": "SUCCEEDED",
    "FAILED_RETRYABLE": "FAILED",
    "FAILED_PERMANENT": "FAILED",
    "CANCELLED": "CANCELLED",
    "PAUSED": "PAUSED",
}
POLICIES = ("REJECT", "ENQUEUE", "INTERRUPT", "ALLOW", "ALLOW")
CLIENT_CALLS = ("cancel", "pause", "pause", "resume", "amend", "amend_stale")
LONG = dt.timedelta(hours=1)
AGENT_ID = "prop_agent"
PICK = st.integers(min_value=0, max_value=10_000)


def _name(enum: Any, prefix: str, value: int) -> str:
    """``RUN_STATUS_QUEUED`` → ``QUEUED``; "" for UNSPECIFIED."""
    return "" if value == 0 else str(enum.Name(value)).removeprefix(prefix)


def _past() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)


# -- the server --------------------------------------------------------------------------------


@dataclass
class Harness:
    """A real server, stubs to it, and the server's own LeasesService (for the reaper)."""

    thread: ServerThread
    stubs: Stubs
    leases: Any

    def reap(self) -> int:
        loop = self.thread._loop  # the server's event loop: reap_once wakes its waiters there
        return int(asyncio.run_coroutine_threadsafe(self.leases.reap_once(), loop).result(30))

    def read(self, fn: Callable[[Any], Any]) -> Any:
        database = self.thread.server.database
        assert database is not None
        return database.read_sync(fn)

    def update(self, statement: sa.Update) -> None:
        """Change rows directly, as time passing would (see the module docstring)."""
        database = self.thread.server.database
        assert database is not None
        database.write_sync(lambda session: session.execute(statement))


@pytest.fixture
def harness(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    # Keep a reference to the WorkerServicer the production composition builds, to reach its
    # LeasesService; the class is replaced only for this server's start.
    built: list[Any] = []

    class Recording(WorkerServicer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(server_module, "WorkerServicer", Recording)
    runtime_settings = RuntimeSettings(
        reaper_interval=3600.0,  # parked: the test calls reap_once itself
        stop_grace=LONG,  # stop deadlines pass only when the test says so
        max_lease_ttl=LONG,
    )
    thread = ServerThread(database_url, runtime_settings)
    address = thread.start()
    stubs = Stubs.open(address)
    try:
        assert len(built) == 1
        registry_data.publish_all(stubs.registry, [registry_data.model_policy()])
        stubs.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(
                definition=registry_message_pb2.AgentDefinition(
                    agent_id=AGENT_ID,
                    version_label="v1",
                    system_prompt=registry_message_pb2.SystemPrompt(text="Be brief."),
                    model_policy="coding-balanced@3",
                )
            ),
            timeout=10,
        )
        yield Harness(thread, stubs, built[0].leases)
    finally:
        stubs.close()
        thread.stop()


# -- the model ---------------------------------------------------------------------------------


@dataclass
class ModelRun:
    id: str
    order: int
    priority: int
    max_attempts: int
    status: str = QUEUED
    terminal_reason: str = ""
    attempts: int = 0
    epoch: int = 0
    cancel: bool = False
    pause: bool = False
    interrupt: bool = False
    blocked_by: str = ""
    next_reason: str = "INITIAL"
    fence: message_pb2.Fence | None = None
    input_revision: int = 1


@dataclass
class EndedFence:
    fence: message_pb2.Fence
    run_id: str
    status: str
    #: The FinishAttempt outcome that ended the attempt; "" when the runtime ended it.
    outcome: str = ""


@dataclass
class Seen:
    """What the checks have already read of one run (to prove nothing rewrites history)."""

    run: bytes = b""
    hashes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    terminal: str = ""
    ended_attempts: dict[str, bytes] = field(default_factory=dict)


class Refused(Exception):
    def __init__(self, error: grpc.RpcError) -> None:
        super().__init__(error.details())
        self.code = error.code()
        info = error_details(error).get("ErrorInfo")
        self.reason = info.reason if info is not None else ""


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except grpc.RpcError as error:
        raise Refused(error) from error


def _event_type(event: Any) -> str:
    return _name(enum_pb2.EventType, "EVENT_TYPE_", event.event_type).lower()


def recomputed_hash(event: Any) -> str:
    """The event's hash from the event as a watcher receives it (docs/lifecycle.md §8)."""
    snake = _event_type(event)
    member = f"{snake}_attributes"
    assert event.WhichOneof("attributes") == member, (event.WhichOneof("attributes"), snake)
    head, _, tail = snake.partition("_")
    return event_chain.event_hash(
        event_id=event.id,
        thread_id=event.thread_id,
        run_id=event.run_id,
        sequence=event.sequence,
        event_type=f"{head}.{tail}",
        event_time=event_chain.format_time(event.event_time.ToDatetime(tzinfo=dt.UTC)),
        attributes=json_format.MessageToDict(
            getattr(event, member), preserving_proto_field_name=True
        ),
        prev_hash=event.prev_hash,
    )


class LifecycleMachine(RuleBasedStateMachine):
    harness: Harness  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.s = self.harness.stubs
        self.label = uuid.uuid4().hex
        self.thread_id = self.s.thread(policy=enum_pb2.CONCURRENCY_POLICY_ALLOW).id
        self.runs: list[ModelRun] = []
        self.ended: list[EndedFence] = []
        self.seen: dict[str, Seen] = {}
        #: Runs whose deadline this test moved with an UPDATE (VerifyRun rightly names it).
        self.moved_deadlines: set[str] = set()

    # -- reading -----------------------------------------------------------------------------

    def attempts(self, run_id: str) -> list[Any]:
        return list(
            self.s.runtime.ListAttempts(
                pb.ListAttemptsRequest(run_id=run_id, page_size=1000), timeout=10
            ).attempts
        )

    def snapshot(self) -> tuple[list[tuple[Any, ...]], ...]:
        """Every stored column of the example's thread, runs, attempts and events.

        Read from the database rather than over gRPC: it is one query per table instead of a
        call per run, and it also covers what the API does not show (lease epochs, stop
        deadlines, blocked_by, the event rows themselves)."""
        thread_id = self.thread_id

        def read(session: Any) -> tuple[list[tuple[Any, ...]], ...]:
            def rows(table: Any, *where: Any) -> list[tuple[Any, ...]]:
                stmt = sa.select(table).where(*where).order_by(*table.primary_key.columns)
                return [tuple(row) for row in session.execute(stmt)]

            runs = rows(RunRow.__table__, RunRow.thread_id == thread_id)
            run_ids = [
                row.id
                for row in session.scalars(sa.select(RunRow).where(RunRow.thread_id == thread_id))
            ]
            return (
                rows(ThreadRow.__table__, ThreadRow.id == thread_id),
                runs,
                rows(AttemptRow.__table__, AttemptRow.run_id.in_(run_ids)),
                rows(EventRow.__table__, EventRow.thread_id == thread_id),
            )

        snapshot: tuple[list[tuple[Any, ...]], ...] = self.harness.read(read)
        return snapshot

    def refused(self, fn: Callable[[], Any], code: grpc.StatusCode, reason: str) -> None:
        """``fn`` is refused with ``code``/``reason`` and changes nothing."""
        before = self.snapshot()
        with pytest.raises(Refused) as raised:
            _call(fn)
        assert (raised.value.code, raised.value.reason) == (code, reason), raised.value
        assert self.snapshot() == before, "a refused call changed something"

    def pick(self, index: int, statuses: set[str] | None = None) -> ModelRun:
        pool = [r for r in self.runs if statuses is None or r.status in statuses]
        return pool[index % len(pool)]

    def has(self, *statuses: str) -> bool:
        return any(r.status in statuses for r in self.runs)

    # -- the model's transitions -------------------------------------------------------------

    def move(self, run: ModelRun, target: str, reason: str = "", next_reason: str = "") -> None:
        run.status = target
        if target != RUNNING:
            run.cancel = run.pause = run.interrupt = False
        if target == QUEUED and next_reason and run.attempts:
            run.next_reason = next_reason
        if target in TERMINAL:
            run.terminal_reason = reason
            # A waiter is released only when no other earlier run of the thread is active;
            # otherwise it now waits for the newest such run.
            for waiter in [r for r in self.runs if r.blocked_by == run.id]:
                earlier = [
                    r
                    for r in self.runs
                    if r.id not in (run.id, waiter.id)
                    and r.status in ACTIVE
                    and r.order < waiter.order
                ]
                waiter.blocked_by = earlier[-1].id if earlier else ""

    def end_attempt(self, run: ModelRun, status: str, *, bump: bool, outcome: str = "") -> None:
        assert run.fence is not None
        self.ended.append(EndedFence(run.fence, run.id, status, outcome))
        run.fence = None
        if bump:
            run.epoch += 1

    def forced_stop(self, run: ModelRun) -> None:
        """The reaper ends a run asked to stop (grace over, or its lease expired)."""
        if run.pause:
            self.end_attempt(run, "PAUSED", bump=True)
            self.move(run, PAUSED)
        else:
            self.end_attempt(run, "CANCELLED", bump=True)
            reason = "INTERRUPTED_BY_NEW_RUN" if run.interrupt else "CANCELLED_BY_USER"
            self.move(run, CANCELLED, reason)

    @initialize(max_attempts=st.sampled_from((1, 1, 2, 3)), acquire=st.booleans())
    def first_run(self, max_attempts: int, acquire: bool) -> None:
        """Most examples start with a run already held by a worker: the interesting part."""
        self.create_run("ALLOW", max_attempts, 0)
        if acquire:
            self.acquire()

    # -- client rules ------------------------------------------------------------------------

    @precondition(
        lambda self: len(self.runs) < 8 and sum(r.status in ACTIVE for r in self.runs) < 3
    )
    @rule(
        policy=st.sampled_from(POLICIES),
        max_attempts=st.integers(min_value=1, max_value=3),
        priority=st.integers(min_value=-1, max_value=1),
    )
    def create_run(self, policy: str, max_attempts: int, priority: int) -> None:
        request = pb.CreateRunRequest(
            thread_id=self.thread_id,
            agent_ref=f"{AGENT_ID}@v1",
            goal=message_pb2.Goal(objective="hold the invariants"),
            max_attempts=max_attempts,
            priority=priority,
            concurrency_policy=enum_pb2.ConcurrencyPolicy.Value(f"CONCURRENCY_POLICY_{policy}"),
            labels={"example": self.label},
        )
        active = [r for r in self.runs if r.status in ACTIVE]
        if policy == "REJECT" and active:
            self.refused(
                lambda: self.s.runtime.CreateRun(request, timeout=10),
                grpc.StatusCode.FAILED_PRECONDITION,
                "THREAD_BUSY",
            )
            return
        created = self.s.runtime.CreateRun(request, timeout=10).run
        run = ModelRun(created.id, len(self.runs), priority, max_attempts)
        if active and policy == "ENQUEUE":
            run.blocked_by = active[-1].id
        if active and policy == "INTERRUPT":
            for other in active:
                if other.status == RUNNING:
                    other.cancel, other.pause, other.interrupt = True, False, True
                    run.blocked_by = other.id
                else:
                    self.move(other, CANCELLED, "INTERRUPTED_BY_NEW_RUN")
        self.runs.append(run)

    @precondition(lambda self: self.runs)
    @rule(op=st.sampled_from(CLIENT_CALLS), index=PICK)
    def client_call(self, op: str, index: int) -> None:
        """CancelRun, PauseRun, ResumeRun or AmendRun (with a right or a stale revision) on a
        run, mostly an active one."""
        run = self.pick(index // 2, ACTIVE if index % 2 and self.has(*ACTIVE) else None)
        if op == "amend_stale":
            self.amend(run, stale_revision=True)
        elif op == "amend":
            self.amend(run, stale_revision=False)
        else:
            getattr(self, op)(run)

    @precondition(lambda self: self.has(RUNNING))
    @rule(op=st.sampled_from(("cancel", "cancel", "pause", "pause", "resume")), index=PICK)
    def client_call_on_running_run(self, op: str, index: int) -> None:
        """The same calls on a RUNNING run: they set or clear a stop request."""
        getattr(self, op)(self.pick(index, {RUNNING}))

    def cancel(self, run: ModelRun) -> None:
        request = pb.CancelRunRequest(run_id=run.id, reason="stop", actor="prop")
        if run.status in TERMINAL - {CANCELLED}:
            self.refused(
                lambda: self.s.runtime.CancelRun(request, timeout=10),
                grpc.StatusCode.FAILED_PRECONDITION,
                "RUN_ENDED",
            )
            return
        if run.status == CANCELLED or (run.status == RUNNING and run.cancel):
            before = self.snapshot()
            self.s.runtime.CancelRun(request, timeout=10)
            assert self.snapshot() == before, (
                "cancelling a cancelled (or cancelling) run changed it"
            )
            return
        self.s.runtime.CancelRun(request, timeout=10)
        if run.status == RUNNING:
            run.cancel, run.pause, run.interrupt = True, False, False
        else:
            self.move(run, CANCELLED, "CANCELLED_BY_USER")

    def pause(self, run: ModelRun) -> None:
        request = pb.PauseRunRequest(run_id=run.id, reason="hold", actor="prop")
        if run.status == PAUSED or (run.status == RUNNING and run.pause):
            before = self.snapshot()
            self.s.runtime.PauseRun(request, timeout=10)
            assert self.snapshot() == before, "pausing a paused (or pausing) run changed it"
        elif run.status == RUNNING and not run.cancel:
            self.s.runtime.PauseRun(request, timeout=10)
            run.pause = True
        elif run.status == QUEUED:
            self.s.runtime.PauseRun(request, timeout=10)
            self.move(run, PAUSED)
        else:
            self.refused(
                lambda: self.s.runtime.PauseRun(request, timeout=10),
                grpc.StatusCode.FAILED_PRECONDITION,
                "RUN_ENDED" if run.status in TERMINAL else "ILLEGAL_TRANSITION",
            )

    def resume(self, run: ModelRun) -> None:
        request = pb.ResumeRunRequest(run_id=run.id, reason="go on", actor="prop")
        if run.status == RUNNING and run.pause:
            self.s.runtime.ResumeRun(request, timeout=10)
            run.pause = False
        elif run.status == PAUSED:
            self.s.runtime.ResumeRun(request, timeout=10)
            self.move(run, QUEUED, next_reason="RESUMED_AFTER_PAUSE")
        else:
            self.refused(
                lambda: self.s.runtime.ResumeRun(request, timeout=10),
                grpc.StatusCode.FAILED_PRECONDITION,
                "RUN_ENDED" if run.status in TERMINAL else "ILLEGAL_TRANSITION",
            )

    def amend(self, run: ModelRun, stale_revision: bool) -> None:
        expected = run.input_revision + 1 if stale_revision else run.input_revision
        request = pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(added_constraints=["stay small"]),
            expected_input_revision=expected,
            actor="prop",
        )
        if run.status in TERMINAL:
            self.refused(
                lambda: self.s.runtime.AmendRun(request, timeout=10),
                grpc.StatusCode.FAILED_PRECONDITION,
                "RUN_ENDED",
            )
        elif stale_revision:
            self.refused(
                lambda: self.s.runtime.AmendRun(request, timeout=10),
                grpc.StatusCode.ABORTED,
                "REVISION_MISMATCH",
            )
        else:
            got = self.s.runtime.AmendRun(request, timeout=10).run
            run.input_revision += 1
            assert got.input_revision == run.input_revision
            assert list(got.amendments[-1].added_constraints) == ["stay small"]

    # -- worker rules ------------------------------------------------------------------------

    @precondition(lambda self: self.runs)
    @rule()
    def acquire(self) -> None:
        eligible = [r for r in self.runs if r.status == QUEUED and not r.blocked_by]
        got = self.s.acquire(
            worker="w-prop",
            wait=0.0,
            ttl=600.0,
            filter=message_pb2.AcquireFilter(labels={"example": self.label}),
        )
        if not eligible:
            assert not got.HasField("run"), "acquired a run that is not eligible"
            return
        run = max(eligible, key=lambda r: (r.priority, -r.order))
        assert got.run.id == run.id, "not the highest-priority, oldest eligible run"
        run.attempts += 1
        run.epoch += 1
        assert got.attempt.number == run.attempts
        assert _name(enum_pb2.AttemptReason, "ATTEMPT_REASON_", got.attempt.reason) == (
            run.next_reason
        )
        assert (got.fence.attempt_id, got.fence.lease_epoch) == (got.attempt.id, run.epoch)
        run.fence = got.fence
        self.move(run, RUNNING)

    @precondition(lambda self: self.has(RUNNING))
    @rule(index=PICK)
    def heartbeat(self, index: int) -> None:
        run = self.pick(index, {RUNNING})
        beat = self.s.worker.Heartbeat(wpb.HeartbeatRequest(fence=run.fence), timeout=10)
        assert (beat.cancel_requested, beat.pause_requested) == (run.cancel, run.pause)
        assert beat.input_revision == run.input_revision

    @precondition(lambda self: self.has(RUNNING))
    @rule(index=PICK, outcome=st.sampled_from((*OUTCOMES, "ACK", "ACK")))
    def finish(self, index: int, outcome: str) -> None:
        """FinishAttempt with an outcome; ACK acknowledges the stop asked for, if any."""
        run = self.pick(index, {RUNNING})
        if outcome == "ACK":
            outcome = "CANCELLED" if run.cancel else "PAUSED" if run.pause else "FAILED_RETRYABLE"
        fence = run.fence
        assert fence is not None
        if outcome == "FAILED_RETRYABLE" and (run.cancel or run.pause):
            # A retryable failure while a stop is pending stops the run as asked (re-queueing
            # it would undo the cancel); the attempt itself FAILED.
            done = self.finish_call(fence, outcome)
            self.end_attempt(run, "FAILED", bump=False, outcome=outcome)
            if run.pause:
                self.move(run, PAUSED)
            else:
                reason = "INTERRUPTED_BY_NEW_RUN" if run.interrupt else "CANCELLED_BY_USER"
                self.move(run, CANCELLED, reason)
            assert _name(enum_pb2.RunStatus, "RUN_STATUS_", done.run.status) == run.status
            assert _name(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", done.attempt.status) == "FAILED"
            return
        if (outcome == "CANCELLED" and not run.cancel) or (outcome == "PAUSED" and not run.pause):
            self.refused(
                lambda: self.finish_call(fence, outcome),
                grpc.StatusCode.FAILED_PRECONDITION,
                "NO_STOP_REQUESTED",
            )
            return
        done = self.finish_call(fence, outcome)
        self.end_attempt(run, OUTCOME_STATUS[outcome], bump=False, outcome=outcome)
        if outcome == "SUCCEEDED_COMPLETE_RUN":
            self.move(run, COMPLETED, "COMPLETED_BY_WORKER")
        elif outcome == "FAILED_PERMANENT":
            self.move(run, FAILED, "WORKER_REPORTED_FAILURE")
        elif outcome == "FAILED_RETRYABLE" and run.attempts < run.max_attempts:
            self.move(run, QUEUED, next_reason="RETRY_AFTER_ERROR")
        elif outcome == "FAILED_RETRYABLE":
            self.move(run, FAILED, "ATTEMPTS_EXHAUSTED")
        elif outcome == "CANCELLED":
            reason = "INTERRUPTED_BY_NEW_RUN" if run.interrupt else "CANCELLED_BY_USER"
            self.move(run, CANCELLED, reason)
        else:
            self.move(run, PAUSED)
        assert _name(enum_pb2.RunStatus, "RUN_STATUS_", done.run.status) == run.status
        assert (
            _name(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", done.attempt.status)
            == (OUTCOME_STATUS[outcome])
        )

    def finish_call(self, fence: message_pb2.Fence, outcome: str) -> Any:
        """FinishAttempt as this worker sends it: always a summary, an error when failing."""
        error = (
            message_pb2.AttemptError(error_class=enum_pb2.ERROR_CLASS_PROVIDER_ERROR, message="x")
            if outcome.startswith("FAILED")
            else None
        )
        return self.s.finish(
            fence,
            enum_pb2.AttemptOutcome.Value(f"ATTEMPT_OUTCOME_{outcome}"),
            result_summary="done",
            error=error,
        )

    @precondition(lambda self: self.ended or self.has(RUNNING))
    @rule(index=PICK, outcome=st.sampled_from((None, *OUTCOMES)), forged=st.booleans())
    def stale_fence_write(self, index: int, outcome: str | None, forged: bool) -> None:
        """A write with a fence that is no longer current is refused and changes nothing;
        repeating the FinishAttempt that ended an attempt answers again and changes nothing."""
        replay = False
        if (forged and self.has(RUNNING)) or not self.ended:
            run = self.pick(index, {RUNNING})
            assert run.fence is not None
            fence = message_pb2.Fence(
                attempt_id=run.fence.attempt_id, lease_epoch=run.fence.lease_epoch + 1
            )
        else:
            ended = self.ended[index % len(self.ended)]
            fence = ended.fence
            # Only the very FinishAttempt that ended the attempt is answered again.
            replay = outcome is not None and outcome == ended.outcome
        if outcome is None:

            def call() -> Any:
                return self.s.worker.Heartbeat(wpb.HeartbeatRequest(fence=fence), timeout=10)
        else:
            finish_outcome = outcome

            def call() -> Any:
                return self.finish_call(fence, finish_outcome)

        if replay:
            before = self.snapshot()
            again = call()
            assert again.attempt.id == fence.attempt_id
            assert self.snapshot() == before, "a repeated FinishAttempt changed something"
        else:
            self.refused(call, grpc.StatusCode.ABORTED, "LEASE_LOST")

    # -- time passing (the reaper) -----------------------------------------------------------

    @precondition(lambda self: self.has(*ACTIVE))
    @rule(kind=st.sampled_from(("lease", "stop", "stop", "deadline")), index=PICK)
    def time_passes(self, kind: str, index: int) -> None:
        """A lease expires, a stop's grace period ends, or a run's deadline passes; then the
        reaper runs."""
        stopping = [r for r in self.runs if r.status == RUNNING and (r.cancel or r.pause)]
        if kind == "deadline":
            self.deadline_passes(self.pick(index, ACTIVE))
        elif kind == "stop" and stopping:
            self.stop_grace_passes(stopping[index % len(stopping)])
        elif self.has(RUNNING):
            self.lease_expires(self.pick(index, {RUNNING}))

    def lease_expires(self, run: ModelRun) -> None:
        assert run.fence is not None
        fence = run.fence
        self.harness.update(
            sa.update(AttemptRow)
            .where(AttemptRow.id == fence.attempt_id)
            .values(lease_expire_time=_past())
        )
        # Expired but not yet reaped: the worker's writes already bounce.
        self.refused(
            lambda: self.s.worker.Heartbeat(wpb.HeartbeatRequest(fence=fence), timeout=10),
            grpc.StatusCode.ABORTED,
            "LEASE_LOST",
        )
        assert self.harness.reap() == 1
        if run.cancel or run.pause:
            self.forced_stop(run)
        elif run.attempts < run.max_attempts:
            self.end_attempt(run, "LOST", bump=True)
            self.move(run, QUEUED, next_reason="WORKER_LOST")
        else:
            self.end_attempt(run, "LOST", bump=True)
            self.move(run, FAILED, "ATTEMPTS_EXHAUSTED")

    def stop_grace_passes(self, run: ModelRun) -> None:
        self.harness.update(
            sa.update(RunRow).where(RunRow.id == run.id).values(stop_deadline_time=_past())
        )
        assert self.harness.reap() == 1
        self.forced_stop(run)

    def deadline_passes(self, run: ModelRun) -> None:
        self.moved_deadlines.add(run.id)
        self.harness.update(
            sa.update(RunRow).where(RunRow.id == run.id).values(deadline_time=_past())
        )
        assert self.harness.reap() == 1
        if run.status == RUNNING:
            self.end_attempt(run, "CANCELLED", bump=True)
        self.move(run, TIMED_OUT, "DEADLINE_EXCEEDED")

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def fencing_state_matches_the_model(self) -> None:
        """What the API does not show, read from the run rows: the fencing epoch (grown at
        every acquisition and whenever the runtime ends an attempt) and the ENQUEUE block."""
        thread_id = self.thread_id

        def read(session: Any) -> dict[str, tuple[int, str]]:
            rows = session.execute(
                sa.select(RunRow.id, RunRow.lease_epoch, RunRow.blocked_by_run_id).where(
                    RunRow.thread_id == thread_id
                )
            )
            return {row.id: (row.lease_epoch, row.blocked_by_run_id) for row in rows}

        stored = self.harness.read(read)
        assert stored == {m.id: (m.epoch, m.blocked_by) for m in self.runs}

    @invariant()
    def runs_match_the_model(self) -> None:
        listed = {
            run.id: run
            for run in self.s.runtime.ListRuns(
                pb.ListRunsRequest(thread_id=self.thread_id, page_size=1000), timeout=10
            ).runs
        }
        assert set(listed) == {m.id for m in self.runs}
        for model in self.runs:
            run = listed[model.id]
            status = _name(enum_pb2.RunStatus, "RUN_STATUS_", run.status)
            seen = self.seen.setdefault(model.id, Seen())
            if seen.terminal:
                assert status == seen.terminal, f"terminal {seen.terminal} became {status}"
            if status in TERMINAL:
                seen.terminal = seen.terminal or status
            assert status == model.status, (model.id, status, model)
            reason = _name(enum_pb2.TerminalReason, "TERMINAL_REASON_", run.terminal_reason)
            assert reason == model.terminal_reason
            assert (run.cancel_requested, run.pause_requested) == (model.cancel, model.pause)
            assert run.attempt_count == model.attempts
            assert run.input_revision == model.input_revision
            assert run.HasField("end_time") == (status in TERMINAL)
            # Attempts end and events are appended only in transactions that also write the
            # run row (update_time, last_event_sequence): an unchanged run needs no re-read.
            blob = run.SerializeToString(deterministic=True)
            if blob != seen.run:
                seen.run = blob
                self.check_attempts(model, run, seen)
                self.check_events(model, run, seen)

    def check_attempts(self, model: ModelRun, run: Any, seen: Seen) -> None:
        attempts = self.attempts(model.id)
        assert [a.number for a in attempts] == list(range(1, run.attempt_count + 1))
        active = [a for a in attempts if a.status == enum_pb2.ATTEMPT_STATUS_ACTIVE]
        assert len(active) <= 1, "more than one ACTIVE attempt"
        if model.status == RUNNING:
            assert model.fence is not None and len(active) == 1
            assert active[0].id == run.current_attempt_id == model.fence.attempt_id
            assert active[0].lease_epoch == model.fence.lease_epoch == model.epoch
        else:
            assert not active and not run.current_attempt_id
        expected_ended = {e.fence.attempt_id: e.status for e in self.ended if e.run_id == model.id}
        assert len(expected_ended) == len(attempts) - len(active)
        for attempt in attempts:
            if attempt.status == enum_pb2.ATTEMPT_STATUS_ACTIVE:
                continue
            status = _name(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", attempt.status)
            assert status == expected_ended[attempt.id], (attempt.id, status)
            assert attempt.HasField("end_time")
            blob = attempt.SerializeToString(deterministic=True)
            assert seen.ended_attempts.setdefault(attempt.id, blob) == blob, "ended attempt moved"

    def check_events(self, model: ModelRun, run: Any, seen: Seen) -> None:
        """Resume the run's watch after the last sequence seen: exactly the later events
        arrive, each links to the previous hash and recomputes; an ended run's stream closes
        by itself after run.ended (at once when nothing is new)."""
        after = len(seen.hashes)
        request = pb.WatchRunRequest(run_id=model.id, after_sequence=after)
        terminal = model.status in TERMINAL
        received: list[Any] = []
        if terminal:
            received = [r.event for r in self.s.runtime.WatchRun(request, timeout=10)]
        elif run.last_event_sequence > after:
            stream = self.s.runtime.WatchRun(request, timeout=10)
            for response in stream:
                received.append(response.event)
                if response.event.sequence >= run.last_event_sequence:
                    break
            stream.cancel()
        assert [e.sequence for e in received] == list(
            range(after + 1, run.last_event_sequence + 1)
        ), "the replay after the last seen sequence is not exactly the later events"
        for event in received:
            assert (event.run_id, event.thread_id) == (model.id, self.thread_id)
            assert event.prev_hash == (seen.hashes[-1] if seen.hashes else "")
            assert event.hash == recomputed_hash(event), f"event {event.sequence} does not hash"
            seen.hashes.append(event.hash)
            kind = _event_type(event)
            seen.counts[kind] = seen.counts.get(kind, 0) + 1
            assert kind != "run_ended" or event.sequence == run.last_event_sequence
        assert seen.counts["run_created"] == 1
        assert seen.counts.get("attempt_started", 0) == run.attempt_count
        ended = sum(1 for e in self.ended if e.run_id == model.id)
        assert seen.counts.get("attempt_ended", 0) == ended
        assert seen.counts.get("run_ended", 0) == (1 if terminal else 0)

    def full_replay_is_unchanged(self) -> None:
        """Every run's whole chain replays exactly as it was seen, step by step."""
        for model in self.runs:
            hashes = self.seen.get(model.id, Seen()).hashes
            stream = self.s.runtime.WatchRun(pb.WatchRunRequest(run_id=model.id), timeout=10)
            replayed: list[str] = []
            for response in stream:
                replayed.append(response.event.hash)
                if len(replayed) == len(hashes):
                    break
            stream.cancel()
            assert replayed == hashes, "a stored event changed after it was first read"

    def rows_agree_with_the_chain(self) -> None:
        """VerifyRun finds every served row of every run (attempts lost, resumed, cancelled,
        paused, amended …) exactly as its events committed it (docs/audit.md)."""
        audit = audit_service_pb2_grpc.AuditServiceStub(self.s.channel)
        for model in self.runs:
            report = audit.VerifyRun(apb.VerifyRunRequest(run_id=model.id), timeout=10)
            # Simulated time is a tampered row: the one field the test itself rewrote.
            moved = (
                {("run", model.id, "deadline_time")} if model.id in self.moved_deadlines else set()
            )
            assert {(m.kind, m.id, m.field) for m in report.row_mismatches} == moved
            assert not report.HasField("first_break") and report.intact == (not moved)
            assert report.rows_checked >= 1 + len(self.attempts(model.id))

    def teardown(self) -> None:
        """End what is still active, so later examples acquire only their own runs."""
        self.full_replay_is_unchanged()
        self.rows_agree_with_the_chain()
        for model in self.runs:
            if model.status in TERMINAL:
                continue
            if model.status == RUNNING and model.fence is not None:
                self.s.worker.FinishAttempt(
                    wpb.FinishAttemptRequest(
                        fence=model.fence, outcome=enum_pb2.ATTEMPT_OUTCOME_FAILED_PERMANENT
                    ),
                    timeout=10,
                )
            else:
                self.s.runtime.CancelRun(pb.CancelRunRequest(run_id=model.id), timeout=10)
        self.rows_agree_with_the_chain()


def test_lifecycle_properties(harness: Harness, engine: str) -> None:
    LifecycleMachine.harness = harness
    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(
            # PostgreSQL commits cost ~3x SQLite's here: fewer examples keep both under 60 s.
            max_examples=40 if engine == "sqlite" else 15,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )


# -- known bugs, pinned (strict: each fails loudly once fixed, so the marker gets removed) -------


def _run(stubs: Stubs, label: str) -> Any:
    thread = stubs.thread()
    return stubs.runtime.CreateRun(
        pb.CreateRunRequest(
            thread_id=thread.id,
            agent_ref=f"{AGENT_ID}@v1",
            goal=message_pb2.Goal(objective="pinned"),
            labels={"pool": label},
        ),
        timeout=10,
    ).run


def _acquire(stubs: Stubs, label: str) -> Any:
    return stubs.acquire(wait=0.0, filter=message_pb2.AcquireFilter(labels={"pool": label}))


def test_a_retryable_failure_does_not_undo_a_requested_cancel(harness: Harness) -> None:
    s = harness.stubs
    run = _run(s, "a")
    got = _acquire(s, "a")
    s.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)
    done = s.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    assert done.run.status == enum_pb2.RUN_STATUS_CANCELLED


def test_a_different_outcome_after_the_attempt_ended_is_lease_lost(harness: Harness) -> None:
    s = harness.stubs
    _run(s, "b")
    got = _acquire(s, "b")
    s.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    with pytest.raises(Refused) as raised:
        _call(lambda: s.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_FAILED_PERMANENT))
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.ABORTED, "LEASE_LOST")


def test_a_label_filter_finds_a_matching_run_behind_twenty_others(harness: Harness) -> None:
    s = harness.stubs
    for _ in range(20):
        _run(s, "cpu")
    wanted = _run(s, "gpu")
    assert _acquire(s, "gpu").run.id == wanted.id
