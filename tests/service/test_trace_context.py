"""The trace context a server that does not trace still records and hands on (issue 29,
item 2): the caller's W3C ``traceparent`` becomes the run's, each attempt's is its child, and
each step names its trace and span, so a worker and an auditor can join the caller's trace
even when agentrt exports nothing itself. A malformed header is no context, never an error.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core.trace_context import parse, span_id_of
from tests.runtime_support import Stubs

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE}-00f067aa0ba902b7-01"


def create_run(stubs: Stubs, metadata: tuple[tuple[str, str], ...]) -> Any:
    thread = stubs.thread()
    return stubs.runtime.CreateRun(
        pb.CreateRunRequest(
            thread_id=thread.id,
            agent_ref="coding_agent:prod",
            goal=message_pb2.Goal(objective="trace me"),
        ),
        metadata=metadata,
        timeout=10,
    ).run


def first_step(stubs: Stubs) -> tuple[Any, Any]:
    """The acquired attempt and a model call step begun in it."""
    acquired = stubs.acquire()
    fence = acquired.fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn
    step = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            model_call=message_pb2.ModelCallSpec(),
        ),
        timeout=10,
    ).step
    return acquired.attempt, step


def test_the_callers_context_is_recorded_and_handed_on(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = create_run(stubs, (("traceparent", CALLER),))
    assert run.traceparent == CALLER
    attempt, step = first_step(stubs)
    # The attempt's span is the child of the caller's, its id a function of the attempt's.
    assert attempt.traceparent == f"00-{TRACE}-{span_id_of('attempt', attempt.id)}-01"
    assert (step.trace_id, step.span_id) == (TRACE, span_id_of("step", step.id))
    listed = stubs.runtime.GetStep(pb.GetStepRequest(step_id=step.id), timeout=10).step
    assert (listed.trace_id, listed.span_id) == (step.trace_id, step.span_id)


def test_without_a_context_nothing_is_made_up(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = create_run(stubs, ())
    assert run.traceparent == ""
    attempt, step = first_step(stubs)
    assert attempt.traceparent == "" and step.trace_id == "" and step.span_id == ""


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        f"ff-{TRACE}-00f067aa0ba902b7-01",
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        # Long, but under gRPC's own 8 KiB metadata limit (past it gRPC refuses the call).
        "00-" + "a" * 4000,
    ],
)
def test_a_malformed_traceparent_is_no_context_and_no_error(stubs: Stubs, header: str) -> None:
    stubs.publish_agent()
    run = create_run(stubs, (("traceparent", header), ("tracestate", "=,=" * 300)))
    assert run.traceparent == ""
    assert parse(run.traceparent) is None
