"""Hostile requests answer INVALID_ARGUMENT (or RESOURCE_EXHAUSTED) naming the field, change
nothing, and never reach domain code as an exception: each case here answered UNKNOWN or
INTERNAL before the request checks of ``agentrt_base.wire`` (issue 14, defects 3-5).

Through a real server on both engines; requests that no generated client can build are
encoded by hand and sent as raw bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from grpc_health.v1 import health_pb2

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import T, Worker, expect, start, violations
from tests.support import error_details

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def raw(stubs: Stubs, method: str, body: bytes) -> grpc.RpcError:
    """Send ``body`` as the request of ``method`` and return the error it must answer."""
    call = stubs.channel.unary_unary(method)
    with pytest.raises(grpc.RpcError) as info:
        call(body, timeout=T)
    return info.value


def nested_value(depth: int) -> struct_pb2.Value:
    value = struct_pb2.Value()
    inner = value
    for _ in range(depth):
        inner = inner.list_value.values.add()
    inner.number_value = 1
    return value


def bad_double(value: float) -> struct_pb2.Struct:
    found = struct_pb2.Struct()
    found.fields["x"].number_value = value
    return found


# -- bytes that do not decode -------------------------------------------------------------


def test_invalid_utf8_names_the_field(stubs: Stubs) -> None:
    error = raw(stubs, "/agentrt.runtime.v1.RuntimeService/GetRun", bytes.fromhex("0a02c328"))
    assert error.code() == INVALID, (error.code(), error.details())
    details = error_details(error)
    assert details["ErrorInfo"].reason == "MALFORMED_REQUEST"
    assert violations(details) == ["run_id"]


def test_nesting_deeper_than_protobuf_decodes_is_refused(stubs: Stubs) -> None:
    request = pb.AppendMessageRequest(thread_id="thr_x")
    request.data.fields["deep"].CopyFrom(nested_value(120))
    error = raw(
        stubs, "/agentrt.runtime.v1.RuntimeService/AppendMessage", request.SerializeToString()
    )
    assert error.code() == INVALID, (error.code(), error.details())
    assert error_details(error)["ErrorInfo"].reason == "MALFORMED_REQUEST"


def test_undecodable_chunk_in_a_client_stream(stubs: Stubs) -> None:
    call = stubs.channel.stream_unary("/agentrt.runtime.v1.RuntimeService/PutBlob")
    with pytest.raises(grpc.RpcError) as info:
        call(iter([bytes.fromhex("0a040a01ff")]), timeout=T)
    assert info.value.code() == INVALID, (info.value.code(), info.value.details())
    # The header's length runs past its end.
    assert violations(error_details(info.value)) == ["header"]


def test_health_check_with_undecodable_bytes(stubs: Stubs) -> None:
    # The health service keeps its own conventions but must not answer UNKNOWN.
    error = raw(stubs, "/grpc.health.v1.Health/Check", bytes.fromhex("0a02c328"))
    assert error.code() == INVALID, (error.code(), error.details())
    ok = stubs.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )(health_pb2.HealthCheckRequest(), timeout=T)
    assert ok.status == health_pb2.HealthCheckResponse.SERVING


# -- values no field of their type may hold -----------------------------------------------


def test_nul_characters_are_refused_everywhere(stubs: Stubs) -> None:
    details = expect(INVALID, stubs.runtime.CreateThread, pb.CreateThreadRequest(title="a\0b"))
    assert violations(details) == ["title"]
    details = expect(INVALID, stubs.runtime.GetRun, pb.GetRunRequest(run_id="run_\0"))
    assert violations(details) == ["run_id"]
    details = expect(
        INVALID,
        stubs.runtime.CreateThread,
        pb.CreateThreadRequest(title="t", metadata={"k\0": "v", "k": "v\0"}),
    )
    assert sorted(violations(details)) == ["metadata", 'metadata["k"]']
    assert stubs.runtime.ListThreads(pb.ListThreadsRequest(), timeout=T).threads == []


def test_non_finite_numbers_in_structs(stubs: Stubs) -> None:
    thread = stubs.thread()
    for value in (float("inf"), float("-inf"), float("nan")):
        message = pb.AppendMessageRequest(
            thread_id=thread.id,
            role=enum_pb2.MESSAGE_ROLE_USER,
            content="c",
            data=bad_double(value),
        )
        details = expect(INVALID, stubs.runtime.AppendMessage, message)
        assert violations(details) == ['data["x"]']
    goal = message_pb2.Goal(objective="o")
    goal.extra.fields["list"].list_value.values.add().number_value = float("inf")
    details = expect(
        INVALID,
        stubs.runtime.CreateRun,
        pb.CreateRunRequest(thread_id=thread.id, agent_ref="coding_agent:prod", goal=goal),
    )
    assert violations(details) == ['goal.extra["list"][0]']
    listed = stubs.runtime.ListMessages(pb.ListMessagesRequest(thread_id=thread.id), timeout=T)
    assert list(listed.messages) == []


def test_timestamps_out_of_range(stubs: Stubs) -> None:
    stubs.publish_agent()
    thread = stubs.thread()
    late = timestamp_pb2.Timestamp(seconds=253402300800)
    details = expect(
        INVALID,
        stubs.runtime.CreateRun,
        pb.CreateRunRequest(
            thread_id=thread.id,
            agent_ref="coding_agent:prod",
            goal=message_pb2.Goal(objective="o"),
            deadline_time=late,
        ),
    )
    assert violations(details) == ["deadline_time"]
    bad_nanos = timestamp_pb2.Timestamp(seconds=1, nanos=-1)
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    details = expect(
        INVALID,
        audit.FindUsages,
        apb.FindUsagesRequest(model_id="m", start_time=bad_nanos, end_time=late),
    )
    assert violations(details) == ["start_time", "end_time"]
    run = stubs.run(thread.id)
    details = expect(
        INVALID,
        stubs.runtime.AmendRun,
        pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(note="n", create_time=late),
        ),
    )
    assert violations(details) == ["amendment.create_time"]
    assert stubs.runtime.GetRun(pb.GetRunRequest(run_id=run.id)).run.input_revision == (
        run.input_revision
    )


def test_durations_out_of_range(stubs: Stubs) -> None:
    huge = duration_pb2.Duration(seconds=2**62)
    details = expect(
        INVALID, stubs.worker.AcquireRun, wpb.AcquireRunRequest(worker_id="w", wait=huge)
    )
    assert violations(details) == ["wait"]
    mixed = duration_pb2.Duration(seconds=1, nanos=-5)
    details = expect(
        INVALID, stubs.worker.AcquireRun, wpb.AcquireRunRequest(worker_id="w", lease_ttl=mixed)
    )
    assert violations(details) == ["lease_ttl"]


def test_longest_durations_are_clamped_not_failed(stubs: Stubs) -> None:
    # Valid Durations (10,000 years) that no datetime arithmetic survives unclamped.
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    longest = duration_pb2.Duration(seconds=315_576_000_000)
    got = stubs.worker.AcquireRun(
        wpb.AcquireRunRequest(worker_id="w", wait=longest, lease_ttl=longest), timeout=T
    )
    assert got.HasField("run")
    lease = got.attempt.lease_expire_time.ToDatetime() - got.attempt.start_time.ToDatetime()
    assert lease.days < 1


# -- page tokens --------------------------------------------------------------------------


def tampered(token: str, key: Any) -> str:
    """A token the server issued with its position replaced (its filter fingerprint kept, so
    only the position can be at fault)."""
    decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    decoded["k"] = key
    return base64.urlsafe_b64encode(json.dumps(decoded).encode()).decode().rstrip("=")


#: Positions no list's key has (a well-shaped position that matches no row is just a page).
TAMPERED_KEYS: list[Any] = [
    [],
    [None, None],
    [{"a": 1}, [1]],
    [2**70, 2**70],
    [2**70],
    [True],
    ["\0"],
    ["x", "y", "z", "w"],
    ["not a time", "x", "y"],
]


def test_tampered_page_tokens(stubs: Stubs) -> None:
    worker = start(stubs)
    stubs.registry.SetTag(
        rpb.SetTagRequest(
            agent_id="coding_agent", tag="canary", digest=worker.acquired.agent.agent_digest
        )
    )
    for _ in range(2):
        worker.end(worker.model().step.id)
    stubs.thread()
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    run_id, thread_id = worker.run_id, worker.acquired.run.thread_id
    lists: dict[str, Callable[[str], Any]] = {
        "ListThreads": lambda t: stubs.runtime.ListThreads(
            pb.ListThreadsRequest(page_size=1, page_token=t), timeout=T
        ),
        "ListSteps": lambda t: stubs.runtime.ListSteps(
            pb.ListStepsRequest(run_id=run_id, page_size=1, page_token=t), timeout=T
        ),
        "ListComponents": lambda t: stubs.registry.ListComponents(
            rpb.ListComponentsRequest(page_size=1, page_token=t), timeout=T
        ),
        "ListTags": lambda t: stubs.registry.ListTags(
            rpb.ListTagsRequest(page_size=1, page_token=t), timeout=T
        ),
        "ListTagHistory": lambda t: stubs.registry.ListTagHistory(
            rpb.ListTagHistoryRequest(agent_id="coding_agent", page_size=1, page_token=t),
            timeout=T,
        ),
    }
    model = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=run_id), timeout=T).steps[0]
    lists["FindUsages"] = lambda t: audit.FindUsages(
        apb.FindUsagesRequest(
            model_id=model.versions.model.requested_model_id, page_size=1, page_token=t
        ),
        timeout=T,
    )
    assert thread_id
    for name, call in lists.items():
        token = call("").next_page_token
        assert token, f"{name} gave no second page"
        call(token)  # the real token works
        for key in TAMPERED_KEYS:
            for bad in ("garbage!", tampered(token, key)):
                with pytest.raises(grpc.RpcError) as info:
                    call(bad)
                assert info.value.code() == INVALID, (name, key, info.value.details())
                assert violations(error_details(info.value)) == ["page_token"]


# -- usage totals -------------------------------------------------------------------------


def test_usage_beyond_what_a_step_can_use_is_refused(stubs: Stubs) -> None:
    worker: Worker = start(stubs)
    for usage, field in (
        (message_pb2.Usage(input_tokens=2**63 - 1), "usage.input_tokens"),
        (message_pb2.Usage(output_tokens=2**63 - 1), "usage.output_tokens"),
        (message_pb2.Usage(cost_usd=1e300), "usage.cost_usd"),
        (message_pb2.Usage(cost_usd=float("inf")), "usage.cost_usd"),
    ):
        step = worker.model(key=field + str(usage.cost_usd)).step
        details = expect(
            INVALID,
            stubs.worker.EndStep,
            wpb.EndStepRequest(
                fence=worker.fence,
                step_id=step.id,
                status=enum_pb2.STEP_STATUS_SUCCEEDED,
                usage=usage,
            ),
        )
        assert violations(details) == [field]
        worker.end(step.id, usage=message_pb2.Usage(input_tokens=10, cost_usd=0.5))
    run = stubs.runtime.GetRun(pb.GetRunRequest(run_id=worker.run_id)).run
    assert (run.usage.input_tokens, run.usage.cost_usd) == (40, 2.0)
    assert worker.complete().run.status == enum_pb2.RUN_STATUS_COMPLETED


def test_errors_echo_a_bounded_part_of_the_request(stubs: Stubs) -> None:
    # The answer quoted the whole id: its trailers passed the client's 16 KiB metadata limit
    # and the caller read RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead. Four-
    # byte characters cost most (percent-encoded in grpc-message): the fuzzer's 🦀 x 1000.
    for huge in ("run_" + "x" * 100_000, "🦀" * 1000):
        for _ in range(20):  # past 8 KiB a client refuses trailers at random
            details = expect(
                grpc.StatusCode.NOT_FOUND, stubs.runtime.GetRun, pb.GetRunRequest(run_id=huge)
            )
            assert huge.startswith(details["ResourceInfo"].resource_name.rstrip("…"))
            assert len(details["ResourceInfo"].resource_name.encode()) <= 160
    many = pb.CreateThreadRequest(title="t", metadata={f"k{i}🦀\0": "v" for i in range(50)})
    for _ in range(20):  # past 8 KiB a client refuses trailers at random: never here
        details = expect(INVALID, stubs.runtime.CreateThread, many)
    # Every violation that fits the trailer's budget travels (here all 50: each names its
    # key and fits in well under 100 bytes); the budget keeps the trailer under the limit.
    sent = violations(details)
    assert 0 < len(sent) <= 50
    assert details["BadRequest"].ByteSize() <= 3000
    assert len(sent) == 50 or details["ErrorInfo"].metadata["violation_count"] == "50"
