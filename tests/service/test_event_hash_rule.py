"""Every event a watcher receives recomputes to its hash by the rule docs/audit.md states
(issue 17, item 12), on both engines: the dotted name derived from the EventType name, the
time with six fractional digits, the attributes member as received."""

from __future__ import annotations

from google.protobuf import json_format

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from tests import event_rule
from tests.runtime_support import Stubs
from tests.service.steps_support import FAILED, T, events, start


def test_the_events_of_a_run_and_its_thread_recompute_from_the_wire(stubs: Stubs) -> None:
    w = start(stubs)
    model = w.model("m1", estimated_input_tokens=10).step
    w.end(model.id, FAILED, error_class=E.ERROR_CLASS_RATE_LIMITED)
    tool = w.tool("read_file", "t1", path="README.md").step
    w.end(tool.id)
    for check in ("tests-pass", "diff-reviewed"):
        w.check(check)
    w.end_turn()
    w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)

    found = events(stubs, w.run_id)
    thread_id = found[0].thread_id
    stream = stubs.runtime.WatchThread(pb.WatchThreadRequest(thread_id=thread_id), timeout=T)
    thread_events = []
    for response in stream:
        thread_events.append(response.event)
        if response.event.event_type == E.EVENT_TYPE_RUN_ENDED:
            break
    stream.cancel()

    kinds = {e.event_type for e in found + thread_events}
    assert {
        E.EVENT_TYPE_THREAD_CREATED,
        E.EVENT_TYPE_RUN_CREATED,
        E.EVENT_TYPE_RUN_STATUS_CHANGED,
        E.EVENT_TYPE_ATTEMPT_STARTED,
        E.EVENT_TYPE_TURN_STARTED,
        E.EVENT_TYPE_STEP_STARTED,
        E.EVENT_TYPE_STEP_ENDED,
        E.EVENT_TYPE_TURN_ENDED,
        E.EVENT_TYPE_RUN_ENDED,
    } <= kinds
    assert any(e.run_id == "" for e in thread_events)  # the thread's own chain too
    for event in found + thread_events:
        wire = json_format.MessageToDict(event, preserving_proto_field_name=True)
        assert event_rule.event_hash(wire) == event.hash, wire
