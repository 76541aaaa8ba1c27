"""The tests' OTLP receiver (tests/otlp_receiver.py) receives what the real OpenTelemetry SDK
exports over OTLP/gRPC, and decodes it faithfully: a parent and child span with attributes of
every type, and a histogram and a counter. The SDK is the test's own (local providers, not the
global ones); its exporters connect to the receiver over loopback like a server process's would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, StatusCode

from tests import genai_registry
from tests.otlp_receiver import (
    OtlpReceiver,
    by_name,
    children,
    decode_value,
    format_points,
    format_tree,
    resource_of,
)

RESOURCE = Resource.create({"service.name": "otlp-receiver-test"})


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def test_the_receiver_is_an_endpoint_and_says_how_to_reach_it(rx: OtlpReceiver) -> None:
    assert rx.endpoint == f"http://127.0.0.1:{rx.port}" and rx.port > 0
    env = rx.env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == rx.endpoint
    assert env["OTEL_EXPORTER_OTLP_INSECURE"] == "true"
    assert int(env["OTEL_BSP_SCHEDULE_DELAY"]) <= 200
    assert int(env["OTEL_METRIC_EXPORT_INTERVAL"]) <= 500


def test_spans_exported_by_the_sdk_arrive_as_a_tree_with_their_attributes(
    rx: OtlpReceiver,
) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=rx.endpoint)))
    try:
        tracer = provider.get_tracer("tests.otlp")
        with tracer.start_as_current_span("invoke_agent coder", kind=SpanKind.SERVER) as parent:
            parent.set_attribute("gen_ai.operation.name", "invoke_agent")
            with tracer.start_as_current_span("execute_tool search") as child:
                child.set_attributes(
                    {
                        "a.string": "text",
                        "a.int": 42,
                        "a.double": 0.5,
                        "a.bool": True,
                        "a.strings": ["x", "y"],
                        "a.ints": [1, 2],
                    }
                )
                child.set_status(StatusCode.ERROR, "tool failed")
        assert provider.force_flush(5_000)
    finally:
        provider.shutdown()

    spans = rx.wait_for_spans(lambda spans: len(spans) == 2, timeout=5)
    (root,) = by_name(spans, "invoke_agent coder")
    (tool,) = children(spans, root)
    assert tool.name == "execute_tool search", format_tree(spans)

    assert root.parent_span_id == "" and len(root.trace_id) == 32 and len(root.span_id) == 16
    assert (tool.trace_id, tool.parent_span_id) == (root.trace_id, root.span_id)
    assert (root.kind, tool.kind) == ("SERVER", "INTERNAL")
    assert (root.status_code, tool.status_code, tool.status_message) == (
        "UNSET",
        "ERROR",
        "tool failed",
    )
    assert root.start_ns <= tool.start_ns <= tool.end_ns <= root.end_ns
    assert tool.attributes == {
        "a.string": "text",
        "a.int": 42,
        "a.double": 0.5,
        "a.bool": True,
        "a.strings": ("x", "y"),
        "a.ints": (1, 2),
    }
    assert type(tool.attributes["a.int"]) is int and type(tool.attributes["a.bool"]) is bool
    assert root.attributes == {"gen_ai.operation.name": "invoke_agent"}
    assert resource_of(spans)["service.name"] == "otlp-receiver-test"
    assert root.scope == "tests.otlp"
    assert format_tree(spans).splitlines()[1:] == [
        f"  invoke_agent coder [SERVER UNSET] span={root.span_id}",
        f"    execute_tool search [INTERNAL ERROR] span={tool.span_id}",
    ]


def test_a_wait_that_times_out_lists_what_did_arrive(rx: OtlpReceiver) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=rx.endpoint)))
    try:
        with provider.get_tracer("tests.otlp").start_as_current_span("lonely"):
            pass
        assert provider.force_flush(5_000)
    finally:
        provider.shutdown()
    rx.wait_for_spans(lambda spans: bool(spans), timeout=5)

    with pytest.raises(AssertionError, match=r"received 1 span\(s\):\ntrace \w{32}\n  lonely"):
        rx.wait_for_spans(lambda spans: bool(by_name(spans, "never")), timeout=0.2)
    with pytest.raises(AssertionError, match=r"metric never not received .*\n\(no metric"):
        rx.wait_for_metric("never", timeout=0.2)


def test_metrics_exported_by_the_sdk_arrive_as_points(rx: OtlpReceiver) -> None:
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=rx.endpoint), export_interval_millis=60_000
    )
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    try:
        meter = provider.get_meter("tests.otlp")
        duration = meter.create_histogram("gen_ai.execute_tool.duration", unit="s")
        calls = meter.create_counter("tests.tool.calls", unit="{call}")
        tool = {"gen_ai.tool.name": "search"}
        duration.record(0.25, tool)
        duration.record(0.75, tool)
        calls.add(2, {"outcome": "ok"})
        calls.add(1, {"outcome": "ok"})
        assert provider.force_flush(5_000)
    finally:
        provider.shutdown()

    # force_flush and shutdown may both export, cumulatively: the newest point is the total.
    rx.wait_for_metric("gen_ai.execute_tool.duration", timeout=5)
    (histogram,) = rx.latest("gen_ai.execute_tool.duration")
    assert (histogram.kind, histogram.instrument, histogram.unit) == ("histogram", "histogram", "s")
    assert (histogram.count, histogram.value) == (2, 1.0)
    assert histogram.attributes == tool and sum(histogram.bucket_counts) == 2
    assert histogram.resource["service.name"] == "otlp-receiver-test"
    assert (
        genai_registry.metric_problems(
            histogram.name, histogram.instrument, histogram.unit, histogram.attributes
        )
        == []
    ), format_points([histogram])

    (counter,) = rx.latest("tests.tool.calls")
    assert (counter.kind, counter.instrument, counter.monotonic) == ("sum", "counter", True)
    assert (counter.value, counter.attributes, counter.scope) == (
        3,
        {"outcome": "ok"},
        "tests.otlp",
    )


def test_every_kind_of_any_value_decodes() -> None:
    nested = common_pb2.AnyValue(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                common_pb2.KeyValue(key="b", value=common_pb2.AnyValue(bytes_value=b"\x00")),
                common_pb2.KeyValue(
                    key="a",
                    value=common_pb2.AnyValue(
                        array_value=common_pb2.ArrayValue(
                            values=[common_pb2.AnyValue(double_value=1.5), common_pb2.AnyValue()]
                        )
                    ),
                ),
            ]
        )
    )
    assert decode_value(nested) == {"b": b"\x00", "a": (1.5, None)}
