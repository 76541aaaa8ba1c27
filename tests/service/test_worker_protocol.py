"""The worker protocol exactly as docs/api.md ("Workers: the step protocol") writes it: the
documented sequence of calls is read from the page and driven, call by call, against a real
server on both engines, and the numbered steps of the page follow the same order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import T, args, expect, get_run, list_steps

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
#: The checks of coding_agent's completion policy (test-and-diff@3), in the policy's order.
CHECKS = ["tests-pass", "diff-reviewed"]


def _section() -> str:
    text = API.read_text()
    start = text.index("## Workers: the step protocol")
    return text[start : text.index("\n## ", start + 1)]


def documented_sequence() -> list[str]:
    """The calls of the page's sequence block, in order (`BeginStep(MODEL_CALL)` etc.)."""
    [block] = re.findall(r"```text\n(.*?)\n```", _section(), re.S)
    return [call.strip() for call in block.split("→")]


def numbered_steps() -> list[str]:
    """The first call each numbered step of the page names, in the steps' order."""
    items = re.split(r"\n(?=\d+\. )", _section())
    return [
        found.group(1)
        for item in items
        if re.match(r"\d+\. ", item) and (found := re.search(r"`(\w+)\(", item))
    ]


def test_the_numbered_steps_follow_the_documented_sequence() -> None:
    names = [call.partition("(")[0] for call in documented_sequence()]
    steps = numbered_steps()
    assert steps[:3] == ["AcquireRun", "Heartbeat", "BeginTurn"]
    # Each numbered step's call comes in the sequence after the previous step's.
    position = 0
    for name in steps:
        assert name in names[position:], (name, steps, names)
        position = names.index(name, position)
    # The completion checks come before EndTurn, which comes before FinishAttempt.
    assert names.index("EndTurn") > max(
        i for i, call in enumerate(documented_sequence()) if call == "BeginStep(COMPLETION_CHECK)"
    )


def test_the_documented_sequence_completes_a_run(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    state: dict[str, Any] = {}
    checks = iter(CHECKS)

    def begin(**kw: Any) -> None:
        state["step"] = stubs.worker.BeginStep(
            wpb.BeginStepRequest(fence=state["fence"], turn_id=state["turn"], **kw), timeout=T
        ).step

    calls = {
        "AcquireRun": lambda: state.update(fence=stubs.acquire().fence),
        "Heartbeat": lambda: stubs.worker.Heartbeat(
            wpb.HeartbeatRequest(fence=state["fence"]), timeout=T
        ),
        "BeginTurn": lambda: state.update(
            turn=stubs.worker.BeginTurn(
                wpb.BeginTurnRequest(fence=state["fence"]), timeout=T
            ).turn.id
        ),
        "BeginStep(MODEL_CALL)": lambda: begin(
            type=E.STEP_TYPE_MODEL_CALL, model_call=message_pb2.ModelCallSpec()
        ),
        "BeginStep(TOOL_CALL)": lambda: begin(
            type=E.STEP_TYPE_TOOL_CALL,
            tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="a.py")),
        ),
        "BeginStep(COMPLETION_CHECK)": lambda: begin(
            type=E.STEP_TYPE_COMPLETION_CHECK,
            completion_check=message_pb2.CompletionCheckSpec(check=next(checks)),
        ),
        "EndStep": lambda: stubs.worker.EndStep(
            wpb.EndStepRequest(
                fence=state["fence"], step_id=state["step"].id, status=E.STEP_STATUS_SUCCEEDED
            ),
            timeout=T,
        ),
        "EndTurn": lambda: stubs.worker.EndTurn(
            wpb.EndTurnRequest(fence=state["fence"], turn_id=state["turn"]), timeout=T
        ),
        "FinishAttempt(SUCCEEDED_COMPLETE_RUN)": lambda: state.update(
            finished=stubs.finish(state["fence"], E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
        ),
    }
    for call in documented_sequence():
        calls[call]()  # a call the page names and this test does not know fails here
    assert state["finished"].run.status == E.RUN_STATUS_COMPLETED
    assert get_run(stubs, run.id).status == E.RUN_STATUS_COMPLETED
    steps = list_steps(stubs, run.id)
    assert [s.type for s in steps] == [
        E.STEP_TYPE_MODEL_CALL,
        E.STEP_TYPE_TOOL_CALL,
        E.STEP_TYPE_COMPLETION_CHECK,
        E.STEP_TYPE_COMPLETION_CHECK,
    ]
    assert {s.status for s in steps} == {E.STEP_STATUS_SUCCEEDED}


def test_a_check_after_end_turn_is_refused_turn_not_open(stubs: Stubs) -> None:
    """The order the page used to give (EndTurn, then the checks) fails as it now says."""
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=T).turn
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn.id), timeout=T)
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        stubs.worker.BeginStep,
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn.id,
            type=E.STEP_TYPE_COMPLETION_CHECK,
            completion_check=message_pb2.CompletionCheckSpec(check=CHECKS[0]),
        ),
        timeout=T,
        reason="TURN_NOT_OPEN",
    )
