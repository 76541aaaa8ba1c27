"""An event's hash recomputes from its wire form by the documented rule alone (issue 17,
item 12): tests/vectors/event.json, and the dotted name of every EventType."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rfc8785

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core import event_chain
from tests import event_rule

_VECTORS = sorted((Path(__file__).resolve().parents[1] / "vectors").glob("event*.json"))


def test_there_is_a_set_of_event_vectors() -> None:
    assert len(_VECTORS) >= 5


@pytest.mark.parametrize("path", _VECTORS, ids=lambda p: p.stem)
def test_the_event_vector_recomputes_by_the_documented_rule(path: Path) -> None:
    vector = json.loads(path.read_text(encoding="utf-8"))
    document = event_rule.event_document(vector["input"])
    assert rfc8785.dumps(document).decode("utf-8") == vector["canonical"]
    assert event_rule.event_hash(vector["input"]) == vector["digest"] == vector["input"]["hash"]


def test_the_rule_gives_the_name_the_runtime_hashes_for_every_event_type() -> None:
    oneof = event_pb2.Event.DESCRIPTOR.oneofs_by_name["attributes"]
    members = {f.name: f.message_type for f in oneof.fields}
    names = [v.name for v in enum_pb2.EventType.DESCRIPTOR.values if v.number != 0]
    assert len(names) == len(members) >= 21
    for name in names:
        # EVENT_TYPE_RUN_STATUS_CHANGED is the event whose attributes member is
        # run_status_changed_attributes (a RunStatusChangedAttributes).
        member = name.removeprefix("EVENT_TYPE_").lower() + "_attributes"
        message = getattr(event_pb2, members[member].name)()
        assert event_rule.dotted_event_type(name) == event_chain.event_type_name(message), name
    assert event_rule.dotted_event_type("EVENT_TYPE_THREAD_MESSAGE_APPENDED") == (
        "thread.message_appended"
    )


def test_the_wire_time_is_rewritten_with_six_fractional_digits() -> None:
    assert event_rule.hashed_time("2026-01-02T03:04:05Z") == "2026-01-02T03:04:05.000000Z"
    assert event_rule.hashed_time("2026-01-02T03:04:05.120Z") == "2026-01-02T03:04:05.120000Z"
    assert event_rule.hashed_time("2026-01-02T03:04:05.123456Z") == ("2026-01-02T03:04:05.123456Z")
