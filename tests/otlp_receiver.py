"""A real OTLP/gRPC endpoint for the tests: what a collector would receive, flattened.

``OtlpReceiver`` is a ``grpc.server`` on 127.0.0.1 serving the trace and metrics collector
services of ``opentelemetry-proto`` (the service definitions the OTLP exporter itself speaks),
so whatever exports to it (the server as a separate process, or an SDK in the test's own
process) goes through the real exporter, the real protobuf encoding and a real connection.
Logs are not served. It keeps what it receives, flattened into ``Span`` and ``MetricPoint``
values, and has waits that fail with a listing of what did arrive::

    with OtlpReceiver() as rx:
        process = start_server(env={**os.environ, **rx.env()})
        ...
        spans = rx.wait_for_spans(lambda spans: bool(by_name(spans, "invoke_agent coder")))
        assert ..., format_tree(spans)

Plaintext: the 1.45 OTLP/gRPC exporter (``opentelemetry.exporter.otlp.proto.grpc.exporter``)
connects without TLS when its ``insecure`` argument is true; left unset, it takes
``OTEL_EXPORTER_OTLP_INSECURE`` (and the per-signal ``..._TRACES_INSECURE`` /
``..._METRICS_INSECURE``), and without those it is insecure exactly when the endpoint's scheme
is ``http`` (an ``https`` endpoint always means TLS). The endpoint is used as ``host:port``, its
scheme dropped. ``endpoint`` is therefore ``http://127.0.0.1:PORT``, and ``env()`` sets
``OTEL_EXPORTER_OTLP_INSECURE=true`` as well, so that neither rule depends on the other.

Stop every exporting provider (``shutdown()``) or process before the receiver closes: an
exporter whose endpoint has gone retries with backoff, which only slows the test's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

# What a server process under test needs besides the endpoint: exports every 100 ms (spans)
# and 200 ms (metrics) rather than the defaults' 5 s and 60 s.
SPAN_DELAY_MS = 100
METRIC_INTERVAL_MS = 200


def decode_value(value: common_pb2.AnyValue) -> object:
    """An OTLP ``AnyValue`` as Python: str, bool, int, float, bytes, a tuple for an array, a
    dict for a key-value list, None when unset."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(decode_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(attributes: Iterable[common_pb2.KeyValue]) -> dict[str, object]:
    return {pair.key: decode_value(pair.value) for pair in attributes}


