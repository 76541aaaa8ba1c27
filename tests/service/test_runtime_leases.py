"""Attempts, leases, fencing, the reaper, cancel and pause, through real gRPC on both engines.

Expiry is tested with short settings (1 s leases, a 0.1 s reaper, a 0.5 s stop grace).
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from runtime_service.runtime_settings import RuntimeSettings
from tests.runtime_support import PLAIN, Stubs, get_run, in_seconds
from tests.support import error_details, rpc_error, running_server

# The `stubs` fixture (tests/conftest.py) publishes plain_agent:prod first; `fast` and
# `unreaped` do the same on servers of their own settings.
pytestmark = pytest.mark.plain_agent

E = enum_pb2
COMPLETE = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN
FAST = RuntimeSettings(reaper_interval=0.1, stop_grace=dt.timedelta(seconds=0.5))
#: No reaper pass after the first: an expired lease stays un-reaped.
NO_REAPER = RuntimeSettings(reaper_interval=3600)


def open_stubs(database_url: str, settings: RuntimeSettings) -> Iterator[Stubs]:
    with running_server(database_url, settings) as address, Stubs.open(address) as s:
        s.publish_plain_agent()
        yield s


@pytest.fixture
def fast(database_url: str) -> Iterator[Stubs]:
    yield from open_stubs(database_url, FAST)


def attempts(stubs: Stubs, run_id: str) -> list[message_pb2.Attempt]:
    return list(
        stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run_id), timeout=10).attempts
    )


def new_run(stubs: Stubs, **kwargs: Any) -> message_pb2.Run:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    return stubs.run(thread.id, ref=PLAIN, **kwargs)


def heartbeat(stubs: Stubs, fence: message_pb2.Fence) -> wpb.HeartbeatResponse:
    return stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=fence), timeout=10)


def wait_for(check: Callable[[], bool], timeout: float = 6.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def event_count(database_url: str) -> int:
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT COUNT(*) FROM runtime_events").scalar_one())
    finally:
        engine.dispose()


def assert_lease_lost(
    stubs: Stubs, database_url: str, run_id: str, call: Callable[[], Any]
) -> None:
    """``call`` is refused ABORTED / LEASE_LOST and changes nothing."""
    before, events = get_run(stubs, run_id), event_count(database_url)
    before_attempts = attempts(stubs, run_id)
    error = rpc_error(call)
    assert error.code() == grpc.StatusCode.ABORTED, error.details()
    info = error_details(error)["ErrorInfo"]
    assert info.reason == "LEASE_LOST" and info.domain == "agentrt"
    assert get_run(stubs, run_id) == before
    assert attempts(stubs, run_id) == before_attempts
    assert event_count(database_url) == events


# -- acquiring -------------------------------------------------------------------------------


def test_acquire_long_polls_until_a_run_is_created(stubs: Stubs) -> None:
    started = time.monotonic()
    empty = stubs.acquire(wait=0.5)
    waited = time.monotonic() - started
    assert not empty.HasField("run") and not empty.HasField("attempt")
    assert 0.4 <= waited < 3

    result: dict[str, Any] = {}

    def poll() -> None:
        result["response"] = stubs.acquire("poller", wait=10)
        result["at"] = time.monotonic()

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    assert "response" not in result
    created_at = time.monotonic()
    run = new_run(stubs)  # through another client's call
    poller.join(10)
    got = result["response"]
    assert got.run.id == run.id
    assert result["at"] - created_at < 2  # woken, not waiting out its 10 s
    assert got.attempt.number == 1
    assert got.attempt.reason == E.ATTEMPT_REASON_INITIAL
    assert got.attempt.worker_id == "poller"
    assert got.attempt.status == E.ATTEMPT_STATUS_ACTIVE
    assert got.fence.attempt_id == got.attempt.id
    assert got.fence.lease_epoch == got.attempt.lease_epoch > 0
    assert got.run.status == E.RUN_STATUS_RUNNING
    assert got.run.current_attempt_id == got.attempt.id
    assert got.agent.agent_digest == run.agent.agent_digest
    assert not got.HasField("resume_from")


def test_acquire_hands_out_highest_priority_then_oldest(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    low = stubs.run(thread.id, ref=PLAIN, priority=-3)
    first_high = stubs.run(thread.id, ref=PLAIN, priority=5)
    mid = stubs.run(thread.id, ref=PLAIN)
    second_high = stubs.run(thread.id, ref=PLAIN, priority=5)
    order = [stubs.acquire(f"w{i}").run.id for i in range(4)]
    assert order == [first_high.id, second_high.id, mid.id, low.id]
    assert not stubs.acquire(wait=0.1).HasField("run")


def test_heartbeat_renews_the_lease_and_reports_the_flags(stubs: Stubs) -> None:
    deadline = in_seconds(3600)
    run = new_run(stubs, deadline_time=deadline)
    got = stubs.acquire(ttl=5)
    granted = got.attempt.lease_expire_time.ToDatetime(dt.UTC)
    start = got.attempt.start_time.ToDatetime(dt.UTC)
    assert dt.timedelta(seconds=4) < granted - start <= dt.timedelta(seconds=5, milliseconds=50)
    time.sleep(0.3)
    beat = heartbeat(stubs, got.fence)
    renewed = beat.lease_expire_time.ToDatetime(dt.UTC)
    assert renewed > granted
    assert renewed - dt.datetime.now(dt.UTC) > dt.timedelta(seconds=4)
    assert not beat.cancel_requested and not beat.pause_requested
    assert beat.deadline_time == get_run(stubs, run.id).deadline_time
    assert beat.input_revision == 1
    [attempt] = attempts(stubs, run.id)
    assert attempt.lease_expire_time.ToDatetime(dt.UTC) == renewed
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10)
    assert heartbeat(stubs, got.fence).pause_requested
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)
    beat = heartbeat(stubs, got.fence)
    assert beat.cancel_requested and not beat.pause_requested  # a cancel overrides a pause


# -- finishing -------------------------------------------------------------------------------


def test_success_completes_the_run(stubs: Stubs) -> None:
    run = new_run(stubs)
    got = stubs.acquire()
    done = stubs.finish(got.fence, COMPLETE, result_summary="all green")
    assert done.run.status == E.RUN_STATUS_COMPLETED
    assert done.run.terminal_reason == E.TERMINAL_REASON_COMPLETED_BY_WORKER
    assert done.run.result_summary == "all green"
    assert done.run.current_attempt_id == ""
    assert done.run.HasField("end_time") and done.run.HasField("start_time")
    assert done.attempt.status == E.ATTEMPT_STATUS_SUCCEEDED
    assert done.attempt.HasField("end_time")
    assert not done.attempt.HasField("error")
    assert get_run(stubs, run.id) == done.run


def test_retries_keep_every_attempt_with_its_own_reason_worker_and_error(
    stubs: Stubs,
) -> None:
    run = new_run(stubs, max_attempts=3)
    assert run.max_attempts == 3
    fences = []
    for number in (1, 2, 3):
        got = stubs.acquire(f"worker-{number}")
        assert got.run.id == run.id
        assert got.attempt.number == number
        fences.append(got.fence)
        done = stubs.finish(
            got.fence,
            E.ATTEMPT_OUTCOME_FAILED_RETRYABLE,
            error=message_pb2.AttemptError(
                error_class=E.ERROR_CLASS_TOOL_ERROR, message=f"boom {number}", retryable=True
            ),
        )
        assert done.attempt.status == E.ATTEMPT_STATUS_FAILED
        if number < 3:
            assert done.run.status == E.RUN_STATUS_QUEUED
            assert done.run.current_attempt_id == ""
    assert done.run.status == E.RUN_STATUS_FAILED
    assert done.run.terminal_reason == E.TERMINAL_REASON_ATTEMPTS_EXHAUSTED
    assert done.run.attempt_count == 3

    listed = attempts(stubs, run.id)
    assert [a.number for a in listed] == [1, 2, 3]
    assert [a.reason for a in listed] == [
        E.ATTEMPT_REASON_INITIAL,
        E.ATTEMPT_REASON_RETRY_AFTER_ERROR,
        E.ATTEMPT_REASON_RETRY_AFTER_ERROR,
    ]
    assert [a.worker_id for a in listed] == ["worker-1", "worker-2", "worker-3"]
    assert [a.error.message for a in listed] == ["boom 1", "boom 2", "boom 3"]
    assert all(a.error.error_class == E.ERROR_CLASS_TOOL_ERROR for a in listed)
    assert all(a.status == E.ATTEMPT_STATUS_FAILED for a in listed)
    epochs = [a.lease_epoch for a in listed]
    assert epochs == sorted(set(epochs)) and epochs == [f.lease_epoch for f in fences]
    for a in listed:
        assert a.run_id == run.id and a.id.startswith("att_")
        assert a.end_time.ToDatetime() >= a.start_time.ToDatetime()
    for earlier, later in itertools.pairwise(listed):
        assert later.start_time.ToDatetime() >= earlier.end_time.ToDatetime()
    # Paging returns the same attempts in order.
    first = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run.id, page_size=2))
    second = stubs.runtime.ListAttempts(
        pb.ListAttemptsRequest(run_id=run.id, page_size=2, page_token=first.next_page_token)
    )
    assert list(first.attempts) + list(second.attempts) == listed
    assert second.next_page_token == ""


def test_permanent_failure_fails_the_run(stubs: Stubs) -> None:
    run = new_run(stubs, max_attempts=5)
    got = stubs.acquire()
    done = stubs.finish(
        got.fence,
        E.ATTEMPT_OUTCOME_FAILED_PERMANENT,
        error=message_pb2.AttemptError(error_class=E.ERROR_CLASS_WORKER_ERROR, message="broken"),
    )
    assert done.run.status == E.RUN_STATUS_FAILED
    assert done.run.terminal_reason == E.TERMINAL_REASON_WORKER_REPORTED_FAILURE
    assert done.run.attempt_count == 1
    [attempt] = attempts(stubs, run.id)
    assert attempt.status == E.ATTEMPT_STATUS_FAILED
    assert attempt.error.message == "broken"
    assert attempt.error.error_class == E.ERROR_CLASS_WORKER_ERROR
    assert not stubs.acquire(wait=0.1).HasField("run")


def test_repeating_the_same_finish_is_idempotent(stubs: Stubs, database_url: str) -> None:
    for outcome, other in (
        (COMPLETE, E.ATTEMPT_OUTCOME_FAILED_PERMANENT),
        (E.ATTEMPT_OUTCOME_FAILED_RETRYABLE, E.ATTEMPT_OUTCOME_FAILED_PERMANENT),
        (E.ATTEMPT_OUTCOME_FAILED_PERMANENT, COMPLETE),
    ):
        run = new_run(stubs)
        got = stubs.acquire()
        error = message_pb2.AttemptError(error_class=E.ERROR_CLASS_TOOL_ERROR, message="e")
        if outcome == COMPLETE:
            error = None
        first = stubs.finish(got.fence, outcome, result_summary="r", error=error)
        events = event_count(database_url)
        again = stubs.finish(got.fence, outcome, result_summary="r", error=error)
        assert again == first
        assert event_count(database_url) == events
        assert attempts(stubs, run.id)[0] == first.attempt
        # A different outcome for the ended attempt is a lost lease.
        assert_lease_lost(
            stubs, database_url, run.id, lambda got=got, other=other: stubs.finish(got.fence, other)
        )
        if first.run.status == E.RUN_STATUS_QUEUED:
            stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)


# -- fencing ---------------------------------------------------------------------------------


def test_stale_or_foreign_fences_are_refused_and_change_nothing(
    stubs: Stubs, database_url: str
) -> None:
    run = new_run(stubs)
    other = new_run(stubs)
    first = stubs.acquire("w1")
    assert first.run.id == run.id
    other_got = stubs.acquire("w2")
    assert other_got.run.id == other.id
    stubs.finish(
        first.fence,
        E.ATTEMPT_OUTCOME_FAILED_RETRYABLE,
        error=message_pb2.AttemptError(message="retry me"),
    )
    second = stubs.acquire("w3")
    assert second.run.id == run.id and second.attempt.number == 2
    current = second.fence

    bad_fences = {
        "stale epoch": message_pb2.Fence(
            attempt_id=current.attempt_id, lease_epoch=current.lease_epoch - 1
        ),
        "future epoch": message_pb2.Fence(
            attempt_id=current.attempt_id, lease_epoch=current.lease_epoch + 1
        ),
        "ended attempt": first.fence,
        "ended attempt, current epoch": message_pb2.Fence(
            attempt_id=first.fence.attempt_id, lease_epoch=current.lease_epoch
        ),
        "another run's attempt": message_pb2.Fence(
            attempt_id=other_got.fence.attempt_id, lease_epoch=current.lease_epoch
        ),
        "unknown attempt": message_pb2.Fence(
            attempt_id="att_01NOSUCHATTEMPT000000000000", lease_epoch=current.lease_epoch
        ),
    }
    for fence in bad_fences.values():
        for call in (
            lambda fence=fence: heartbeat(stubs, fence),
            lambda fence=fence: stubs.finish(fence, COMPLETE),
            lambda fence=fence: stubs.finish(fence, E.ATTEMPT_OUTCOME_FAILED_PERMANENT),
        ):
            assert_lease_lost(stubs, database_url, run.id, call)
    assert get_run(stubs, other.id).current_attempt_id == other_got.attempt.id
    # The current fence still works.
    assert stubs.finish(current, COMPLETE).run.status == E.RUN_STATUS_COMPLETED
    assert_lease_lost(stubs, database_url, run.id, lambda: heartbeat(stubs, current))


@pytest.fixture
def unreaped(database_url: str) -> Iterator[Stubs]:
    yield from open_stubs(database_url, NO_REAPER)


def test_an_expired_lease_is_refused_before_the_reaper_runs(
    unreaped: Stubs, database_url: str
) -> None:
    stubs = unreaped
    run = new_run(stubs)
    got = stubs.acquire(ttl=1)
    time.sleep(1.2)
    assert_lease_lost(stubs, database_url, run.id, lambda: heartbeat(stubs, got.fence))
    assert_lease_lost(stubs, database_url, run.id, lambda: stubs.finish(got.fence, COMPLETE))
    assert attempts(stubs, run.id)[0].status == E.ATTEMPT_STATUS_ACTIVE  # not yet reaped


# -- the reaper ------------------------------------------------------------------------------


def write_checkpoint(stubs: Stubs, fence: message_pb2.Fence, state: bytes) -> Any:
    """Upload ``state`` as a blob and record it as the attempt's checkpoint."""
    blob = stubs.runtime.PutBlob(
        iter(
            [
                pb.PutBlobRequest(header=message_pb2.BlobHeader(size=len(state))),
                pb.PutBlobRequest(chunk=state),
            ]
        ),
        timeout=10,
    ).blob
    return stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=fence, state_ref=blob.digest), timeout=10
    ).checkpoint


