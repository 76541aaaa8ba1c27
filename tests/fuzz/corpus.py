"""Hand-picked hostile requests aimed at the witness: the shapes issue 14 found, sent on every
run so the short mode always reaches them however the generated part's sample falls.

Each is a valid request but for one hostile value, on the witness's real ids and live fence,
so it gets past every lookup to the code that handles that value.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.registry.v1 import message_pb2 as reg_messages
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests import registry_data

I64_MAX = 2**63 - 1


def _struct(**values: Any) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    for key, value in values.items():
        struct.fields[key].number_value = value
    return struct


def _tool_step(w: Any, **arguments: Any) -> wpb.BeginStepRequest:
    return wpb.BeginStepRequest(
        fence=w.fence,
        turn_id=w.turn_id,
        type=enum_pb2.STEP_TYPE_TOOL_CALL,
        tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=_struct(**arguments)),
    )


def send_all(session: Any) -> None:
    """Send the corpus through ``session`` (a :class:`~tests.fuzz.harness.FuzzSession`)."""
    w = session.witness
    rpcs = {rpc.name: rpc for rpc in session.rpcs}

    def send(name: str, *messages: Any) -> list[Any]:
        rpc = rpcs[name]
        answer = session.send(rpc, [m.SerializeToString() for m in messages], "issue 14 corpus")
        return [rpc.response_class().FromString(b) for b in answer.responses]

    bad_time = timestamp_pb2.Timestamp(seconds=253402300800)
    bad_nanos = timestamp_pb2.Timestamp(seconds=1, nanos=-1)
    huge = duration_pb2.Duration(seconds=2**62)
    # 1. a non-finite double in a step's arguments (it stopped the step writer for good)
    send("BeginStep", _tool_step(w, x=math.inf))
    send("BeginStep", _tool_step(w, path=math.nan))
    # 3. usage totals past int64, a non-finite cost
    for cost in (0.0, math.inf):
        for _ in range(2):
            begun = send("BeginStep", _tool_step(w))
            step_id = begun[0].step.id if begun else "stp_missing"
            send(
                "EndStep",
                wpb.EndStepRequest(
                    fence=w.fence,
                    step_id=step_id,
                    status=enum_pb2.STEP_STATUS_SUCCEEDED,
                    usage=message_pb2.Usage(input_tokens=I64_MAX, cost_usd=cost),
                ),
            )
    send("GetRun", pb.GetRunRequest(run_id=w.run_id))
    send("ExportBundle", apb.ExportBundleRequest(run_id=w.run_id))
    # 2. a second inline system prompt
    definition = registry_data.coding_definition(label="v1", agent_id="agent_b")
    definition.system_prompt.CopyFrom(reg_messages.SystemPrompt(text="You are agent B."))
    send("PublishAgentVersion", rpb.PublishAgentVersionRequest(definition=definition))
    # 5. timestamps and durations out of range, non-finite Struct numbers, NUL bytes
    thread_id = session.pool.candidates("thread_id")[0]
    goal = message_pb2.Goal(objective="o", extra=_struct(x=math.inf))
    send(
        "CreateRun",
        pb.CreateRunRequest(thread_id=thread_id, agent_ref="coding_agent:prod", goal=goal),
    )
    send(
        "CreateRun",
        pb.CreateRunRequest(
            thread_id=thread_id,
            agent_ref="coding_agent:prod",
            goal=message_pb2.Goal(objective="o"),
            deadline_time=bad_time,
        ),
    )
    for start in (bad_time, bad_nanos):
        send("FindUsages", apb.FindUsagesRequest(model_id="claude-sonnet-4", start_time=start))
    send(
        "AmendRun",
        pb.AmendRunRequest(
            run_id=w.run_id, amendment=message_pb2.Amendment(note="n", create_time=bad_time)
        ),
    )
    send("AcquireRun", wpb.AcquireRunRequest(worker_id="w9", wait=huge))
    send("AcquireRun", wpb.AcquireRunRequest(worker_id="w9", lease_ttl=huge))
    send(
        "AppendMessage",
        pb.AppendMessageRequest(
            thread_id=thread_id,
            role=enum_pb2.MESSAGE_ROLE_USER,
            content="c",
            data=_struct(x=math.nan),
        ),
    )
    send(
        "SendInput",
        pb.SendInputRequest(
            run_id=w.run_id, kind=enum_pb2.INPUT_KIND_STEER, content="c", data=_struct(x=math.inf)
        ),
    )
    send("CreateThread", pb.CreateThreadRequest(title="a\x00b"))
    send("GetRun", pb.GetRunRequest(run_id="run_\x00"))
    send("Heartbeat", wpb.HeartbeatRequest(fence=w.fence))
