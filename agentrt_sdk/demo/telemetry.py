"""The demo's own spans, when the ``OTEL_*`` variables ask for traces.

``agentrt demo`` and its worker processes then export their spans over OTLP too, so a
tracing backend shows the whole case: the demo's span (the backend's, in a real system)
around the calls that create the runs, the server's spans under it, and each worker's
spans under the attempts and steps the server handed it (``agentrt_sdk.tracing``). The
variables are read by the one rule the server follows (``agentrt_core.otel_env``). It
needs the OpenTelemetry SDK and its OTLP exporter (``agentrt[server]`` brings them); a
client-only install says so and plays the case without its own spans.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from agentrt_core.otel_env import OtelConfigError, exports


def configure(service: str) -> Callable[[], None]:
    """Install a global tracer provider exporting over OTLP, named ``service`` unless
    ``OTEL_SERVICE_NAME`` says otherwise, when the environment asks for traces; returns
    what flushes and stops it (a no-op when nothing was installed)."""
    try:
        wanted = exports(os.environ, "traces")
    except OtelConfigError as exc:
        print(f"agentrt demo: not tracing: {exc}", file=sys.stderr)
        return lambda: None
    if not wanted:
        return lambda: None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        print(
            "agentrt demo: not tracing: the OpenTelemetry SDK is not installed"
            " (pip install 'agentrt[server]')",
            file=sys.stderr,
        )
        return lambda: None
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.shutdown