def test_a_lost_lease_requeues_and_the_next_attempt_resumes_from_the_checkpoint(
    fast: Stubs, database_url: str
) -> None:
    run = new_run(fast, max_attempts=2)
    got = fast.acquire("gone", ttl=2)  # time to record the checkpoint before it expires
    checkpoint = write_checkpoint(fast, got.fence, b"worker state after step 3")
    assert get_run(fast, run.id).latest_checkpoint_id == checkpoint.id
    wait_for(lambda: get_run(fast, run.id).status == E.RUN_STATUS_QUEUED)
    lost = attempts(fast, run.id)[0]
    assert lost.status == E.ATTEMPT_STATUS_LOST
    assert lost.error.error_class == E.ERROR_CLASS_LEASE_LOST
    assert lost.HasField("end_time")
    queued = get_run(fast, run.id)
    assert queued.current_attempt_id == "" and queued.attempt_count == 1

    again = fast.acquire("fresh", ttl=1)
    assert again.run.id == run.id
    assert again.attempt.number == 2
    assert again.attempt.reason == E.ATTEMPT_REASON_WORKER_LOST
    assert again.attempt.resume_from_checkpoint_id == checkpoint.id
    assert again.resume_from == checkpoint
    assert again.attempt.lease_epoch > got.attempt.lease_epoch
    # The lost worker's late writes bounce.
    assert_lease_lost(fast, database_url, run.id, lambda: heartbeat(fast, got.fence))
    assert_lease_lost(fast, database_url, run.id, lambda: fast.finish(got.fence, COMPLETE))

    # Lost again on the last attempt: the run fails, ATTEMPTS_EXHAUSTED.
    wait_for(lambda: get_run(fast, run.id).status == E.RUN_STATUS_FAILED)
    ended = get_run(fast, run.id)
    assert ended.terminal_reason == E.TERMINAL_REASON_ATTEMPTS_EXHAUSTED
    assert [a.status for a in attempts(fast, run.id)] == [E.ATTEMPT_STATUS_LOST] * 2


