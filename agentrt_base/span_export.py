"""The span exporter process: ``python -m agentrt_base.span_export VERSION``.

The server records each finished span as a plain tuple (``agentrt_base.tracing``), and each
value of its OTLP metrics, and writes them, batched, to this process's standard input; here
the measurements are recorded with the SDK's meter and exported periodically, and the spans
are encoded as OTLP protobuf and sent by the OpenTelemetry SDK's OTLP/gRPC span exporter.
Both exporters read their settings (endpoint, headers, certificates, compression, timeout,
interval) from the ``OTEL_*`` variables as they would anywhere and retry as they always do.
The work that costs is done here, on a process and an interpreter lock of its own, not on
the server's event loop: measured, the SDK's spans made and exported in the server took the
step path to 0.63x of its untraced throughput.

The exporter's encoder is replaced (:class:`_TupleExporter` overrides its
``_translate_data`` hook): the SDK's turns its ``ReadableSpan`` objects into protobuf at
about 16 µs a span; the tuples are encoded straight into the ``opentelemetry-proto``
messages at about 5 µs (``bench/results/steps.md``, "Issue 29"). The message is the same
OTLP: resource, scope, ids, parent, kind, times, attributes, status, and the flags saying
whether the parent was remote.

The frames are length-prefixed pickles written by the server that started this process (a
pipe only it holds; nothing else can write to it). It ignores SIGINT and SIGTERM: a Ctrl-C
reaches the whole process group, and this process must outlive the server's last spans. It
exits when its input ends (the server closed it, or died), after exporting what it holds.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Final

#: A frame's header: the pickle's length (big-endian, 4 bytes).
HEADER: Final = struct.Struct(">I")

#: One finished span, as the server records it: (name, trace_id, span_id, parent_span_id
#: (0: a root), parent_is_remote, trace_flags, trace_state (W3C tracestate header, "" for
#: none), kind (SpanKind value), start_ns, end_ns, attributes, error (status ERROR), scope).
Finished = tuple[str, int, int, int, bool, int, str, int, int, int, dict[str, Any], bool, str]
#: One value of a histogram exported over OTLP: (name, unit, description, bucket bounds,
#: value, attributes).
Measured = tuple[str, str, str, tuple[float, ...], float, dict[str, Any]]
#: What one frame carries: the spans and the measurements recorded since the last.
Frame = tuple[list[Finished], list[Measured]]

#: Spans per export request at most (OTEL_BSP_MAX_EXPORT_BATCH_SIZE's meaning, default 512).
_BATCH_VARIABLE: Final = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"


def frames(stream: BinaryIO) -> Iterator[Frame]:
    """The batches on ``stream``, until it ends."""
    while True:
        header = stream.read(HEADER.size)
        if len(header) < HEADER.size:
            return
        (size,) = HEADER.unpack(header)
        body = stream.read(size)
        if len(body) < size:
            return
        yield pickle.loads(body)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="agentrt span exporter: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else ""
    from agentrt_core.otel_env import exports

    exporter = _tuple_exporter(version) if exports(os.environ, "traces") else None
    meter = _Meter(version) if exports(os.environ, "metrics") else None
    size = max(1, int(os.environ.get(_BATCH_VARIABLE, "") or 512))
    try:
        for spans, measured in frames(sys.stdin.buffer):
            if meter is not None:
                meter.record(measured)
            if exporter is not None:
                for start in range(0, len(spans), size):
                    exporter.export(spans[start : start + size])
    finally:
        if exporter is not None:
            exporter.shutdown()
        if meter is not None:
            meter.shutdown()
    return 0


class _Meter:
    """The SDK's meter and its periodic OTLP/gRPC export (``OTEL_METRIC_EXPORT_INTERVAL``),
    recording the histograms the server measured."""

    def __init__(self, version: str) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        from agentrt_base.tracing import SCOPE, resource_from_environment

        self._provider = MeterProvider(
            resource=resource_from_environment(version),
            metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
        )
        self._meter = self._provider.get_meter(SCOPE, version or None)
        self._histograms: dict[str, Any] = {}

    def record(self, measured: Sequence[Measured]) -> None:
        for name, unit, description, bounds, value, attributes in measured:
            histogram = self._histograms.get(name)
            if histogram is None:
                histogram = self._histograms[name] = self._meter.create_histogram(
                    name,
                    unit=unit,
                    description=description,
                    explicit_bucket_boundaries_advisory=list(bounds),
                )
            histogram.record(value, attributes)

    def shutdown(self) -> None:
        self._provider.shutdown()


def _tuple_exporter(version: str) -> Any:
    """The SDK's OTLP/gRPC span exporter, encoding :data:`Finished` tuples."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    from agentrt_base.tracing import resource_from_environment

    resource = resource_pb2.Resource(
        attributes=_key_values(resource_from_environment(version).attributes, common_pb2)
    )
    error = trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR)
    has_remote = trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
    remote = has_remote | trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK

    class _TupleExporter(OTLPSpanExporter):
        def _translate_data(self, data: Sequence[Any]) -> ExportTraceServiceRequest:
            by_scope: dict[str, list[Any]] = {}
            for (
                name,
                trace_id,
                span_id,
                parent_id,
                parent_remote,
                flags,
                trace_state,
                kind,
                start_ns,
                end_ns,
                attributes,
                failed,
                scope,
            ) in data:
                span = trace_pb2.Span(
                    trace_id=trace_id.to_bytes(16, "big"),
                    span_id=span_id.to_bytes(8, "big"),
                    trace_state=trace_state,
                    name=name,
                    # OTLP's kinds are the API's plus one (0 is UNSPECIFIED).
                    kind=kind + 1,
                    start_time_unix_nano=start_ns,
                    end_time_unix_nano=end_ns,
                    flags=(flags & 0xFF) | (remote if parent_remote else has_remote),
                )
                _add_all(span.attributes, attributes)
                if parent_id:
                    span.parent_span_id = parent_id.to_bytes(8, "big")
                if failed:
                    span.status.CopyFrom(error)
                by_scope.setdefault(scope, []).append(span)
            return ExportTraceServiceRequest(
                resource_spans=[
                    trace_pb2.ResourceSpans(
                        resource=resource,
                        scope_spans=[
                            trace_pb2.ScopeSpans(
                                scope=common_pb2.InstrumentationScope(name=scope, version=version),
                                spans=spans,
                            )
                            for scope, spans in by_scope.items()
                        ],
                    )
                ]
            )

    return _TupleExporter()


#: Each attribute value type's AnyValue field (the API's attribute types).
_FIELDS: Final = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}


def _key_values(attributes: Mapping[str, Any], common_pb2: Any) -> list[Any]:
    """Attributes as OTLP KeyValues (built in place, not as AnyValues copied into them:
    three times cheaper, measured)."""
    holder = common_pb2.KeyValueList()
    _add_all(holder.values, attributes)
    return list(holder.values)


def _add_all(target: Any, attributes: Mapping[str, Any]) -> None:
    add = target.add
    for key, value in attributes.items():
        _set(add(key=key).value, value)


def _set(any_value: Any, value: Any) -> None:
    field = _FIELDS.get(type(value))
    if field is not None:
        setattr(any_value, field, value)
    elif isinstance(value, list | tuple):
        add = any_value.array_value.values.add
        for item in value:
            _set(add(), item)
    else:
        any_value.string_value = str(value)


if __name__ == "__main__":
    raise SystemExit(main())
