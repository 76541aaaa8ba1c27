"""Budgets are enforced by the runtime from what steps recorded: the BeginStep that would
exceed one is RESOURCE_EXHAUSTED naming it, and the run ends FAILED (BUDGET_EXCEEDED)."""

from __future__ import annotations

import grpc
import pytest

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    FAILED,
    T,
    Worker,
    acquire,
    events,
    expect,
    get_run,
    list_steps,
    of_type,
    put_blob,
    send,
    start,
)


def usage(tokens_in: int = 0, tokens_out: int = 0, cost: float = 0.0) -> message_pb2.Usage:
    return message_pb2.Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)


def assert_budget_ended(stubs: Stubs, w: Worker, budget: str, steps_before: int) -> None:
    """The refused BeginStep ended the run FAILED (BUDGET_EXCEEDED), committed, recorded
    nothing new, wrote run.ended, and took the worker's fence."""
    details = expect(grpc.StatusCode.RESOURCE_EXHAUSTED, w.model, "over", reason="BUDGET_EXCEEDED")
    assert details["ErrorInfo"].metadata["budget"] == budget
    run = get_run(stubs, w.run_id)
    assert run.status == E.RUN_STATUS_FAILED
    assert run.terminal_reason == E.TERMINAL_REASON_BUDGET_EXCEEDED
    assert budget in run.terminal_message
    assert len(list_steps(stubs, w.run_id)) == steps_before
    attempts = stubs.runtime.ListAttempts(
        pb.ListAttemptsRequest(run_id=w.run_id), timeout=T
    ).attempts
    assert attempts[-1].status == E.ATTEMPT_STATUS_FAILED
    assert attempts[-1].error.error_class == E.ERROR_CLASS_BUDGET_EXCEEDED
    found = events(stubs, w.run_id)
    assert found[-1].event_type == E.EVENT_TYPE_RUN_ENDED
    ended = found[-1].run_ended_attributes
    assert (ended.status, ended.terminal_reason) == (
        E.RUN_STATUS_FAILED,
        E.TERMINAL_REASON_BUDGET_EXCEEDED,
    )
    assert ended.usage == run.usage
    # The attempt is over: the worker's fence is gone.
    expect(grpc.StatusCode.ABORTED, w.model, reason="LEASE_LOST")


def test_max_steps_counts_worker_steps_over_all_attempts(stubs: Stubs) -> None:
    w = start(stubs, budget=message_pb2.Budget(max_steps=3))
    w.end(w.model().step.id)
    # A checkpoint is recorded by the runtime and does not count.
    state = put_blob(stubs, b"state").blob.digest
    stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=w.fence, state_ref=state), timeout=T
    )
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w = acquire(stubs)
    w.end(w.tool("read_file", path="a").step.id)
    # A refused tool call is a recorded (DENIED) step and counts.
    expect(grpc.StatusCode.PERMISSION_DENIED, w.tool, "run_tests")
    pending = send(stubs, w.run_id, E.INPUT_KIND_FOLLOW_UP, "later", request_id="f1")
    assert_budget_ended(stubs, w, "max_steps", 4)
    # Input nobody will read is discarded when the run ends.
    again = send(stubs, w.run_id, E.INPUT_KIND_FOLLOW_UP, "later", request_id="f1")
    assert again.id == pending.id and again.status == E.INPUT_STATUS_DISCARDED


def test_max_model_tokens_sums_recorded_usage(stubs: Stubs) -> None:
    w = start(stubs, budget=message_pb2.Budget(max_model_tokens=1000))
    w.end(w.model().step.id, usage=usage(400, 100))
    w.end(w.model().step.id, usage=usage(300, 100))
    assert get_run(stubs, w.run_id).usage.input_tokens == 700
    # 900 used: a call estimated at 100 more still fits ...
    w.end(w.model(estimated_input_tokens=100).step.id, FAILED, usage=usage(50, 50))
    # ... now exactly at the limit: the next call is refused.
    assert_budget_ended(stubs, w, "max_model_tokens", 3)


def test_a_model_call_whose_estimate_exceeds_the_token_budget_is_refused(stubs: Stubs) -> None:
    w = start(stubs, budget=message_pb2.Budget(max_model_tokens=1000))
    w.end(w.model(estimated_input_tokens=500).step.id, usage=usage(500, 100))
    # 600 used + an estimate of 500 would pass 1000.
    details = expect(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        w.model,
        estimated_input_tokens=500,
        reason="BUDGET_EXCEEDED",
    )
    assert details["ErrorInfo"].metadata["budget"] == "max_model_tokens"
    assert get_run(stubs, w.run_id).status == E.RUN_STATUS_FAILED


def test_max_cost_usd_sums_recorded_cost_across_attempts(stubs: Stubs) -> None:
    w = start(stubs, budget=message_pb2.Budget(max_cost_usd=1.0))
    w.end(w.model().step.id, usage=usage(10, 10, 0.6))
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w = acquire(stubs)
    w.end(w.model().step.id, usage=usage(10, 10, 0.3))  # 0.9 spent: still under
    w.end(w.tool("read_file", path="a").step.id, usage=usage(cost=0.2))  # tools cost too
    run = get_run(stubs, w.run_id)
    assert run.usage.cost_usd == pytest.approx(1.1)
    assert_budget_ended(stubs, w, "max_cost_usd", 3)


def test_no_budget_means_unlimited(stubs: Stubs) -> None:
    w = start(stubs)
    for _ in range(3):
        w.end(w.model(estimated_input_tokens=10**9).step.id, usage=usage(10**7, 10**7, 10**4))
    assert get_run(stubs, w.run_id).status == E.RUN_STATUS_RUNNING
    steps = list_steps(stubs, w.run_id)
    assert len(steps) == 3
    assert of_type(events(stubs, w.run_id), E.EVENT_TYPE_RUN_ENDED) == []
