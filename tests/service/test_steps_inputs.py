"""Turns and inputs: steers at the next MODEL_CALL of the turn, follow-ups at EndTurn, each
input delivered exactly once (also across attempts), discarded when the run ends."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from runtime_service.runtime_settings import RuntimeSettings
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    T,
    acquire,
    events,
    expect,
    get_run,
    get_step,
    of_type,
    send,
    start,
    violations,
)
from tests.support import running_server

STEER, FOLLOW_UP = E.INPUT_KIND_STEER, E.INPUT_KIND_FOLLOW_UP


def consumed(stubs: Stubs, run_id: str) -> list[tuple[str, str, str]]:
    """(input_id, turn_id, step_id) of every `input.consumed` event, in order."""
    return [
        (
            e.input_consumed_attributes.input_id,
            e.input_consumed_attributes.turn_id,
            e.input_consumed_attributes.step_id,
        )
        for e in of_type(events(stubs, run_id), E.EVENT_TYPE_INPUT_CONSUMED)
    ]


def status_of(stubs: Stubs, run_id: str, request_id: str, kind: int = STEER) -> int:
    """An input's current status, read back through SendInput's idempotent replay."""
    return int(send(stubs, run_id, kind, "x", request_id=request_id).status)


def test_a_steer_is_delivered_at_the_next_model_call_of_the_turn(stubs: Stubs) -> None:
    w = start(stubs)
    steer = send(stubs, w.run_id, STEER, "prefer the small fix", sender="alice", request_id="s1")
    assert (steer.status, steer.kind, steer.sender) == (E.INPUT_STATUS_PENDING, STEER, "alice")
    [received] = of_type(events(stubs, w.run_id), E.EVENT_TYPE_INPUT_RECEIVED)
    assert received.input_received_attributes.input_id == steer.id

    # A tool call is not a model step boundary: nothing is delivered.
    w.end(w.tool("read_file", path="a").step.id)
    assert status_of(stubs, w.run_id, "s1") == E.INPUT_STATUS_PENDING

    begun = w.model()
    assert [i.id for i in begun.steer_inputs] == [steer.id]
    assert begun.steer_inputs[0].content == "prefer the small fix"
    assert list(begun.step.consumed_input_ids) == [steer.id]
    assert list(get_step(stubs, begun.step.id).consumed_input_ids) == [steer.id]
    delivered = send(stubs, w.run_id, STEER, "x", request_id="s1")
    assert delivered.status == E.INPUT_STATUS_DELIVERED
    assert (delivered.delivered_step_id, delivered.delivered_turn_id) == (begun.step.id, w.turn_id)
    assert delivered.HasField("deliver_time")
    assert consumed(stubs, w.run_id) == [(steer.id, w.turn_id, begun.step.id)]

    # Exactly once: the next model call gets nothing, and neither does the next turn.
    second = w.model()
    assert list(second.steer_inputs) == [] and list(second.step.consumed_input_ids) == []
    w.end(begun.step.id)
    w.end(second.step.id)
    assert not w.end_turn().HasField("next_turn")
    assert list(w.begin_turn().delivered_inputs) == []
    assert len(consumed(stubs, w.run_id)) == 1


def test_a_follow_up_waits_for_end_turn_which_opens_the_next_turn(stubs: Stubs) -> None:
    w = start(stubs)
    first_turn = w.turn_id
    follow = send(stubs, w.run_id, FOLLOW_UP, "also update the docs", request_id="f1")
    # Not delivered at a model call.
    step = w.model()
    assert list(step.steer_inputs) == []
    assert status_of(stubs, w.run_id, "f1", FOLLOW_UP) == E.INPUT_STATUS_PENDING
    # The turn cannot end while a step is STARTED.
    expect(grpc.StatusCode.FAILED_PRECONDITION, w.end_turn, reason="STEPS_OPEN")
    w.end(step.step.id)

    ended = w.end_turn()
    assert ended.ended_turn.id == first_turn
    assert ended.ended_turn.status == E.TURN_STATUS_ENDED and ended.ended_turn.HasField("end_time")
    assert ended.HasField("next_turn")
    nxt = ended.next_turn
    assert nxt.status == E.TURN_STATUS_OPEN and nxt.number == ended.ended_turn.number + 1
    assert [i.id for i in ended.delivered_inputs] == [follow.id]
    assert list(nxt.consumed_input_ids) == [follow.id]
    assert consumed(stubs, w.run_id) == [(follow.id, nxt.id, "")]
    assert status_of(stubs, w.run_id, "f1", FOLLOW_UP) == E.INPUT_STATUS_DELIVERED

    # Repeating EndTurn for the ended turn returns the same result and delivers nothing new.
    repeat = w.stubs.worker.EndTurn(
        wpb.EndTurnRequest(fence=w.fence, turn_id=first_turn), timeout=T
    )
    assert repeat.next_turn.id == nxt.id
    assert [i.id for i in repeat.delivered_inputs] == [follow.id]
    assert len(consumed(stubs, w.run_id)) == 1

    # Nothing pending: the turn just ends.
    last = w.end_turn()
    assert last.ended_turn.id == nxt.id and not last.HasField("next_turn")
    assert list(last.delivered_inputs) == []

    # A steer that arrives between turns opens the next one at BeginTurn; a retried BeginTurn
    # (same request_id) returns the same turn and inputs.
    steer = send(stubs, w.run_id, STEER, "hurry")
    opened = w.begin_turn(request_id="bt-1")
    assert [i.id for i in opened.delivered_inputs] == [steer.id]
    retried = w.begin_turn(request_id="bt-1")
    assert retried.turn.id == opened.turn.id
    assert [i.id for i in retried.delivered_inputs] == [steer.id]
    assert len(consumed(stubs, w.run_id)) == 2
    turns = of_type(events(stubs, w.run_id), E.EVENT_TYPE_TURN_STARTED)
    assert [t.turn_started_attributes.number for t in turns] == [1, 2, 3]


def test_input_rules_and_discarding_at_the_end(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    # Sent before any worker took the run: delivered when the first turn opens.
    early = send(stubs, run.id, FOLLOW_UP, "context", request_id="early")
    assert send(stubs, run.id, FOLLOW_UP, "context", request_id="early").id == early.id

    def bad(field: str, **kw: Any) -> None:
        details = expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            stubs.runtime.SendInput,
            pb.SendInputRequest(run_id=run.id, **kw),
            timeout=T,
        )
        assert field in violations(details)

    bad("kind", content="x")
    bad("kind", kind=99, content="x")
    bad("content", kind=STEER)
    expect(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        send,
        stubs,
        run.id,
        STEER,
        "x" * (256 * 1024 + 1),
    )
    expect(grpc.StatusCode.NOT_FOUND, send, stubs, "run_nope", STEER, "x")

    # request_id is scoped to the run: another run may use the same key.
    other = stubs.run(stubs.thread().id)
    mine = send(stubs, other.id, FOLLOW_UP, "context", request_id="early")
    assert mine.id != early.id and mine.run_id == other.id

    w = acquire(stubs, turn=False)
    assert w.run_id == run.id
    opened = w.begin_turn()
    assert [i.id for i in opened.delivered_inputs] == [early.id]
    pending = send(stubs, run.id, STEER, "never read", request_id="late")
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    assert get_run(stubs, run.id).status == E.RUN_STATUS_FAILED
    # The run has ended: no more input, and what was pending is discarded.
    expect(grpc.StatusCode.FAILED_PRECONDITION, send, stubs, run.id, STEER, "y", reason="RUN_ENDED")
    assert status_of(stubs, run.id, "late") == E.INPUT_STATUS_DISCARDED
    assert status_of(stubs, run.id, "early", FOLLOW_UP) == E.INPUT_STATUS_DELIVERED
    assert pending.id not in [c[0] for c in consumed(stubs, run.id)]


@pytest.fixture
def fast_reaper_stubs(database_url: str) -> Iterator[Stubs]:
    settings = RuntimeSettings(min_lease_ttl=dt.timedelta(milliseconds=200), reaper_interval=0.05)
    with running_server(database_url, settings) as address, Stubs.open(address) as s:
        yield s


def test_inputs_are_delivered_once_across_a_lost_attempt(fast_reaper_stubs: Stubs) -> None:
    stubs = fast_reaper_stubs
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id, max_attempts=3)
    w1 = acquire(stubs, turn=False, ttl=2.0)
    steer = send(stubs, run.id, STEER, "read the logs first")
    # The start of a turn is a step boundary: the steer is delivered there.
    assert [i.id for i in w1.begin_turn().delivered_inputs] == [steer.id]
    follow = send(stubs, run.id, FOLLOW_UP, "then write a test")
    late_steer = send(stubs, run.id, STEER, "arrived too late")

    # The worker vanishes: the lease expires and the reaper re-queues the run.
    deadline = time.monotonic() + 10
    while get_run(stubs, run.id).status != E.RUN_STATUS_QUEUED:
        assert time.monotonic() < deadline, "the lost attempt was never reaped"
        time.sleep(0.05)
    expect(grpc.StatusCode.ABORTED, w1.model, reason="LEASE_LOST")

    w2 = acquire(stubs, turn=False)
    assert w2.acquired.attempt.reason == E.ATTEMPT_REASON_WORKER_LOST
    opened = w2.begin_turn()
    # Only what attempt 1 never received; the first steer is not delivered again.
    assert [i.id for i in opened.delivered_inputs] == [follow.id, late_steer.id]
    assert list(w2.model().steer_inputs) == []
    delivered = [c[0] for c in consumed(stubs, run.id)]
    assert sorted(delivered) == sorted([steer.id, follow.id, late_steer.id])
    assert len(delivered) == len(set(delivered))
