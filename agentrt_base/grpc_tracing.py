"""A server span for every RPC, in the OpenTelemetry RPC conventions, continuing the caller's
trace.

The span is named ``{rpc.method}`` (``agentrt.runtime.v1.RuntimeService/CreateRun``) with
``rpc.system.name`` = ``grpc``, ``rpc.method`` and ``rpc.response.status_code`` (the code's
name), and ``error.type`` with status ERROR for the codes the gRPC conventions count as a
server's errors (semantic conventions v1.45.0, "Semantic conventions for gRPC", which define
these attributes as stable: https://opentelemetry.io/docs/specs/semconv/rpc/grpc/). A W3C
``traceparent`` (and ``tracestate``) in the call's metadata makes it the child of the
caller's span, so a backend's trace continues into ``CreateRun``.

Mounted just inside the metrics interceptor, outside the error mapping, so the code it records
is the one the caller got, and the authentication gate, the limits and the handler (and the
database work it does, ``agentrt_base.db``) run inside the span.

Only methods the server has a handler for get a span: a made-up method name would otherwise
be a span name (and an attribute value) of the caller's choosing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentrt_base.grpc_metrics import final_code
from agentrt_base.handler_wrap import Handler, WrappingInterceptor, call

#: The codes a server's span reports as errors (the gRPC conventions' server list).
SERVER_ERRORS: Final = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)

_PROPAGATOR: Final = TraceContextTextMapPropagator()
#: The metadata keys the W3C propagator reads.
_CARRIED: Final = frozenset(_PROPAGATOR.fields)


def _incoming(context: grpc.aio.ServicerContext[Any, Any]) -> otel_context.Context:
    carrier: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key in _CARRIED and isinstance(value, str):
            carrier[key] = value
    if not carrier:
        return otel_context.Context()
    # An invalid header is ignored by the propagator (a new trace), never refused.
    return _PROPAGATOR.extract(carrier, context=otel_context.Context())


class TracingInterceptor(WrappingInterceptor):
    """Starts a SERVER span around every call and makes it current for the handler."""

    def __init__(self, tracer: trace.Tracer) -> None:
        super().__init__()
        self._tracer = tracer

    def _start(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> trace.Span:
        return self._tracer.start_span(
            method,
            context=_incoming(context),
            kind=SpanKind.SERVER,
            attributes={"rpc.system.name": "grpc", "rpc.method": method},
        )

    @staticmethod
    def _end(
        span: trace.Span,
        context: grpc.aio.ServicerContext[Any, Any],
        error: BaseException | None,
    ) -> None:
        code = final_code(context, error)
        span.set_attribute("rpc.response.status_code", code.name)
        if code in SERVER_ERRORS:
            span.set_attribute("error.type", code.name)
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        name = method.lstrip("/")

        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            span = self._start(name, context)
            error: BaseException | None = None
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                return await call(behavior, request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                otel_context.detach(token)
                self._end(span, context, error)

        return wrapper

    def wrap_stream(self, method: str, kind: str, behavior: Handler) -> Handler:
        name = method.lstrip("/")

        async def generator(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            span = self._start(name, context)
            error: BaseException | None = None
            current = trace.set_span_in_context(span)
            iterator = behavior(request, context).__aiter__()
            try:
                while True:
                    # Current for the generator's own steps only: each resumption runs in
                    # the caller's context, so it is attached around each one.
                    token = otel_context.attach(current)
                    try:
                        response = await iterator.__anext__()
                    except StopAsyncIteration:
                        return
                    finally:
                        otel_context.detach(token)
                    yield response
            except BaseException as exc:
                error = exc
                if isinstance(exc, GeneratorExit):
                    error = asyncio.CancelledError()
                raise
            finally:
                self._end(span, context, error)

        return generator