def test_heartbeats_keep_a_lease_alive(fast: Stubs) -> None:
    run = new_run(fast)
    got = fast.acquire(ttl=1.5)
    for _ in range(8):  # 2.4 s: well past the TTL
        time.sleep(0.3)
        heartbeat(fast, got.fence)
    assert get_run(fast, run.id).current_attempt_id == got.attempt.id
    assert attempts(fast, run.id)[0].status == E.ATTEMPT_STATUS_ACTIVE


def test_a_run_past_its_deadline_times_out(fast: Stubs, database_url: str) -> None:
    queued = new_run(fast, deadline_time=in_seconds(2.0), priority=-1)
    running = new_run(fast, deadline_time=in_seconds(2.0))
    got = fast.acquire()
    assert got.run.id == running.id
    beat = heartbeat(fast, got.fence)
    assert beat.deadline_time == running.deadline_time
    wait_for(
        lambda: (
            get_run(fast, running.id).status == E.RUN_STATUS_TIMED_OUT
            and get_run(fast, queued.id).status == E.RUN_STATUS_TIMED_OUT
        )
    )
    for run_id in (queued.id, running.id):
        ended = get_run(fast, run_id)
        assert ended.terminal_reason == E.TERMINAL_REASON_DEADLINE_EXCEEDED
        assert ended.current_attempt_id == ""
    assert attempts(fast, queued.id) == []
    assert attempts(fast, running.id)[0].status == E.ATTEMPT_STATUS_CANCELLED
    assert_lease_lost(fast, database_url, running.id, lambda: heartbeat(fast, got.fence))
    assert not fast.acquire(wait=0.1).HasField("run")


