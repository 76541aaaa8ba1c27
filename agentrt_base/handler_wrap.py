"""What every server interceptor of ours does the same way: wrap a method's handler once,
whatever its kind, and reuse the wrapper on every later call.

A method's handler is the same object on every call, so an interceptor wraps it the first
time and keeps ``(handler, wrapper)``; a new handler object (a service registered again in a
test) is wrapped anew. Subclasses say how to wrap a behaviour (:meth:`wrap_unary` for a call
that returns once, :meth:`wrap_stream` for one that yields); the kind of each method is read
here once.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import grpc

Handler = Callable[..., Any]

UNARY: Final = "unary"
CLIENT_STREAM: Final = "client_stream"
SERVER_STREAM: Final = "server_stream"
BIDI_STREAM: Final = "bidi_stream"


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """Base of an interceptor that wraps every handler of the server (once per method)."""

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
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED itself
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.rewrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        """The wrapper of a behaviour that returns (a coroutine function, or a plain one)."""
        raise NotImplementedError

    def wrap_stream(self, method: str, kind: str, behavior: Handler) -> Handler:
        """The wrapper of a behaviour that yields its responses (an async generator
        function). By default the same as :meth:`wrap_unary`."""
        return self.wrap_unary(method, kind, behavior)

    def rewrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """``handler`` of ``method`` with this interceptor's wrapper around its behaviour."""
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self.wrap_unary(method, UNARY, handler.unary_unary), **kwargs
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self.wrap_unary(method, CLIENT_STREAM, handler.stream_unary), **kwargs
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(method, SERVER_STREAM, handler.unary_stream), **kwargs
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(method, BIDI_STREAM, handler.stream_stream), **kwargs
            )
        return handler

    def _streaming(self, method: str, kind: str, behavior: Handler) -> Handler:
        # A streaming handler that writes through the context (health's Watch) is a
        # coroutine, not a generator: it is wrapped as one.
        if inspect.isasyncgenfunction(behavior):
            return self.wrap_stream(method, kind, behavior)
        return self.wrap_unary(method, kind, behavior)


class Stacked(WrappingInterceptor):
    """Several wrapping interceptors mounted as one, outermost first, as
    ``grpc.aio.server(interceptors=...)`` would order them.

    gRPC runs each interceptor of a server on every call (a coroutine awaiting the next one's,
    down to the method's handler) even when the interceptor only hands back a wrapper it
    made earlier; stacked, the wrappers are composed once per method and looked up once per
    call. With metrics and tracing on, that was two interceptor calls per RPC less on the
    step path (bench/results/steps.md, issue 29).
    """

    def __init__(self, layers: Sequence[WrappingInterceptor]) -> None:
        super().__init__()
        self._layers = tuple(layers)

    def rewrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        for layer in reversed(self._layers):  # the innermost wraps the handler first
            handler = layer.rewrap(method, handler)
        return handler


async def call(behavior: Handler, request: Any, context: Any) -> Any:
    """Run a unary behaviour, awaiting it if it is a coroutine function."""
    result = behavior(request, context)
    return await result if inspect.isawaitable(result) else result
