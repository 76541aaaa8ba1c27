"""The gRPC metrics: every RPC counted by method and code, timed, and counted while open.

An interceptor of its own, placed first (outermost) on the server, so what it counts is what
the caller received: the code the error mapping, the authentication gate and the limits
(``agentrt_base.grpc_errors``) answered, not what a servicer raised. Its labels are those of
the go-grpc-prometheus and grpc-java conventions (``grpc_service``, ``grpc_method``,
``grpc_type``, ``grpc_code``), under the ``agentrt_`` prefix.

Only methods the server has a handler for are counted: a caller can send any method name, and
an unknown one (answered ``UNIMPLEMENTED`` by gRPC itself) would otherwise add a label value
per name it made up.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from google.rpc import error_details_pb2, status_pb2

from agentrt_base.handler_wrap import Handler, WrappingInterceptor
from agentrt_base.metrics import (
    GRPC_HANDLED,
    GRPC_HANDLING_SECONDS,
    GRPC_IN_FLIGHT,
    GRPC_REFUSED,
    Metrics,
)


def split_method(method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` → ``("pkg.Service", "Method")``."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class _MethodMetrics:
    """One method's label children, resolved once (a ``labels()`` lookup per call costs a
    lock and a dict lookup more than an ``inc()``)."""

    __slots__ = ("_codes", "_handled", "_labels", "_refused", "in_flight", "seconds")

    def __init__(self, metrics: Metrics, method: str, kind: str) -> None:
        service, name = split_method(method)
        self._labels = (service, name, kind)
        self._handled = metrics.counter(GRPC_HANDLED)
        self._refused = metrics.counter(GRPC_REFUSED)
        self.seconds = metrics.histogram(GRPC_HANDLING_SECONDS).labels(*self._labels)
        self.in_flight = metrics.gauge(GRPC_IN_FLIGHT).labels(*self._labels)
        self._codes: dict[grpc.StatusCode, Any] = {}

    def ended(self, started: float, context: grpc.aio.ServicerContext[Any, Any], code: Any) -> None:
        self.seconds.observe(time.perf_counter() - started)
        self.in_flight.dec()
        child = self._codes.get(code)
        if child is None:
            child = self._handled.labels(*self._labels, code.name)
            self._codes[code] = child
        child.inc()
        if code is not grpc.StatusCode.OK:
            service, method, _ = self._labels
            self._refused.labels(service, method, code.name, refusal_reason(context)).inc()


def refusal_reason(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The ErrorInfo reason of a refused call (every agentrt refusal carries one: it is in
    ``agentrt_core.reasons``, a closed set), or ``""`` when it has none (gRPC's own refusals,
    health's). Read from the status details the error mapping put in the trailers."""
    for key, value in context.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return str(info.reason)
    return ""


def final_code(
    context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
) -> grpc.StatusCode:
    """The code the caller receives: the one set on the context (an abort sets it), else OK
    after a normal end, CANCELLED when the call was cancelled, UNKNOWN for an exception gRPC
    would answer with UNKNOWN."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if code is not None:  # the aio context reports an int on some versions
        return _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


_BY_VALUE: Final = {code.value[0]: code for code in grpc.StatusCode}


class MetricsInterceptor(WrappingInterceptor):
    """Counts and times every RPC of every service mounted on the server."""

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self._metrics = metrics

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        return _timed(_MethodMetrics(self._metrics, method, kind), behavior)

    def wrap_stream(self, method: str, kind: str, behavior: Handler) -> Handler:
        return _timed_stream(_MethodMetrics(self._metrics, method, kind), behavior)


def _timed(counted: _MethodMetrics, behavior: Handler) -> Handler:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        counted.in_flight.inc()
        error: BaseException | None = None
        try:
            # Inline, not handler_wrap.call: a coroutine frame less on every call.
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result
        except BaseException as exc:
            error = exc
            raise
        finally:
            counted.ended(started, context, final_code(context, error))

    return wrapper


def _timed_stream(counted: _MethodMetrics, behavior: Handler) -> Handler:
    async def generator(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        started = time.perf_counter()
        counted.in_flight.inc()
        error: BaseException | None = None
        try:
            async for response in behavior(request, context):
                yield response
        except BaseException as exc:
            error = exc
            raise
        finally:
            counted.ended(started, context, final_code(context, error))

    return generator