# -- cancel and pause ------------------------------------------------------------------------


def test_cancel_a_queued_run_ends_it_at_once(stubs: Stubs) -> None:
    run = new_run(stubs)
    cancelled = stubs.runtime.CancelRun(
        pb.CancelRunRequest(run_id=run.id, reason="not needed", actor="alice"), timeout=10
    ).run
    assert cancelled.status == E.RUN_STATUS_CANCELLED
    assert cancelled.terminal_reason == E.TERMINAL_REASON_CANCELLED_BY_USER
    assert cancelled.terminal_message == "not needed"
    assert cancelled.HasField("end_time")
    assert not stubs.acquire(wait=0.1).HasField("run")


def test_cancel_a_running_run_is_acknowledged_by_the_worker(stubs: Stubs) -> None:
    run = new_run(stubs)
    got = stubs.acquire()
    assert not heartbeat(stubs, got.fence).cancel_requested
    asked = stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10).run
    assert asked.status == E.RUN_STATUS_RUNNING and asked.cancel_requested
    assert heartbeat(stubs, got.fence).cancel_requested
    done = stubs.finish(got.fence, E.ATTEMPT_OUTCOME_CANCELLED)
    assert done.run.status == E.RUN_STATUS_CANCELLED
    assert done.run.terminal_reason == E.TERMINAL_REASON_CANCELLED_BY_USER
    assert not done.run.cancel_requested
    assert done.attempt.status == E.ATTEMPT_STATUS_CANCELLED


