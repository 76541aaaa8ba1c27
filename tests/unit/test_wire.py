"""The request checks of ``agentrt_base.wire``: the fast check and the walk that names fields
must agree on every message (the walk only runs when the fast check says no), and undecodable
bytes are traced to their field."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base import wire
from agentrt_core.errors import FieldViolation, InvalidArgument

texts = st.one_of(st.text(max_size=8), st.sampled_from(["\0", "a\0", "ok", ""]))
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e308, -1.5])
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=12,
)
seconds = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(
        [wire.TIMESTAMP_MIN_SECONDS, wire.TIMESTAMP_MAX_SECONDS, wire.DURATION_MAX_SECONDS, 0]
    ),
)
nanos = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 999_999_999, -1]))


@st.composite
def requests(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["begin", "end", "usages", "create"]))
    if kind == "begin":
        begin = wpb.BeginStepRequest(turn_id=draw(texts), idempotency_key=draw(texts))
        begin.fence.attempt_id = draw(texts)
        begin.tool_call.tool = draw(texts)
        begin.tool_call.arguments.update(draw(st.dictionaries(texts, json_values, max_size=3)))
        return begin
    if kind == "end":
        return wpb.EndStepRequest(
            step_id=draw(texts), usage=message_pb2.Usage(cost_usd=draw(numbers))
        )
    if kind == "usages":
        usages = apb.FindUsagesRequest(model_id=draw(texts))
        if draw(st.booleans()):
            usages.start_time.CopyFrom(
                timestamp_pb2.Timestamp(seconds=draw(seconds), nanos=draw(nanos))
            )
        return usages
    return pb.CreateThreadRequest(
        title=draw(texts), metadata=draw(st.dictionaries(texts, texts, max_size=3))
    )


def named(message: Any) -> list[str]:
    problems: list[FieldViolation] = []
    wire._walk(message, "", problems)
    return [p.field for p in problems]


@settings(max_examples=400, deadline=None)
@given(requests())
def test_the_fast_check_and_the_naming_walk_agree(request: Any) -> None:
    fast = wire._valid(request)
    assert fast == (named(request) == []), (request, named(request))
    if fast:
        wire.check_request(request)
    else:
        with pytest.raises(InvalidArgument) as info:
            wire.check_request(request)
        assert info.value.violations


@settings(max_examples=300, deadline=None)
@given(seconds, nanos)
def test_durations_follow_their_definition(s: int, n: int) -> None:
    request = wpb.AcquireRunRequest(wait=duration_pb2.Duration(seconds=s, nanos=n))
    in_range = abs(s) <= 315_576_000_000 and abs(n) < 10**9 and not (s * n < 0)
    assert wire._valid(request) == in_range
    if in_range:  # what the definition allows, Python converts
        assert math.isfinite(request.wait.ToTimedelta().total_seconds())


def test_undecodable_bytes_are_traced_to_their_field() -> None:
    deserialize = wire.guard_deserializer(wpb.BeginStepRequest.FromString)
    good = wpb.BeginStepRequest(turn_id="t")
    good.tool_call.tool = "read_file"
    assert deserialize(good.SerializeToString()) == good
    # The tool name turned into invalid UTF-8.
    body = bytearray(good.SerializeToString())
    body[body.index(b"read_file")] = 0xFF
    found = deserialize(bytes(body))
    assert isinstance(found, wire.Undecodable)
    assert (found.field, found.reason) == ("tool_call.tool", "not valid UTF-8")
    truncated = deserialize(good.SerializeToString()[:-2])
    assert isinstance(truncated, wire.Undecodable) and truncated.field == "tool_call"
