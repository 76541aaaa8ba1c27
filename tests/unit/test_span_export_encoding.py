"""The exporter process's encoding of the server's span tuples (``span_export._tuple_exporter``):
a small attribute set encoded once and copied into later spans gives the same OTLP as encoding
it anew, and values equal in Python but of different types stay apart."""

from __future__ import annotations

from typing import Any

from agentrt_base.span_export import Finished, _tuple_exporter


def finished(span_id: int, attributes: dict[str, Any]) -> Finished:
    return ("n", 1 << 100, span_id, 0, False, 1, "", 1, 1_000, 2_000, attributes, False, "s")


def encoded(spans: list[Finished]) -> list[dict[str, Any]]:
    request = _tuple_exporter("1.0")._translate_data(spans)
    [resource] = request.resource_spans
    [scope] = resource.scope_spans
    return [
        {
            kv.key: (kv.value.WhichOneof("value"), getattr(kv.value, kv.value.WhichOneof("value")))
            for kv in span.attributes
        }
        for span in scope.spans
    ]


def test_a_recurring_attribute_set_encodes_as_a_fresh_one() -> None:
    small = {
        "rpc.system.name": "grpc",
        "rpc.method": "agentrt.X/Y",
        "rpc.response.status_code": "OK",
    }
    many = {**small, "a": 1, "b": 2.5, "c": True, "d": "x"}
    spans = [finished(i + 1, dict(small)) for i in range(3)] + [finished(9, many)] * 2
    assert (
        encoded(spans)
        == [{key: ("string_value", value) for key, value in small.items()}] * 3
        + [
            {
                **{key: ("string_value", value) for key, value in small.items()},
                "a": ("int_value", 1),
                "b": ("double_value", 2.5),
                "c": ("bool_value", True),
                "d": ("string_value", "x"),
            }
        ]
        * 2
    )


def test_equal_values_of_other_types_stay_apart() -> None:
    spans = [finished(1, {"x": True}), finished(2, {"x": 1}), finished(3, {"x": 1.0})]
    assert encoded(spans) == [
        {"x": ("bool_value", True)},
        {"x": ("int_value", 1)},
        {"x": ("double_value", 1.0)},
    ]


def test_an_unhashable_value_is_encoded_without_the_cache() -> None:
    assert encoded([finished(1, {"x": ["a", "b"]})]) == [
        {"x": ("array_value", encoded_array(["a", "b"]))}
    ]


def encoded_array(values: list[str]) -> Any:
    from opentelemetry.proto.common.v1 import common_pb2

    array = common_pb2.ArrayValue()
    for value in values:
        array.values.add(string_value=value)
    return array
