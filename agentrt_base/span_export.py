"""The span exporter process: ``python -m agentrt_base.span_export VERSION``.

The server records each finished span as a plain tuple (``agentrt_base.tracing``), and
aggregates the values of its OTLP histograms per attribute set (:class:`Window`), and writes
both, batched, to this process's standard input. Here the spans are encoded as OTLP protobuf
and sent by the OpenTelemetry SDK's OTLP/gRPC span exporter, and the histograms are summed
up and sent, every ``OTEL_METRIC_EXPORT_INTERVAL`` and at exit, by the SDK's OTLP/gRPC
metric exporter (:class:`_Meter`: what the SDK's periodic reader does, for points the SDK's
meter did not make). Both exporters read their settings (endpoint, headers, certificates,
compression, timeout) from the ``OTEL_*`` variables as they would anywhere and retry as they
always do.
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
import math
import os
import pickle
import signal
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Final

from agentrt_base.buckets import bucket_of

#: A frame's header: the pickle's length (big-endian, 4 bytes).
HEADER: Final = struct.Struct(">I")

#: One finished span, as the server records it: (name, trace_id, span_id, parent_span_id
#: (0: a root), parent_is_remote, trace_flags, trace_state (W3C tracestate header, "" for
#: none), kind (SpanKind value), start_ns, end_ns, attributes, error (status ERROR), scope).
Finished = tuple[str, int, int, int, bool, int, str, int, int, int, dict[str, Any], bool, str]
#: One value of a histogram exported over OTLP: (name, unit, description, bucket bounds,
#: value, attributes).
Measured = tuple[str, str, str, tuple[float, ...], float, dict[str, Any]]
#: One histogram's values for one attribute set over a window: (name, unit, description,
#: bucket bounds, attributes, count per bucket (not cumulative; the last one above every
#: bound), sum, min, max).
Aggregated = tuple[str, str, str, tuple[float, ...], dict[str, Any], list[int], float, float, float]
#: What one frame carries: the spans finished and the histograms' values aggregated since the
#: last frame.
Frame = tuple[list[Finished], list[Aggregated]]

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
        for spans, aggregated in frames(sys.stdin.buffer):
            if meter is not None:
                meter.add(aggregated)
            if exporter is not None:
                for start in range(0, len(spans), size):
                    exporter.export(spans[start : start + size])
    finally:
        if exporter is not None:
            exporter.shutdown()
        if meter is not None:
            meter.shutdown()
    return 0


class _Series:
    """One histogram's values for one attribute set: OTLP's explicit-bucket histogram point
    (a count per bucket, the sum, the count, the min and the max)."""

    __slots__ = (
        "attributes",
        "bounds",
        "counts",
        "description",
        "max",
        "min",
        "name",
        "sum",
        "unit",
    )

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        bounds: tuple[float, ...],
        attributes: dict[str, Any],
    ) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.bounds, self.attributes = bounds, attributes
        self.counts = [0] * (len(bounds) + 1)
        self.sum, self.min, self.max = 0.0, math.inf, -math.inf

    def observe(self, value: float) -> None:
        self.counts[bucket_of(self.bounds, value)] += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def merge(self, other: Aggregated) -> None:
        """Add another window's values of the same series."""
        counts, total, low, high = other[5:]
        self.counts = [mine + theirs for mine, theirs in zip(self.counts, counts, strict=True)]
        self.sum += total
        self.min = min(self.min, low)
        self.max = max(self.max, high)

    def aggregated(self) -> Aggregated:
        return (
            self.name,
            self.unit,
            self.description,
            self.bounds,
            self.attributes,
            list(self.counts),
            self.sum,
            self.min,
            self.max,
        )


def _key(name: str, attributes: Mapping[str, Any]) -> tuple[str, frozenset[tuple[str, Any]]]:
    # An attribute set is the same whatever order its attributes were added in.
    return name, frozenset(attributes.items())