def test_the_cancel_reason_is_the_terminal_message_when_the_worker_acknowledges(
    stubs: Stubs,
) -> None:
    run = new_run(stubs)
    got = stubs.acquire()
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id, reason="wrong branch"), timeout=10)
    # The worker's own words stay on its attempt; the run says why it was stopped.
    done = stubs.finish(
        got.fence,
        E.ATTEMPT_OUTCOME_CANCELLED,
        error=message_pb2.AttemptError(message="stopped at a step boundary"),
    )
    assert done.run.terminal_message == "wrong branch"
    assert get_run(stubs, run.id).terminal_message == "wrong branch"
    assert done.attempt.error.message == "stopped at a step boundary"
    [ended] = [e for e in run_events(stubs, run.id) if e.event_type == E.EVENT_TYPE_RUN_ENDED]
    assert ended.run_ended_attributes.terminal_message == "wrong branch"
    # Without a reason the worker's words are all there is.
    other = new_run(stubs)
    got = stubs.acquire()
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=other.id), timeout=10)
    done = stubs.finish(got.fence, E.ATTEMPT_OUTCOME_CANCELLED, result_summary="left as is")
    assert done.run.terminal_message == "left as is"


def test_the_pause_reason_is_recorded_when_the_worker_acknowledges(stubs: Stubs) -> None:
    run = new_run(stubs)
    got = stubs.acquire()
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id, reason="over budget"), timeout=10)
    stubs.finish(got.fence, E.ATTEMPT_OUTCOME_PAUSED)
    changes = [
        e.run_status_changed_attributes
        for e in run_events(stubs, run.id)
        if e.event_type == E.EVENT_TYPE_RUN_STATUS_CHANGED
    ]
    assert (changes[-1].status, changes[-1].reason) == (E.RUN_STATUS_PAUSED, "over budget")


