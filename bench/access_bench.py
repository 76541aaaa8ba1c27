"""What authentication and authorisation cost a call: a worker's fenced call with and without
them, as a ratio.

Two ``grpc.aio`` servers in this process, each with the production error-mapping interceptor
(``agentrt_base.grpc_errors``) and the default per-principal limits around one trivial
handler mounted as ``WorkerService/Heartbeat`` (so the permission table's real rule applies:
``work.record``, the resource found through the fence's attempt id). One server authenticates
nobody (the default); the other reads a principals file with a worker token (``Authenticator``:
the token's SHA-256 looked up) and checks every request (``access.Authorizer`` over the real
``ResourceLookup``, whose kept answers serve every call after the first, as they do for a
worker's calls on one attempt). The client sends the token to both and calls both from one
loop, alternating rounds, so the machine's noise and the client's own cost fall on both
alike; only the ratio means anything. Then the two checks
alone, timed in a loop, in µs.

    .venv/bin/python bench/access_bench.py [--calls 3000] [--rounds 5] [--concurrency 16]

Results: ``bench/results/access.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.access import Authorizer, Resource
from agentrt_base.auth import new_token, token_entry
from agentrt_base.auth_gate import Authenticator
from agentrt_base.grpc_errors import ErrorMappingInterceptor
from agentrt_base.limits import Limiter, Limits
from bench.common import closed_loop
from runtime_service.services.resources import ResourceLookup

SERVICE = "agentrt.runtime.v1.WorkerService"
METHOD = f"/{SERVICE}/Heartbeat"
REQUEST = wpb.HeartbeatRequest(fence=message_pb2.Fence(attempt_id="att_bench", lease_epoch=1))


async def _heartbeat(request: Any, context: Any) -> wpb.HeartbeatResponse:
    return wpb.HeartbeatResponse()


class _OneRun:
    """Stands for the database behind ``ResourceLookup``: the attempt's run, read once (the
    lookup keeps the answer, so the bench measures what every later call costs)."""

    reads = 0

    async def read(self, fn: Any) -> Resource:
        self.reads += 1
        return Resource(namespace="team-a", name="coding_agent")


def _authenticated(config: str) -> tuple[Any, Any]:
    authenticator = Authenticator(config)

    async def gate(context: Any) -> None:
        await authenticator.authenticate(
            context.invocation_metadata() or (), context.auth_context()
        )

    lookup = ResourceLookup(_OneRun())  # type: ignore[arg-type]
    return gate, Authorizer(lookup).authorize


async def _server(gate: Any, authorize: Any) -> tuple[grpc.aio.Server, int]:
    interceptor = ErrorMappingInterceptor(gate, Limiter(Limits()), authorize)
    server = grpc.aio.server(interceptors=[interceptor])
    handler = grpc.unary_unary_rpc_method_handler(
        _heartbeat,
        request_deserializer=wpb.HeartbeatRequest.FromString,
        response_serializer=wpb.HeartbeatResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Heartbeat": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _principals_file(directory: str) -> tuple[str, str]:
    token = new_token()
    path = Path(directory) / "auth.toml"
    path.write_text(token_entry("worker-1", token, ["worker"], ["coding_agent*"], ["team-a"]))
    return str(path), token


async def end_to_end(
    config: str, token: str, calls: int, rounds: int, concurrency: int
) -> dict[str, list[float]]:
    open_server, open_port = await _server(None, None)
    checked_server, checked_port = await _server(*_authenticated(config))
    rates: dict[str, list[float]] = {"without": [], "with": []}
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{open_port}") as a,
            grpc.aio.insecure_channel(f"127.0.0.1:{checked_port}") as b,
        ):
            stubs = {
                name: channel.unary_unary(
                    METHOD,
                    request_serializer=wpb.HeartbeatRequest.SerializeToString,
                    response_deserializer=wpb.HeartbeatResponse.FromString,
                )
                for name, channel in (("without", a), ("with", b))
            }
            # Both are sent the token (the open server ignores it): the client's cost of
            # sending it falls on both sides, and the ratio is the server's checks alone.
            sent = {"without": metadata, "with": metadata}
            for name, stub in stubs.items():  # warm both up (handler wrapping, connections)
                await closed_loop(
                    name, lambda i, s=stub, m=sent[name]: s(REQUEST, metadata=m), 300, concurrency
                )
            for r in range(rounds):
                order = list(stubs) if r % 2 == 0 else list(reversed(stubs))
                for name in order:
                    stub, m = stubs[name], sent[name]
                    result = await closed_loop(
                        name, lambda i, s=stub, m=m: s(REQUEST, metadata=m), calls, concurrency
                    )
                    rates[name].append(result.rps)
    finally:
        await open_server.stop(0)
        await checked_server.stop(0)
    return rates


class _Context:
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> Any:
        return self._metadata

    def auth_context(self) -> dict[str, Any]:
        return {}


async def check_costs(config: str, token: str, n: int) -> dict[str, float]:
    """µs per authentication (a static token) and per authorisation (a kept lookup)."""
    gate, authorize = _authenticated(config)
    context = _Context(token)
    costs = {}
    started = time.perf_counter()
    for _ in range(n):
        await gate(context)
    costs["authenticate (API token)"] = (time.perf_counter() - started) / n * 1e6
    await authorize(METHOD, REQUEST)  # the one read; kept from here on
    started = time.perf_counter()
    for _ in range(n):
        await authorize(METHOD, REQUEST)
    costs["authorize (fenced call, kept lookup)"] = (time.perf_counter() - started) / n * 1e6
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        config, token = _principals_file(directory)
        rates = asyncio.run(end_to_end(config, token, args.calls, args.rounds, args.concurrency))
        costs = asyncio.run(check_costs(config, token, 100_000))
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    print(
        f"Heartbeat-shaped call, {args.rounds} alternating rounds of {args.calls} calls at"
        f" concurrency {args.concurrency} (medians; client and servers in one process)"
    )
    print("| authentication + authorisation | calls/s | per round |")
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
    for name, micros in costs.items():
        print(f"{name}: {micros:.2f} µs")


if __name__ == "__main__":
    main()
