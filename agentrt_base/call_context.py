"""What a log line may say about the call it was written in: the method and the ids the
request names (thread, run, attempt, step).

An interceptor sets :data:`CALL` for the length of each call, from the request's own
top-level ``thread_id``/``run_id``/``attempt_id``/``step_id`` fields (found once per request
type from its descriptor). Only ids are taken, never content (prompts, arguments, outputs). The JSON
log format (``agentrt_base.log_format``) reads it; the interceptor is mounted only with that
format, so the text format costs nothing.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

#: The fields a request may carry that a log line reports, in the order it reports them.
ID_FIELDS: Final = ("thread_id", "run_id", "attempt_id", "step_id")


@dataclass(frozen=True)
class Call:
    method: str
    ids: tuple[tuple[str, str], ...] = ()


CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("agentrt_call", default=None)

Handler = Callable[..., Any]


#: Each request type's id fields, found once from its descriptor.
_FIELDS: dict[type, tuple[str, ...]] = {}


def ids_of(request: Any) -> tuple[tuple[str, str], ...]:
    """The non-empty id fields of ``request`` (none when it is not a message: a request that
    did not decode)."""
    fields = _FIELDS.get(type(request))
    if fields is None:
        names = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
        fields = _FIELDS[type(request)] = tuple(name for name in ID_FIELDS if name in names)
    found = []
    for name in fields:
        value = getattr(request, name)
        if value:
            found.append((name, str(value)[:64]))  # an id is short; a hostile one is clipped
    return tuple(found)


class CallContextInterceptor(grpc.aio.ServerInterceptor):
    """Sets :data:`CALL` around every call's handler."""

    def __init__(self) -> None:
        self._wrapped: dict[
            str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]
        ] = {}

    async def intercept_service(  # type: ignore[override]
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _wrap(method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    def unary(behavior: Handler, streaming_request: bool) -> Handler:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            ids = () if streaming_request else ids_of(request)
            token = CALL.set(Call(method, ids))
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                CALL.reset(token)

        return wrapper

    def stream(behavior: Handler, streaming_request: bool) -> Handler:
        if not inspect.isasyncgenfunction(behavior):
            return unary(behavior, streaming_request)

        async def generator(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            ids = () if streaming_request else ids_of(request)
            # Set for the generator's own steps: each resumption runs in the caller's context,
            # so it is set again around each one rather than once.
            iterator = behavior(request, context).__aiter__()
            while True:
                token = CALL.set(Call(method, ids))
                try:
                    response = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    CALL.reset(token)
                yield response

        return generator

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary, False), **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary, True), **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream(handler.unary_stream, False), **kwargs)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(stream(handler.stream_stream, True), **kwargs)
    return handler
