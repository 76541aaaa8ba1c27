"""The worker SDK's part of a run's trace, through the OpenTelemetry API alone.

The server records the context a run was created in and hands each attempt's to its worker
(``Attempt.traceparent``: the attempt's ``invoke_agent`` span, which the server emits from
the ledger); BeginStep answers each step with its ``trace_id`` and ``span_id`` (its ``chat``
or ``execute_tool`` span). The SDK makes its own spans children of those, so the trace reads
backend → CreateRun → attempt → step → what the worker did, and every call the SDK makes
carries the current context as W3C ``traceparent`` metadata (a backend's span continues
into CreateRun; a worker's into BeginStep).

Only the API is used: the application configures (or not) an OpenTelemetry SDK. Without
one every span here is a non-recording no-op and no metadata is added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from agentrt.runtime.v1 import message_pb2
from agentrt_core.trace_context import TraceParent, parse

__all__ = ["Tracer", "TracerProvider", "attempt_span", "outgoing_metadata", "step_span"]

#: The instrumentation scope of the SDK's spans.
SCOPE: Final = "agentrt_sdk"

Tracer = trace.Tracer
TracerProvider = trace.TracerProvider


def tracer_for(provider: TracerProvider | None) -> Tracer:
    """The SDK's tracer from ``provider`` (None: the global provider, resolved when a span
    is started, so an application may configure it after the worker is built)."""
    return trace.get_tracer(SCOPE, tracer_provider=provider)


def _under(parent: TraceParent | None) -> otel_context.Context | None:
    """A context whose current span is ``parent`` (a remote span), or None for none."""
    if parent is None:
        return None
    remote = SpanContext(
        int(parent.trace_id, 16),
        int(parent.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0x01),
    )
    return trace.set_span_in_context(NonRecordingSpan(remote), otel_context.Context())


@contextlib.contextmanager
def attempt_span(
    tracer: Tracer, run: message_pb2.Run, attempt: message_pb2.Attempt
) -> Iterator[trace.Span]:
    """The worker's span of one attempt, current while it runs: the child of the attempt's
    ``invoke_agent`` span (``attempt.traceparent``), or of whatever is current when the
    server sent none."""
    with tracer.start_as_current_span(
        f"agentrt.worker.attempt {run.agent.agent_id}",
        context=_under(parse(attempt.traceparent)),
        kind=SpanKind.CONSUMER,
        attributes={
            "agentrt.run.id": run.id,
            "agentrt.attempt.id": attempt.id,
            "agentrt.attempt.number": attempt.number,
            "agentrt.agent.digest": run.agent.agent_digest,
        },
    ) as span:
        yield span


@contextlib.contextmanager
def step_span(tracer: Tracer, step: message_pb2.Step, name: str) -> Iterator[trace.Span]:
    """The worker's span of what it does for ``step`` (calling the model, running the tool),
    current while it does it: the child of the step's span when the server traced it."""
    parent = None
    if step.trace_id and step.span_id:
        parent = parse(f"00-{step.trace_id}-{step.span_id}-01")
    with tracer.start_as_current_span(
        name,
        context=_under(parent),
        attributes={"agentrt.step.id": step.id, "agentrt.step.sequence": step.sequence},
    ) as span:
        yield span


def outgoing_metadata(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``metadata`` with the current trace context added (W3C ``traceparent``, and
    ``tracestate`` when there is one); unchanged when no span is current."""
    if not trace.get_current_span().get_span_context().is_valid:
        return metadata
    carrier: dict[str, Any] = {}
    propagate.inject(carrier)
    return metadata + tuple((key, str(value)) for key, value in carrier.items())
