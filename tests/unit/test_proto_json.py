"""The one module of proto ⇄ JSON/enum/time rules (agentrt_core.proto_json)."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core.canonical import CanonicalError, component_document
from agentrt_core.errors import InvalidArgument
from agentrt_core.jcs import canonical_bytes
from agentrt_core.proto_json import (
    MAX_SAFE_INTEGER,
    NonFiniteNumber,
    display_name,
    duration_or_none,
    enum_name,
    enum_value,
    json_number,
    json_numbers,
    json_to_struct,
    message_json,
    short_name,
    struct_to_json,
    time_or_none,
    to_timestamp,
)

VECTORS = Path(__file__).parents[1] / "vectors"


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (42.0, 42),
        (-7.0, -7),
        (-0.0, 0),
        (float(MAX_SAFE_INTEGER), MAX_SAFE_INTEGER),
        (-float(MAX_SAFE_INTEGER), -MAX_SAFE_INTEGER),
        (1.5, 1.5),
        (2.0**53, 2.0**53),  # one past the safe range: a double, not the integer 2**53
        (2.0**53 + 2, 2.0**53 + 2),
        (1e300, 1e300),
        (5e-324, 5e-324),
    ],
)
def test_the_number_rule(number: float, expected: float) -> None:
    got = json_number(number)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_with_their_place(number: float) -> None:
    struct = json_to_struct({"a": [1, {"b": number}]})
    with pytest.raises(NonFiniteNumber) as caught:
        struct_to_json(struct)
    assert caught.value.path == '["a"][1]["b"]'
    assert '["a"][1]["b"]' in str(caught.value)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(NonFiniteNumber) as caught:
        json_numbers({"x": [number]})
    assert caught.value.path == '["x"][0]'


def test_struct_to_json_reads_every_kind_of_value() -> None:
    data = {
        "int": 42,
        "whole": 7.0,
        "half": 0.5,
        "big": 2.0**60,
        "s": "42.0",
        "t": True,
        "n": None,
        "list": [1, [2.0, {"deep": 3.0}]],
        "obj": {},
    }
    got = struct_to_json(json_to_struct(data))
    assert got == data
    assert type(got["int"]) is int and type(got["whole"]) is int
    assert type(got["big"]) is float
    assert type(got["list"][1][1]["deep"]) is int
    assert got["t"] is True
    assert struct_to_json(struct_pb2.Struct()) == {}
    unset = struct_pb2.Struct()
    unset.fields["v"].CopyFrom(struct_pb2.Value())  # a Value with no kind set reads as null
    assert struct_to_json(unset) == {"v": None}


def test_json_numbers_applies_the_same_rule_to_plain_json() -> None:
    value = {"a": [42.0, -0.0, 1.5, 2.0**60, "42.0", True, 3], "b": ({"c": 7.0},)}
    got = json_numbers(value)
    assert got == {"a": [42, 0, 1.5, 2.0**60, "42.0", True, 3], "b": [{"c": 7}]}
    assert [type(v) for v in got["a"]] == [int, int, float, float, str, bool, int]


def test_struct_numbers_vector_pins_what_the_digests_see() -> None:
    """The vector's input holds the doubles a Struct carries; read by the rule they digest
    exactly as the vector says (the Node client checks the same file). Read as integers, the
    doubles beyond 2**53 - 1 would be refused: the rule's bound is the digests' bound."""
    vector = json.loads((VECTORS / "struct_numbers.json").read_text())
    inputs = vector["input"]
    read = struct_to_json(json_to_struct(inputs["spec"]["input_schema"]))
    assert type(read["whole"]) is int and type(read["max_safe"]) is int
    assert type(read["two_pow_53"]) is float and type(read["two_pow_53_plus_2"]) is float
    document = component_document(**{**inputs, "spec": {"input_schema": read}})
    assert canonical_bytes(document).decode() == vector["canonical"]
    as_ints = {**read, "two_pow_53": int(read["two_pow_53"])}
    with pytest.raises(CanonicalError):
        component_document(**{**inputs, "spec": {"input_schema": as_ints}})


def test_short_names_strip_the_prefix_and_refuse_unknown_numbers() -> None:
    assert short_name(enum_pb2.RunStatus, "RUN_STATUS_", enum_pb2.RUN_STATUS_QUEUED, "s") == (
        "QUEUED"
    )
    assert short_name(enum_pb2.RunStatus, "RUN_STATUS_", 0, "s") == "UNSPECIFIED"
    with pytest.raises(InvalidArgument) as caught:
        short_name(enum_pb2.RunStatus, "RUN_STATUS_", 99, "statuses[2]")
    assert caught.value.violations[0].field == "statuses[2]"
    assert "unknown enum value 99" in caught.value.violations[0].description


def test_enum_name_reads_unspecified_as_not_given() -> None:
    assert enum_name(enum_pb2.ErrorClass, "ERROR_CLASS_", 0, "error_class") == ""
    with pytest.raises(InvalidArgument) as caught:
        enum_name(enum_pb2.ErrorClass, "ERROR_CLASS_", 0, "error_class", required=True)
    assert caught.value.violations[0].field == "error_class"
    rate = enum_pb2.ERROR_CLASS_RATE_LIMITED
    assert enum_name(enum_pb2.ErrorClass, "ERROR_CLASS_", rate, "e") == "RATE_LIMITED"
    with pytest.raises(InvalidArgument):
        enum_name(enum_pb2.ErrorClass, "ERROR_CLASS_", 12345, "e")


def test_enum_value_is_the_inverse() -> None:
    for name, number in enum_pb2.RunStatus.items():
        short = name.removeprefix("RUN_STATUS_")
        assert enum_value(enum_pb2.RunStatus, "RUN_STATUS_", short) == number
        assert short_name(enum_pb2.RunStatus, "RUN_STATUS_", number, "s") == short
    assert enum_value(enum_pb2.RunStatus, "RUN_STATUS_", "") == 0
    with pytest.raises(ValueError):
        enum_value(enum_pb2.RunStatus, "RUN_STATUS_", "NOT_A_STATUS")


def test_naive_datetimes_are_utc_and_aware_ones_keep_their_instant() -> None:
    naive = dt.datetime(2026, 12, 4, 9, 30, 1, 123456)
    aware = naive.replace(tzinfo=dt.UTC)
    elsewhere = aware.astimezone(dt.timezone(dt.timedelta(hours=-5, minutes=-30)))
    reference = timestamp_pb2.Timestamp()
    reference.FromDatetime(aware)
    assert to_timestamp(naive) == to_timestamp(aware) == to_timestamp(elsewhere) == reference
    assert reference.nanos == 123_456_000
    before_epoch = dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=dt.UTC)
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(before_epoch)
    assert to_timestamp(before_epoch) == expected


def test_timestamps_read_back_as_aware_utc() -> None:
    request = pb.CreateRunRequest()
    assert time_or_none(request, "deadline_time") is None
    moment = dt.datetime(2026, 12, 4, 9, 30, 1, 123456, tzinfo=dt.UTC)
    request.deadline_time.CopyFrom(to_timestamp(moment))
    got = time_or_none(request, "deadline_time")
    assert got == moment and got is not None and got.tzinfo is dt.UTC


def test_durations_are_optional_and_never_negative() -> None:
    request = wpb.AcquireRunRequest()
    assert duration_or_none(request, "wait") is None
    request.wait.CopyFrom(duration_pb2.Duration(seconds=2, nanos=500_000_000))
    assert duration_or_none(request, "wait") == dt.timedelta(seconds=2.5)
    request.wait.CopyFrom(duration_pb2.Duration(seconds=-1))
    with pytest.raises(InvalidArgument) as caught:
        duration_or_none(request, "wait")
    assert caught.value.violations[0].field == "wait"


def test_message_structs_keep_protobufs_own_mapping() -> None:
    goal = message_pb2.Goal(objective="o")
    goal.extra.update({"n": 1})
    assert message_json(goal) == {"objective": "o", "extra": {"n": 1.0}}


def test_display_names_are_short_and_never_refuse_a_newer_value() -> None:
    from agentrt.runtime.v1 import enum_pb2 as runtime_enums

    run_status = runtime_enums.RunStatus
    assert display_name(run_status, run_status.Value("RUN_STATUS_WAITING_APPROVAL")) == (
        "WAITING_APPROVAL"
    )
    assert display_name(run_status, 0) == "UNSPECIFIED"
    # A value a newer server may send and this client does not know: shown, not raised.
    assert display_name(run_status, 999) == "999"
    # A field's enum descriptor works as the generated wrapper does.
    descriptor = run_status.DESCRIPTOR
    assert display_name(descriptor, run_status.Value("RUN_STATUS_FAILED")) == "FAILED"
