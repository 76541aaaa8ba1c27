"""A demo worker process: ``python -m agentrt_sdk.demo.worker_main --target HOST:PORT``.

It runs the login-fix logic (:mod:`agentrt_sdk.demo.login_fix`) until SIGTERM or SIGINT;
``agentrt demo`` starts two of them and kills the first with SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.demo import telemetry
from agentrt_sdk.demo.login_fix import login_fix, scripted_model, tools_for
from agentrt_sdk.worker import Worker


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with AgentrtClient(args.target) as client:
        worker = Worker(
            client,
            login_fix,
            model=scripted_model(rate_limit_primary_once=args.rate_limit_once),
            tools=tools_for(Path(args.workspace)),
            worker_id=args.worker_id,
            lease_ttl=args.lease_ttl,
            poll_wait=1.0,
            concurrency=args.concurrency,
            labels=dict(label.split("=", 1) for label in args.label),
        )
        print(f"worker {args.worker_id} ready", flush=True)
        if args.start_after:
            # Started early so its imports overlap the demo's other work; it takes no run
            # before the demo says so.
            while not stop.is_set() and not os.path.exists(args.start_after):  # noqa: ASYNC110, ASYNC240 - one stat per 50 ms
                await asyncio.sleep(0.05)
        await worker.run(stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrt-demo-worker")
    parser.add_argument("--target", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rate-limit-once", action="store_true")
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="take only such runs"
    )
    parser.add_argument("--start-after", metavar="FILE", help="poll for runs once FILE exists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{args.worker_id}: %(message)s")
    stop_tracing = telemetry.configure("agentrt-demo-worker")
    try:
        asyncio.run(_serve(args))
    finally:
        stop_tracing()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
