from __future__ import annotations

from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from tests.runtime_support import Stubs


def test_smoke(stubs: Stubs) -> None:
    digest = stubs.publish_agent()
    thread = stubs.thread()
    run = stubs.run(thread.id)
    assert run.agent.agent_digest == digest
    assert run.status == enum_pb2.RUN_STATUS_QUEUED
    got = stubs.acquire()
    assert got.run.id == run.id and got.attempt.number == 1
    done = stubs.complete(got.fence, result_summary="ok")
    assert done.run.status == enum_pb2.RUN_STATUS_COMPLETED
    events = list(stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run.id), timeout=5))
    assert [e.event.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event.event_type == enum_pb2.EVENT_TYPE_RUN_ENDED