def run_events(stubs: Stubs, run_id: str) -> list[Any]:
    last = get_run(stubs, run_id).last_event_sequence
    stream = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run_id), timeout=10)
    found = []
    for response in stream:
        found.append(response.event)
        if response.event.sequence >= last:
            break
    stream.cancel()
    return found


def test_a_worker_that_ignores_a_cancel_is_stopped_after_the_grace_period(
    fast: Stubs, database_url: str
) -> None:
    run = new_run(fast)
    got = fast.acquire(ttl=30)
    fast.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)
    assert get_run(fast, run.id).status == E.RUN_STATUS_RUNNING
    wait_for(lambda: get_run(fast, run.id).status == E.RUN_STATUS_CANCELLED)
    ended = get_run(fast, run.id)
    assert ended.terminal_reason == E.TERMINAL_REASON_CANCELLED_BY_USER
    assert ended.terminal_message == "the worker did not stop within the grace period"
    [attempt] = attempts(fast, run.id)
    assert attempt.status == E.ATTEMPT_STATUS_CANCELLED
    assert attempt.error.message == (
        "stopped by the runtime: the worker did not stop within the grace period"
    )
    # The epoch was bumped: every late write of the worker bounces.
    assert_lease_lost(fast, database_url, run.id, lambda: heartbeat(fast, got.fence))
    assert_lease_lost(
        fast, database_url, run.id, lambda: fast.finish(got.fence, E.ATTEMPT_OUTCOME_CANCELLED)
    )
    assert_lease_lost(fast, database_url, run.id, lambda: fast.finish(got.fence, COMPLETE))


@pytest.fixture
def long_grace(database_url: str) -> Iterator[Stubs]:
    """A fast reaper and a stop grace period longer than any test: a lease runs out first."""
    yield from open_stubs(
        database_url, RuntimeSettings(reaper_interval=0.1, stop_grace=dt.timedelta(seconds=600))
    )


def test_a_cancel_whose_worker_lease_expires_says_so_and_keeps_the_reason(
    long_grace: Stubs,
) -> None:
    stubs = long_grace
    run = new_run(stubs)
    stubs.acquire(ttl=1)
    stubs.runtime.CancelRun(
        pb.CancelRunRequest(run_id=run.id, reason="customer withdrew"), timeout=10
    )
    wait_for(lambda: get_run(stubs, run.id).status == E.RUN_STATUS_CANCELLED)
    assert get_run(stubs, run.id).terminal_message == "customer withdrew"
    [attempt] = attempts(stubs, run.id)
    assert attempt.error.message == (
        "stopped by the runtime: the worker's lease expired before it stopped"
    )
    # And without a reason, the runtime's words.
    other = new_run(stubs)
    stubs.acquire(ttl=1)
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=other.id), timeout=10)
    wait_for(lambda: get_run(stubs, other.id).status == E.RUN_STATUS_CANCELLED)
    assert get_run(stubs, other.id).terminal_message == (
        "the worker's lease expired before it stopped"
    )


