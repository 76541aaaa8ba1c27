"""Wrapping interceptors mounted as one (``handler_wrap.Stacked``) wrap a call exactly as gRPC's
own chain of the same interceptors does, outermost first, for every kind of method, and each
method's handler is wrapped once, not on every call. Exercised through real aio servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agentrt_base.handler_wrap import Handler, Stacked, WrappingInterceptor, call


class Recording(WrappingInterceptor):
    """Appends ``+name`` to ``log`` when a call enters its wrapper and ``-name`` when it
    leaves; counts the wrappers it made."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name, self.log, self.made = name, log, 0

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        self.made += 1

        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.log.append(f"+{self.name}")
            try:
                return await call(behavior, request, context)
            finally:
                self.log.append(f"-{self.name}")

        return wrapper

    def wrap_stream(self, method: str, kind: str, behavior: Handler) -> Handler:
        self.made += 1

        async def generator(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            self.log.append(f"+{self.name}")
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                self.log.append(f"-{self.name}")

        return generator


class Health(health.aio.HealthServicer):
    """Health's Check, and a Watch that yields (the stock one writes through the context)."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self._log = log

    async def Check(self, request: Any, context: Any) -> Any:
        self._log.append("handler")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self._log.append("handler")
        for _ in range(2):
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def _calls(
    mount: Callable[[list[WrappingInterceptor]], list[grpc.aio.ServerInterceptor]],
) -> tuple[list[str], list[str], list[int]]:
    """What three interceptors a, b, c (mounted by ``mount``) saw of a Check and of a
    Watch, each called twice, and how many wrappers each made."""
    log: list[str] = []
    layers = [Recording(name, log) for name in "abc"]
    server = grpc.aio.server(interceptors=mount(list(layers)))
    health_pb2_grpc.add_HealthServicer_to_server(Health(log), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(2):
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            unary, log[:] = list(log), []
            for _ in range(2):
                assert len([r async for r in stub.Watch(health_pb2.HealthCheckRequest())]) == 2
            streamed = list(log)
    finally:
        await server.stop(0)
    return unary, streamed, [layer.made for layer in layers]


@pytest.mark.parametrize("kind", ["unary", "stream"])
def test_stacked_wraps_as_grpcs_own_chain_does(kind: str) -> None:
    chained = asyncio.run(_calls(lambda layers: list(layers)))
    stacked = asyncio.run(_calls(lambda layers: [Stacked(layers)]))
    one_call = ["+a", "+b", "+c", "handler", "-c", "-b", "-a"]
    seen = {"unary": 0, "stream": 1}[kind]
    assert chained[seen] == stacked[seen] == one_call * 2
    # Wrapped once per method (Check, Watch), not once per call, by each layer.
    assert chained[2] == stacked[2] == [2, 2, 2]


def test_a_handler_registered_again_is_wrapped_again() -> None:
    log: list[str] = []
    layer = Recording("a", log)
    stacked = Stacked([layer])

    async def unary(request: Any, context: Any) -> str:
        return "served"

    class Details:
        method = "/x.Y/Z"
        invocation_metadata = ()

    async def intercept(handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
        async def continuation(_: grpc.HandlerCallDetails) -> Any:
            return handler

        return await stacked.intercept_service(continuation, cast(Any, Details()))

    first = grpc.unary_unary_rpc_method_handler(unary)
    again = grpc.unary_unary_rpc_method_handler(unary)
    wrapped = [asyncio.run(intercept(h)) for h in (first, first, again)]
    assert wrapped[0] is wrapped[1] and wrapped[2] is not wrapped[0]
    assert layer.made == 2
