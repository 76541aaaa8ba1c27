"""The runtime stops a worker that loops on a failure (issue 27, item 1): once the last
``MAX_FAILED_STEPS_IN_A_ROW`` steps of an attempt all FAILED, its next BeginStep ends the
attempt FAILED (retryable) and answers RESOURCE_EXHAUSTED FAILED_STEP_LIMIT, whatever SDK
the worker uses; a success in between starts the count again."""

from __future__ import annotations

from typing import Any

import grpc

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from runtime_service.step_rules import MAX_FAILED_STEPS_IN_A_ROW
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
    start,
)

LIMIT = MAX_FAILED_STEPS_IN_A_ROW
# The number BeginStep's proto comment and docs/lifecycle.md state.
assert LIMIT == 20


def fail(w: Worker, times: int) -> None:
    """``times`` tool calls that each end FAILED, as a worker retrying a broken tool would."""
    for _ in range(times):
        step = w.tool("read_file", path="a").step
        w.end(step.id, FAILED, error_class=E.ERROR_CLASS_TOOL_ERROR, error_message="boom")


def attempts(stubs: Stubs, run_id: str) -> list[Any]:
    found = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run_id), timeout=T)
    return list(found.attempts)


def assert_stopped(stubs: Stubs, w: Worker) -> None:
    """The BeginStep is refused, records nothing, ends the attempt and takes its fence."""
    before = len(list_steps(stubs, w.run_id))
    details = expect(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        w.tool,
        "read_file",
        path="a",
        reason="FAILED_STEP_LIMIT",
    )
    assert dict(details["ErrorInfo"].metadata) == {
        "failed_in_a_row": str(LIMIT),
        "limit": str(LIMIT),
    }
    assert len(list_steps(stubs, w.run_id)) == before
    last = attempts(stubs, w.run_id)[-1]
    assert last.status == E.ATTEMPT_STATUS_FAILED
    assert last.error.error_class == E.ERROR_CLASS_WORKER_ERROR
    assert last.error.retryable
    assert f"the last {LIMIT} steps of this attempt failed" in last.error.message
    expect(grpc.StatusCode.ABORTED, w.tool, "read_file", path="a", reason="LEASE_LOST")


def test_a_loop_of_failed_steps_ends_the_attempt_and_then_the_run(stubs: Stubs) -> None:
    w = start(stubs, max_attempts=2)
    # One short of the limit, then a success: the count starts again.
    fail(w, LIMIT - 1)
    w.end(w.tool("read_file", path="a").step.id)
    fail(w, LIMIT)
    assert_stopped(stubs, w)
    # Attempts are left: the run is queued again, and the next attempt starts from nothing.
    assert get_run(stubs, w.run_id).status == E.RUN_STATUS_QUEUED
    w = acquire(stubs)
    fail(w, LIMIT)
    assert_stopped(stubs, w)
    run = get_run(stubs, w.run_id)
    assert run.status == E.RUN_STATUS_FAILED
    assert run.terminal_reason == E.TERMINAL_REASON_ATTEMPTS_EXHAUSTED
    ended = events(stubs, w.run_id)[-1]
    assert ended.event_type == E.EVENT_TYPE_RUN_ENDED


def test_denied_steps_do_not_count_as_failures(stubs: Stubs) -> None:
    """A denial is the tool's answer for the agent, not a failure: it neither counts nor
    resets the count."""
    w = start(stubs)
    fail(w, LIMIT - 1)
    expect(grpc.StatusCode.PERMISSION_DENIED, w.tool, "run_tests")
    w.end(w.tool("read_file", path="a").step.id)  # the limit was not reached
    fail(w, LIMIT)
    assert_stopped(stubs, w)
