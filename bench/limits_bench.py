"""What the per-principal limits cost a call: an empty call with and without them, as a ratio.

Two ``grpc.aio`` servers in this process, each with the production error-mapping interceptor
(``agentrt_base.grpc_errors``) around one empty unary method under an agentrt name (so it gets
the whole wrapper: gate, limits, request check); one has a :class:`Limiter` with the default
limits, the other none. The client calls both from the same loop, alternating rounds, so the
machine's noise falls on both alike; only the ratio means anything. Nobody is authenticated,
so every call takes the anonymous path (``context.peer()`` parsed into ``anonymous@host``),
the dearer of the two. Then :meth:`Limiter.admit` alone, timed in a loop, for its cost in µs.

    .venv/bin/python bench/limits_bench.py [--calls 3000] [--rounds 5] [--concurrency 16]

Results: ``bench/results/limits.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrt_base.grpc_errors import ErrorMappingInterceptor
from agentrt_base.limits import Kind, Limiter, Limits
from bench.common import closed_loop

SERVICE = "agentrt.bench.v1.Bench"
METHOD = f"/{SERVICE}/Ping"


async def _ping(request: Any, context: Any) -> health_pb2.HealthCheckResponse:
    return health_pb2.HealthCheckResponse()


async def _server(limiter: Limiter | None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor(None, limiter)])
    handler = grpc.unary_unary_rpc_method_handler(
        _ping,
        request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Ping": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def end_to_end(calls: int, rounds: int, concurrency: int) -> dict[str, list[float]]:
    plain, plain_port = await _server(None)
    limited, limited_port = await _server(Limiter(Limits()))
    rates: dict[str, list[float]] = {"without": [], "with": []}
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{plain_port}") as a,
            grpc.aio.insecure_channel(f"127.0.0.1:{limited_port}") as b,
        ):
            stubs = {
                "without": a.unary_unary(
                    METHOD,
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString,
                ),
                "with": b.unary_unary(
                    METHOD,
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString,
                ),
            }
            request = health_pb2.HealthCheckRequest()
            for name, stub in stubs.items():  # warm both up (handler wrapping, connections)
                await closed_loop(name, lambda i, s=stub: s(request), 300, concurrency)
            for r in range(rounds):
                order = list(stubs) if r % 2 == 0 else list(reversed(stubs))
                for name in order:
                    stub = stubs[name]
                    result = await closed_loop(
                        name, lambda i, s=stub: s(request), calls, concurrency
                    )
                    rates[name].append(result.rps)
    finally:
        await plain.stop(0)
        await limited.stop(0)
    return rates


def admit_cost(n: int) -> dict[str, float]:
    """µs per :meth:`Limiter.admit` (a plain call, and a watch taking and freeing its slot)."""
    # A rate no loop reaches, so every call runs the bucket's arithmetic and is admitted.
    limiter = Limiter(Limits(requests_per_second=1e12, burst=10**9))
    costs = {}
    started = time.perf_counter()
    for _ in range(n):
        limiter.admit("anonymous@127.0.0.1", None, None)
    costs["admit (rate only)"] = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        slot = limiter.admit("anonymous@127.0.0.1", None, Kind.WATCH)
        assert slot is not None
        slot.release()
    costs["admit + release (watch)"] = (time.perf_counter() - started) / n * 1e6
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rates = asyncio.run(end_to_end(args.calls, args.rounds, args.concurrency))
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    print(
        f"empty unary call, {args.rounds} alternating rounds of {args.calls} calls at"
        f" concurrency {args.concurrency} (medians; client and servers in one process)"
    )
    print("| limits | calls/s | per round |")
    print("|---|---|---|")
    for name, median in (("without", without), ("with", with_)):
        each = ", ".join(f"{r:.0f}" for r in rates[name])
        print(f"| {name} | {median:.0f} | {each} |")
    ratios = [w / o for w, o in zip(rates["with"], rates["without"], strict=True)]
    print(
        f"\nratio with/without: {with_ / without:.3f} (per round: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + ")"
    )
    print()
    for name, micros in admit_cost(200_000).items():
        print(f"{name}: {micros:.2f} µs")


if __name__ == "__main__":
    main()