class Window:
    """The server's side: the histograms' values since the last :meth:`take`, aggregated
    per metric and attribute set as they are recorded (a dictionary lookup and a bucket's
    count a value), from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, frozenset[tuple[str, Any]]], _Series] = {}

    def add(self, measured: Measured) -> None:
        name, unit, description, bounds, value, attributes = measured
        key = _key(name, attributes)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(name, unit, description, bounds, attributes)
            series.observe(value)

    def take(self) -> list[Aggregated]:
        """What was recorded since the last call, which starts a new window."""
        with self._lock:
            taken, self._series = self._series, {}
        return [series.aggregated() for series in taken.values()]


#: How often the histograms are exported, and how long an export may take (ms): the SDK's
#: periodic reader's variables and defaults.
_INTERVAL: Final = ("OTEL_METRIC_EXPORT_INTERVAL", 60_000.0)
_TIMEOUT: Final = ("OTEL_METRIC_EXPORT_TIMEOUT", 30_000.0)
#: The exporter's temporality preference: ``delta`` and ``lowmemory`` make a histogram's
#: points deltas, ``cumulative`` (the default) totals since the start.
_TEMPORALITY: Final = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"


def _millis(environ: Mapping[str, str], setting: tuple[str, float]) -> float:
    variable, default = setting
    try:
        value = float(environ.get(variable, "") or default)
    except ValueError:
        logging.warning("%s is not a number of milliseconds: using %g", variable, default)
        return default
    return value if value > 0 else default


class _Meter:
    """The exporter's side: the server's aggregated histograms summed up, and exported with
    the SDK's OTLP/gRPC metric exporter every ``OTEL_METRIC_EXPORT_INTERVAL`` (default 60 s)
    and once more at exit, cumulative (totals since this process started, which is what a
    restart of it resets) or, when the temporality preference asks for it, as deltas since
    the last export. A series with no new value since the last export is left out of a delta
    export, as the SDK's reader leaves it out."""

    def __init__(
        self, version: str, exporter: Any = None, environ: Mapping[str, str] = os.environ
    ) -> None:
        from opentelemetry.sdk.metrics.export import AggregationTemporality
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from agentrt_base.tracing import SCOPE, resource_from_environment

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        self._exporter = exporter
        self._resource = resource_from_environment(version)
        self._scope = InstrumentationScope(SCOPE, version or None)
        self._delta = environ.get(_TEMPORALITY, "").strip().lower() in ("delta", "lowmemory")
        self._temporality = (
            AggregationTemporality.DELTA if self._delta else AggregationTemporality.CUMULATIVE
        )
        self._timeout = _millis(environ, _TIMEOUT)
        self._lock = threading.Lock()
        self._series: dict[tuple[str, frozenset[tuple[str, Any]]], _Series] = {}
        self._since = time.time_ns()
        self._stop = threading.Event()
        self._ticker = threading.Thread(
            target=self._tick,
            args=(_millis(environ, _INTERVAL) / 1000,),
            name="agentrt-metric-export",
            daemon=True,
        )
        self._ticker.start()

    def add(self, aggregated: Sequence[Aggregated]) -> None:
        with self._lock:
            for one in aggregated:
                key = _key(one[0], one[4])
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = _Series(*one[:5])
                series.merge(one)

    def collect(self, now: int) -> Any:
        """The points to export at ``now`` (ns), as the SDK's ``MetricsData``; None when
        there are none."""
        from opentelemetry.sdk.metrics.export import (
            Histogram,
            HistogramDataPoint,
            Metric,
            MetricsData,
            ResourceMetrics,
            ScopeMetrics,
        )

        by_name: dict[str, tuple[_Series, list[HistogramDataPoint]]] = {}
        with self._lock:
            since, series = self._since, list(self._series.values())
            if self._delta:
                self._series, self._since = {}, now
            for one in series:
                points = by_name.setdefault(one.name, (one, []))[1]
                points.append(
                    HistogramDataPoint(
                        attributes=dict(one.attributes),
                        start_time_unix_nano=since,
                        time_unix_nano=now,
                        count=sum(one.counts),
                        sum=one.sum,
                        bucket_counts=list(one.counts),
                        explicit_bounds=list(one.bounds),
                        min=one.min,
                        max=one.max,
                    )
                )
        if not by_name:
            return None
        metrics = [
            Metric(
                name=name,
                description=first.description,
                unit=first.unit,
                data=Histogram(data_points=points, aggregation_temporality=self._temporality),
            )
            for name, (first, points) in by_name.items()
        ]
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(
                    resource=self._resource,
                    scope_metrics=[ScopeMetrics(scope=self._scope, metrics=metrics, schema_url="")],
                    schema_url="",
                )
            ]
        )

    def export(self) -> None:
        data = self.collect(time.time_ns())
        if data is None:
            return
        try:
            self._exporter.export(data, timeout_millis=self._timeout)
        except Exception:  # as the SDK's reader: logged, and the next export tries again
            logging.exception("cannot export the metrics")

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.export()

    def shutdown(self) -> None:
        self._stop.set()
        self._ticker.join()
        self.export()
        self._exporter.shutdown()


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

    # Small attribute sets recur (a call's span: its method and code; a transaction's: its
    # operation): each is encoded once, then copied into every span that has it.
    encoded: dict[tuple[tuple[str, type, Any], ...], list[Any]] = {}

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
                _add_cached(span.attributes, attributes, encoded)
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


#: The attribute sets :func:`_add_cached` keeps encoded: those of at most this many
#: attributes (the calls' and transactions' spans; a GenAI span's, with its ids, never recurs),
#: at most :data:`_ENCODED_KEPT` of them (all forgotten when there are more).
_SMALL: Final = 4
_ENCODED_KEPT: Final = 4096


def _add_cached(
    target: Any,
    attributes: Mapping[str, Any],
    encoded: dict[tuple[tuple[str, type, Any], ...], list[Any]],
) -> None:
    """:func:`_add_all`, a small set's KeyValues copied from ``encoded`` once made (a third of
    the cost of making them)."""
    if len(attributes) > _SMALL:
        _add_all(target, attributes)
        return
    try:
        # The type too: True == 1 == 1.0, but they are different attribute values.
        key = tuple((name, value.__class__, value) for name, value in attributes.items())
        made = encoded.get(key)
    except TypeError:  # a list value: not hashable, so not kept
        _add_all(target, attributes)
        return
    if made is None:
        # Made in a list of their own: KeyValues taken from a span would keep the whole
        # request they are part of alive.
        from opentelemetry.proto.common.v1 import common_pb2

        made = _key_values(attributes, common_pb2)
        if len(encoded) >= _ENCODED_KEPT:
            encoded.clear()
        encoded[key] = made
    target.extend(made)


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