@dataclass(frozen=True)
class Span:
    """One received span. Ids are lowercase hex (32 digits for the trace, 16 for spans);
    ``parent_span_id`` is ``""`` for a root. ``kind`` is ``SERVER``, ``CLIENT``, ``INTERNAL``,
    ``PRODUCER`` or ``CONSUMER``; ``status_code`` ``UNSET``, ``OK`` or ``ERROR``. ``events``
    are (name, attributes) pairs, e.g. ``("exception", {"exception.type": ...})``. Equal and
    hashed by its ids."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    status_code: str
    status_message: str
    resource: dict[str, object]
    scope: str
    events: tuple[tuple[str, dict[str, object]], ...] = ()

    def __hash__(self) -> int:
        return hash((self.trace_id, self.span_id))

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


_INSTRUMENT_OF_KIND = {"histogram": "histogram", "gauge": "gauge"}


@dataclass(frozen=True)
class MetricPoint:
    """One data point of a received metric. ``kind`` is the OTLP data type: ``sum``,
    ``gauge`` or ``histogram`` (``exponential_histogram`` and ``summary`` are not decoded).
    ``value`` is a sum's or gauge's value, or a histogram's sum; ``count`` is a histogram's
    count (0 for the others). Sums are cumulative unless the exporter was told otherwise, so
    the newest point of an attribute set holds the total (``OtlpReceiver.latest``)."""

    name: str
    unit: str
    kind: str
    attributes: dict[str, object]
    value: float | int
    resource: dict[str, object]
    scope: str
    count: int = 0
    monotonic: bool = False
    bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()
    time_ns: int = 0

    @property
    def instrument(self) -> str:
        """The instrument that produced it, in the conventions' words (``counter``,
        ``updowncounter``, ``gauge``, ``histogram``), for ``genai_registry.metric_problems``."""
        if self.kind == "sum":
            return "counter" if self.monotonic else "updowncounter"
        return _INSTRUMENT_OF_KIND.get(self.kind, self.kind)


def _hex(raw: bytes) -> str:
    return raw.hex()


def _flatten_spans(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    found: list[Span] = []
    for resource_spans in request.resource_spans:
        resource = decode_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    Span(
                        trace_id=_hex(span.trace_id),
                        span_id=_hex(span.span_id),
                        parent_span_id=_hex(span.parent_span_id),
                        name=span.name,
                        kind=trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=decode_attributes(span.attributes),
                        status_code=trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                        status_message=span.status.message,
                        resource=resource,
                        scope=scope_spans.scope.name,
                        events=tuple(
                            (event.name, decode_attributes(event.attributes))
                            for event in span.events
                        ),
                    )
                )
    return found


def _number(point: metrics_pb2.NumberDataPoint) -> float | int:
    return point.as_int if point.WhichOneof("value") == "as_int" else point.as_double


def _flatten_metric(
    metric: metrics_pb2.Metric, resource: dict[str, object], scope: str
) -> list[MetricPoint]:
    kind = metric.WhichOneof("data")
    common: dict[str, Any] = {"name": metric.name, "unit": metric.unit, "resource": resource}
    common["scope"] = scope
    if kind == "sum":
        return [
            MetricPoint(
                kind="sum",
                attributes=decode_attributes(point.attributes),
                value=_number(point),
                monotonic=metric.sum.is_monotonic,
                time_ns=point.time_unix_nano,
                **common,
            )
            for point in metric.sum.data_points
        ]
    if kind == "gauge":
        return [
            MetricPoint(
                kind="gauge",
                attributes=decode_attributes(point.attributes),
                value=_number(point),
                time_ns=point.time_unix_nano,
                **common,
            )
            for point in metric.gauge.data_points
        ]
    if kind == "histogram":
        return [
            MetricPoint(
                kind="histogram",
                attributes=decode_attributes(point.attributes),
                value=point.sum,
                count=point.count,
                bounds=tuple(point.explicit_bounds),
                bucket_counts=tuple(point.bucket_counts),
                time_ns=point.time_unix_nano,
                **common,
            )
            for point in metric.histogram.data_points
        ]
    raise AssertionError(f"metric {metric.name}: data of kind {kind} is not decoded here")


def _flatten_metrics(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[MetricPoint]:
    found: list[MetricPoint] = []
    for resource_metrics in request.resource_metrics:
        resource = decode_attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                found.extend(_flatten_metric(metric, resource, scope_metrics.scope.name))
    return found


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        if self._receiver.keep:
            self._receiver._received(spans=_flatten_spans(request))
        else:
            self._receiver._counted(
                sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            )
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self,
        request: metrics_service_pb2.ExportMetricsServiceRequest,
        context: grpc.ServicerContext,
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        if self._receiver.keep:
            self._receiver._received(points=_flatten_metrics(request))
        else:
            self._receiver._counted(0, metric_exports=1)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@dataclass
class _Store:
    spans: list[Span] = field(default_factory=list)
    points: list[MetricPoint] = field(default_factory=list)
    exports: int = 0


class OtlpReceiver:
    """An OTLP/gRPC trace and metrics endpoint on 127.0.0.1, on a port of its own (bound as
    port 0, so no race with another test for it). Start and stop it with ``with``, or
    ``start()``/``stop()``. Safe to read from the test while exports arrive."""

    def __init__(self, *, keep: bool = True, listen: str = "127.0.0.1:0") -> None:
        """``keep=False``: only count what arrives (:attr:`counts`), for a benchmark that
        exports for minutes (``bench/steps_bench.py --observability``)."""
        self.keep = keep
        self._listen = listen
        self._store = _Store()
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None
        self.port = 0
        #: Spans and metric exports received (counted whether kept or not).
        self.counts = {"spans": 0, "metric_exports": 0}

    def _counted(self, spans: int, metric_exports: int = 0) -> None:
        with self._changed:
            self.counts["spans"] += spans
            self.counts["metric_exports"] += metric_exports

    def start(self) -> OtlpReceiver:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self), server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(self), server
        )
        self.port = server.add_insecure_port(self._listen)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or an exporter's ``endpoint``) should be."""
        if not self.port:
            raise RuntimeError("the receiver is not started")
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables a process needs to export its traces and metrics here, over OTLP/gRPC
        in plaintext, within a fraction of a second of recording them."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            # The per-signal variables win over the general one: set them too, so that none
            # inherited from the environment points elsewhere.
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": str(SPAN_DELAY_MS),
            "OTEL_METRIC_EXPORT_INTERVAL": str(METRIC_INTERVAL_MS),
        }

    def _received(self, spans: Iterable[Span] = (), points: Iterable[MetricPoint] = ()) -> None:
        spans, points = list(spans), list(points)
        with self._changed:
            self.counts["spans"] += len(spans)
            self.counts["metric_exports"] += bool(points)
            self._store.spans.extend(spans)
            self._store.points.extend(points)
            self._store.exports += 1
            self._changed.notify_all()

    def spans(self) -> list[Span]:
        """Every span received so far, in the order received."""
        with self._changed:
            return list(self._store.spans)

    def metric_points(self, name: str | None = None) -> list[MetricPoint]:
        """Every metric point received so far (of metric ``name`` if given), in order."""
        with self._changed:
            return [p for p in self._store.points if name is None or p.name == name]

    def latest(self, name: str) -> list[MetricPoint]:
        """Metric ``name``'s newest point for each attribute set received (with cumulative
        temporality, the current totals)."""
        newest: dict[tuple[tuple[str, str], ...], MetricPoint] = {}
        for point in self.metric_points(name):
            key = tuple(sorted((k, repr(v)) for k, v in point.attributes.items()))
            newest[key] = point
        return list(newest.values())

    def clear(self) -> None:
        """Forget what was received (a test's second phase)."""
        with self._changed:
            self._store = _Store()

    def _wait(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def wait_for_spans(
        self, predicate: Callable[[list[Span]], bool], timeout: float = 10.0
    ) -> list[Span]:
        """Wait until ``predicate(all spans received)`` is true and return those spans; after
        ``timeout`` seconds, fail with the tree of what did arrive."""
        if self._wait(lambda: predicate(list(self._store.spans)), timeout):
            return self.spans()
        spans = self.spans()
        raise AssertionError(
            f"no span set satisfying the predicate within {timeout} s; "
            f"received {len(spans)} span(s):\n{format_tree(spans)}"
        )

    def wait_for_metric(
        self,
        name: str,
        timeout: float = 10.0,
        where: Callable[[list[MetricPoint]], bool] | None = None,
    ) -> list[MetricPoint]:
        """Wait until points of metric ``name`` have arrived (and, with ``where``, until
        ``where(its points)`` is true) and return them; after ``timeout`` seconds, fail with a
        listing of the metrics that did arrive."""

        def done() -> bool:
            points = [p for p in self._store.points if p.name == name]
            return bool(points) and (where is None or where(points))

        if self._wait(done, timeout):
            return self.metric_points(name)
        raise AssertionError(
            f"metric {name} not received{' as required' if where else ''} within {timeout} s; "
            f"received:\n{format_points(self.metric_points())}"
        )


def by_name(spans: Iterable[Span], name: str) -> list[Span]:
    """The spans called ``name``, earliest start first."""
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_ns)


