"""The server's OpenTelemetry: traces (and the GenAI metrics) over OTLP/gRPC, configured only
by the standard ``OTEL_*`` environment variables.

Traces are on when an OTLP endpoint is named (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` says ``otlp``; metrics
likewise with ``..._METRICS_...``. With none of them set nothing here is built: no provider,
no exporter thread, no interceptor (the server mounts :class:`~agentrt_base.grpc_tracing.
TracingInterceptor` only with a :class:`Tracing`), so the cost is nil. Everything else the
exporter, the batch processor, the sampler and the resource read from the environment
themselves (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``..._CERTIFICATE``, ``..._INSECURE``…), per the OpenTelemetry SDK environment
specification (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/).

The providers are this server's own, not the process-global ones: an application that embeds
the server keeps its own, and two servers in one test process do not share one.

The spans built from the ledger (``runtime_service.ledger_spans``) are made after the fact,
with the ledger's times and span ids that are functions of ledger ids
(``agentrt_core.trace_context``): :meth:`Tracing.record_span` starts them under a preset id,
through the SDK's public id-generator hook.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace import TraceFlags as OtelTraceFlags

from agentrt_core.otel_env import OtelConfigError, exports
from agentrt_core.trace_context import TraceParent, parse

#: The ``OTEL_*`` variables ask for something this server cannot do (one line).
TracingConfigError = OtelConfigError

#: The instrumentation scope of every span and instrument the server makes.
SCOPE: Final = "agentrt"

#: The span id (16 hex) the next span started on this thread takes, when preset.
_PRESET_SPAN: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "agentrt_preset_span", default=None
)
_PRESET_TRACE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "agentrt_preset_trace", default=None
)


class _LedgerIds(RandomIdGenerator):
    """Random ids, except for a span started under :data:`_PRESET_SPAN`: a span from the
    ledger, whose id is the one the ledger's record implies."""

    def generate_span_id(self) -> int:
        preset = _PRESET_SPAN.get()
        return preset if preset is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        preset = _PRESET_TRACE.get()
        return preset if preset is not None else super().generate_trace_id()


def _ns(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


@dataclass
class Tracing:
    """This server's tracer (and meter, when metrics are exported over OTLP)."""

    provider: TracerProvider
    tracer: trace.Tracer
    #: Whether spans are exported (False: only the GenAI metrics are).
    traces: bool
    meter_provider: MeterProvider | None = None
    meter: Meter | None = None

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, version: str = ""
    ) -> Tracing | None:
        """The tracing the ``OTEL_*`` variables ask for, or None when they ask for none.
        Raises :class:`TracingConfigError` for settings it cannot honour."""
        env = os.environ if environ is None else environ
        traces, metrics = exports(env, "traces"), exports(env, "metrics")
        if not traces and not metrics:
            return None
        defaults: dict[str, Any] = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "agentrt"}
        if version:
            defaults[SERVICE_VERSION] = version
        # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME are read by Resource.create; what is
        # passed here wins over them, so the service name is passed only when they set none.
        resource = Resource.create(defaults)
        provider = TracerProvider(resource=resource, id_generator=_LedgerIds())
        if traces:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        meter_provider = None
        if metrics:
            meter_provider = MeterProvider(
                resource=resource,
                metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
            )
        return cls(
            provider,
            provider.get_tracer(SCOPE, version or None),
            traces,
            meter_provider,
            meter_provider.get_meter(SCOPE, version or None) if meter_provider else None,
        )

    def record_span(
        self,
        name: str,
        *,
        parent: TraceParent | None,
        context: TraceParent,
        kind: SpanKind,
        start: dt.datetime,
        end: dt.datetime,
        attributes: Mapping[str, Any],
        error: str = "",
    ) -> None:
        """A finished span from the ledger: ``context`` its own trace and span id, ``parent``
        its parent's (None: the root of its trace), the ledger's ``start`` and ``end``.
        ``error``: the span's ``error.type``; its status is then ERROR."""
        if parent is not None:
            parent_context = trace.set_span_in_context(
                NonRecordingSpan(
                    SpanContext(
                        int(parent.trace_id, 16),
                        int(parent.span_id, 16),
                        is_remote=True,
                        trace_flags=OtelTraceFlags(parent.flags & 0x01),
                    )
                ),
                otel_context.Context(),
            )
        else:
            parent_context = otel_context.Context()
        span_token = _PRESET_SPAN.set(int(context.span_id, 16))
        trace_token = _PRESET_TRACE.set(int(context.trace_id, 16))
        try:
            span = self.tracer.start_span(
                name,
                context=parent_context,
                kind=kind,
                attributes=dict(attributes),
                start_time=_ns(start),
            )
        finally:
            _PRESET_TRACE.reset(trace_token)
            _PRESET_SPAN.reset(span_token)
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=max(_ns(end), _ns(start)))

    def database_span(
        self, system: str, namespace: str
    ) -> Callable[[str], contextlib.AbstractContextManager[object]]:
        """What starts the span of one transaction (``agentrt_base.db.Database.span``): a
        CLIENT span in the database conventions (``db.system.name``, ``db.namespace``,
        ``db.operation.name``), the child of the call's span. Outside any call (the reaper,
        the health probe) there is no span: a root span a second would be noise."""
        tracer = self.tracer
        attributes = {"db.system.name": system}
        if namespace:
            attributes["db.namespace"] = namespace

        def span(operation: str) -> contextlib.AbstractContextManager[object]:
            if not trace.get_current_span().is_recording():
                return contextlib.nullcontext()
            return tracer.start_as_current_span(
                f"{operation} {namespace or system}",
                kind=SpanKind.CLIENT,
                attributes={**attributes, "db.operation.name": operation},
            )

        return span

    def shutdown(self) -> None:
        """Export what is pending (bounded by the exporters' own timeouts) and stop."""
        self.provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def current_traceparent() -> str:
    """The ``traceparent`` of the span current in this context ("" when there is none)."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return ""
    return TraceParent(
        format(span_context.trace_id, "032x"),
        format(span_context.span_id, "016x"),
        int(span_context.trace_flags),
    ).header()


def call_traceparent(context: Any) -> str:
    """The trace context a call came in: its server span's when the server traces, else the
    caller's own ``traceparent`` metadata, if valid ("" when neither)."""
    current = current_traceparent()
    if current:
        return current
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            parsed = parse(value)
            return parsed.header() if parsed is not None else ""
    return ""
