"""A server span for every RPC, in the OpenTelemetry RPC conventions, continuing the caller's
trace.

The span is named ``{rpc.method}`` (``agentrt.runtime.v1.RuntimeService/CreateRun``) with
``rpc.system.name`` = ``grpc``, ``rpc.method`` and ``rpc.response.status_code`` (the code's
name), and ``error.type`` with status ERROR for the codes the gRPC conventions count as a
server's errors (semantic conventions v1.45.0, "Semantic conventions for gRPC", which define
these attributes as stable: https://opentelemetry.io/docs/specs/semconv/rpc/grpc/). A W3C
``traceparent`` (and ``tracestate``) in the call's metadata makes it the child of the
caller's span, so a backend's trace continues into ``CreateRun``; an invalid one is ignored
(W3C: a new trace), never refused.

Mounted just inside the metrics interceptor, outside the error mapping, so the code it records
is the one the caller got, and the authentication gate, the limits and the handler (and the
database work it does, ``agentrt_base.db``) run inside the span. How a span is recorded and
exported is ``agentrt_base.tracing``'s.

Only methods the server has a handler for get a span: a made-up method name would otherwise
be a span name (and an attribute value) of the caller's choosing.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from agentrt_base.grpc_metrics import final_code
from agentrt_base.handler_wrap import Handler, WrappingInterceptor
from agentrt_base.tracing import Live, Tracing, incoming_parent

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


class TracingInterceptor(WrappingInterceptor):
    """Opens a SERVER span around every call and makes it current for the handler."""

    def __init__(self, tracing: Tracing) -> None:
        super().__init__()
        self._tracing = tracing

    def _start(self, name: str, context: grpc.aio.ServicerContext[Any, Any]) -> Live:
        return self._tracing.start(
            name,
            SpanKind.SERVER,
            incoming_parent(context.invocation_metadata()),
            {"rpc.system.name": "grpc", "rpc.method": name},
        )

    @staticmethod
    def _end(
        span: Live, context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
    ) -> None:
        code = final_code(context, error)
        span.attributes["rpc.response.status_code"] = code.name
        span.end(code.name if code in SERVER_ERRORS else "")

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        name = method.lstrip("/")

        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            span = self._start(name, context)
            error: BaseException | None = None
            token = otel_context.attach(span.current())
            try:
                # Inline, not handler_wrap.call: a coroutine frame less on every call.
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
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
            current = span.current()
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
                error = asyncio.CancelledError() if isinstance(exc, GeneratorExit) else exc
                raise
            finally:
                self._end(span, context, error)

        return generator