def children(spans: Iterable[Span], parent: Span) -> list[Span]:
    """``parent``'s direct children among ``spans`` (same trace), earliest start first."""
    return sorted(
        (s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id),
        key=lambda s: s.start_ns,
    )


def format_tree(spans: Iterable[Span]) -> str:
    """The spans as an indented tree per trace, for assertion messages: name, kind, status,
    ids. A span whose parent was not received is shown at the top, saying so."""
    spans = list(spans)
    if not spans:
        return "(no spans)"
    known = {(s.trace_id, s.span_id) for s in spans}
    lines: list[str] = []

    def draw(span: Span, depth: int) -> None:
        orphan = span.parent_span_id and (span.trace_id, span.parent_span_id) not in known
        lines.append(
            f"{'  ' * depth}{span.name} [{span.kind} {span.status_code}] span={span.span_id}"
            + (f" (parent {span.parent_span_id} not received)" if orphan else "")
        )
        for child in children(spans, span):
            draw(child, depth + 1)

    for trace_id in dict.fromkeys(s.trace_id for s in spans):
        lines.append(f"trace {trace_id}")
        tops = [
            s for s in spans if s.trace_id == trace_id and (trace_id, s.parent_span_id) not in known
        ]
        for top in sorted(tops, key=lambda s: s.start_ns):
            draw(top, 1)
    return "\n".join(lines)


def format_points(points: Iterable[MetricPoint]) -> str:
    """Metric points one a line, for assertion messages."""
    lines = [
        f"{p.name} [{p.instrument} {p.unit!r}] {p.attributes} value={p.value}"
        + (f" count={p.count}" if p.kind == "histogram" else "")
        for p in points
    ]
    return "\n".join(lines) or "(no metric points)"


def resource_of(spans: Iterable[Span]) -> Mapping[str, object]:
    """The resource the spans share (their first one's); a test checks ``service.name`` etc."""
    for span in spans:
        return span.resource
    raise AssertionError("no spans")


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.otlp_receiver --listen HOST:PORT --count FILE``: a counting receiver
    in a process of its own (the benchmark's), writing its counts as JSON to FILE every
    second, until SIGTERM or SIGINT."""
    import argparse
    import json
    import signal
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="otlp-receiver")
    parser.add_argument("--listen", required=True)
    parser.add_argument("--count", required=True, type=Path)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with OtlpReceiver(keep=False, listen=args.listen) as receiver:
        print(f"listening on {args.listen}", flush=True)
        while not stop.wait(1.0):
            args.count.write_text(json.dumps(receiver.counts))
        args.count.write_text(json.dumps(receiver.counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