def test_an_interrupted_worker_that_ignores_it_is_stopped_and_the_new_run_proceeds(
    fast: Stubs,
) -> None:
    thread = fast.thread(E.CONCURRENCY_POLICY_INTERRUPT)
    old = fast.run(thread.id, ref=PLAIN)
    got = fast.acquire(ttl=30)
    new = fast.run(thread.id, ref=PLAIN)
    assert not fast.acquire(wait=0.1).HasField("run")
    following = fast.acquire("next", wait=4)
    assert following.run.id == new.id
    ended = get_run(fast, old.id)
    assert ended.status == E.RUN_STATUS_CANCELLED
    assert ended.terminal_reason == E.TERMINAL_REASON_INTERRUPTED_BY_NEW_RUN
    assert ended.terminal_message == "interrupted by a new run in the thread"
    assert got.attempt.id == attempts(fast, old.id)[0].id


def test_pause_and_resume_a_running_run(stubs: Stubs, database_url: str) -> None:
    run = new_run(stubs)
    got = stubs.acquire("w1")
    asked = stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10).run
    assert asked.status == E.RUN_STATUS_RUNNING and asked.pause_requested
    assert heartbeat(stubs, got.fence).pause_requested
    paused = stubs.finish(got.fence, E.ATTEMPT_OUTCOME_PAUSED)
    assert paused.run.status == E.RUN_STATUS_PAUSED
    assert paused.attempt.status == E.ATTEMPT_STATUS_PAUSED
    assert paused.run.current_attempt_id == ""
    assert not stubs.acquire(wait=0.1).HasField("run")  # a paused run is not handed out
    resumed = stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id), timeout=10).run
    assert resumed.status == E.RUN_STATUS_QUEUED
    again = stubs.acquire("w2")
    assert again.run.id == run.id
    assert again.attempt.number == 2
    assert again.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_PAUSE
    assert_lease_lost(stubs, database_url, run.id, lambda: heartbeat(stubs, got.fence))
    assert stubs.finish(again.fence, COMPLETE).run.status == E.RUN_STATUS_COMPLETED


def test_resume_withdraws_a_pause_not_yet_acknowledged(stubs: Stubs) -> None:
    run = new_run(stubs)
    got = stubs.acquire()
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10)
    withdrawn = stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id), timeout=10).run
    assert withdrawn.status == E.RUN_STATUS_RUNNING and not withdrawn.pause_requested
    assert not heartbeat(stubs, got.fence).pause_requested
    error = rpc_error(stubs.finish, got.fence, E.ATTEMPT_OUTCOME_PAUSED)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert get_run(stubs, run.id).current_attempt_id == got.attempt.id


def test_pause_a_queued_run_at_once_and_resume_it(stubs: Stubs) -> None:
    run = new_run(stubs)
    paused = stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10).run
    assert paused.status == E.RUN_STATUS_PAUSED
    assert not stubs.acquire(wait=0.1).HasField("run")
    stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id), timeout=10)
    got = stubs.acquire()
    assert got.run.id == run.id and got.attempt.number == 1
    # The run's first attempt, whatever happened while it was queued.
    assert got.attempt.reason == E.ATTEMPT_REASON_INITIAL


def test_a_worker_that_ignores_a_pause_is_stopped_after_the_grace_period(
    fast: Stubs, database_url: str
) -> None:
    run = new_run(fast)
    got = fast.acquire(ttl=30)
    fast.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10)
    wait_for(lambda: get_run(fast, run.id).status == E.RUN_STATUS_PAUSED)
    assert attempts(fast, run.id)[0].status == E.ATTEMPT_STATUS_PAUSED
    assert_lease_lost(fast, database_url, run.id, lambda: heartbeat(fast, got.fence))
    assert_lease_lost(
        fast, database_url, run.id, lambda: fast.finish(got.fence, E.ATTEMPT_OUTCOME_PAUSED)
    )
    fast.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id), timeout=10)
    again = fast.acquire()
    assert again.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_PAUSE
