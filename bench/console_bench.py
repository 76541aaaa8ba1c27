"""The console on big runs and long lists (issue 30, item 8).

Targets: a run with 20,000 events opens to its first screen in p95 < 1 s; the runs list over
100,000 runs answers in < 200 ms. Measured against ``agentrt serve --console-listen`` in its
own process on a fresh database, on each engine, by one client fetching pages one at a time
(the time until the whole HTML page is received, which is the first screen: the page has no
request of its own but its stylesheet and script, both static and cached):

* **big run**: one run whose worker recorded 10,000 steps (BeginStep + EndStep each: 20,000
  step events, and the run's own): its page (the first 200 steps; what a live page fetches
  again as events arrive) and a page of steps deep in the run;
* **runs list**: 100,000 runs over 1,000 threads (created in a batch of concurrent calls):
  the first page, the first page filtered by status, by agent, by the tag followed (which
  none followed: the runs pin a version), by the agent's digest (which all are bound to) and
  by a creation time range ending at the 1,000th oldest run (few match, the oldest: the
  list, newest first, walks past the others), the 20th page;
* **baseline**: the console's static stylesheet (the same HTTP stack, no API call) and an
  empty gRPC call (``Health/Check``), in the same process, so the figures read as ratios on
  a noisy machine.

    .venv/bin/python bench/console_bench.py [--engines sqlite,postgres] [--runs 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import os
import re
import statistics
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "generated")]

from agentrt.runtime.v1 import (  # noqa: E402
    enum_pb2,
    message_pb2,
    runtime_service_pb2_grpc,
)
from agentrt.runtime.v1 import runtime_service_pb2 as pb  # noqa: E402
from bench.common import database, free_port, server_process  # noqa: E402
from bench.steps_bench import AGENT_REF, setup_workers  # noqa: E402

SAMPLES = 40
BIG_RUN_PAIRS = 10_000
RUN_PAGE_TARGET_S = 1.0
LIST_TARGET_S = 0.2


def fetch_seconds(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
        assert response.status == 200, (url, response.status)
    elapsed = time.perf_counter() - started
    assert b"</html>" in body or url.endswith(".css"), url
    return elapsed


def timed(name: str, fetch: Callable[[], float], samples: int = SAMPLES) -> dict[str, float]:
    fetch()  # warm: connections, caches
    seconds = sorted(fetch() for _ in range(samples))
    p95 = seconds[min(len(seconds) - 1, round(0.95 * len(seconds)) - 1)]
    row = {"p50": statistics.median(seconds), "p95": p95, "max": seconds[-1]}
    print(
        f"  {name}: p50 {row['p50'] * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
        file=sys.stderr,
        flush=True,
    )
    return row


async def big_run(address: str) -> tuple[str, str]:
    """A run with :data:`BIG_RUN_PAIRS` steps; its id and the token of its 25th step page."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    try:
        (worker,) = await setup_workers(channels, 1)
        await asyncio.gather(*(worker.pairs(BIG_RUN_PAIRS // 8, [], []) for _ in range(8)))
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channels[0])
        listed = await runtime.ListRuns(pb.ListRunsRequest(page_size=1))
        run_id = listed.runs[0].id
        token = ""
        for _ in range(25):
            page = await runtime.ListSteps(
                pb.ListStepsRequest(run_id=run_id, page_size=200, page_token=token)
            )
            token = page.next_page_token
        return run_id, token
    finally:
        for channel in channels:
            await channel.close()


async def many_runs(address: str, total: int) -> None:
    """``total`` runs of the steps agent over 1,000 threads, 64 calls in flight."""
    async with grpc.aio.insecure_channel(address) as channel:
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
        threads = []
        for i in range(1000):
            created = await runtime.CreateThread(
                pb.CreateThreadRequest(
                    request_id=f"list-t{i}",
                    title=f"list {i}",
                    concurrency_policy=enum_pb2.CONCURRENCY_POLICY_ALLOW,
                )
            )
            threads.append(created.thread.id)
        queue = iter(range(total))

        async def creator() -> None:
            for i in queue:
                await runtime.CreateRun(
                    pb.CreateRunRequest(
                        request_id=f"list-r{i}",
                        thread_id=threads[i % len(threads)],
                        agent_ref=AGENT_REF,
                        goal=message_pb2.Goal(objective=f"list run {i}"),
                    )
                )
                if i and i % 10_000 == 0:
                    print(f"  {i:,} runs", file=sys.stderr, flush=True)

        await asyncio.gather(*(creator() for _ in range(64)))


def agent_digest(address: str) -> str:
    """The digest the bench's runs are bound to."""
    with grpc.insecure_channel(address) as channel:
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
        run = runtime.ListRuns(pb.ListRunsRequest(page_size=1), timeout=30).runs[0]
        return str(run.agent.agent_digest)


def first_created(address: str, runs_from: int) -> str:
    """The creation time (ISO 8601) of the ``runs_from``-th oldest run: a time range that
    ends there matches the oldest runs only, so a list newest first walks past all the
    others (the worst case of a time filter)."""
    oldest: collections.deque[str] = collections.deque(maxlen=runs_from)
    with grpc.insecure_channel(address) as channel:
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
        token = ""
        while True:
            page = runtime.ListRuns(
                pb.ListRunsRequest(page_size=1000, page_token=token), timeout=60
            )
            oldest.extend(run.create_time.ToJsonString() for run in page.runs)
            token = page.next_page_token
            if not token:
                return oldest[0]


def analyze_as_autovacuum_would(url: str) -> None:
    """Gather the planner's statistics of the tables just filled, as autovacuum does within
    a minute of that many inserts on a server that runs it (PostgreSQL's default).

    This machine's PostgreSQL runs with ``autovacuum = off`` (a test server): without this
    the planner believes ``runtime_runs`` nearly empty (23 rows estimated for 90,000) and
    reads every match of a filtered list through a bitmap scan, sorting them, instead of
    walking an index newest first (EXPLAIN ANALYZE in bench/results/console.md)."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            on = connection.exec_driver_sql("SHOW autovacuum").scalar()
            print(f"  autovacuum is {on}: ANALYZE runtime_runs, runtime_threads", file=sys.stderr)
            connection.exec_driver_sql("ANALYZE runtime_runs")
            connection.exec_driver_sql("ANALYZE runtime_threads")
    finally:
        engine.dispose()


def empty_call(address: str) -> Callable[[], float]:
    channel = grpc.insecure_channel(address)
    stub = health_pb2_grpc.HealthStub(channel)

    def call() -> float:
        started = time.perf_counter()
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        return time.perf_counter() - started

    return call


def run_engine(engine: str, total_runs: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    port = free_port()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database(engine))
        address = stack.enter_context(
            server_process(url, extra_args=("--console-listen", f"127.0.0.1:{port}"))
        )
        console = f"http://127.0.0.1:{port}"
        print(f"[{engine}] a run of {BIG_RUN_PAIRS * 2:,} step events…", file=sys.stderr)
        started = time.perf_counter()
        run_id, deep_token = asyncio.run(big_run(address))
        print(f"  written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows["empty gRPC call (baseline)"] = timed("empty call", empty_call(address))
        rows["static stylesheet (baseline)"] = timed(
            "stylesheet", lambda: fetch_seconds(f"{console}/static/console.css")
        )
        rows[f"run page, {BIG_RUN_PAIRS * 2:,} step events (first 200 steps)"] = timed(
            "big run page", lambda: fetch_seconds(f"{console}/runs/{run_id}")
        )
        deep = urllib.parse.quote(deep_token, safe="")
        rows["run page, steps 5,001-5,200"] = timed(
            "deep steps page", lambda: fetch_seconds(f"{console}/runs/{run_id}?steps={deep}")
        )
        print(f"[{engine}] {total_runs:,} runs…", file=sys.stderr)
        started = time.perf_counter()
        asyncio.run(many_runs(address, total_runs))
        print(f"  created in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        if engine == "postgres":
            analyze_as_autovacuum_would(url)
        label = f"{total_runs + 1:,} runs"
        rows[f"runs list, {label}, first page"] = timed(
            "runs list", lambda: fetch_seconds(f"{console}/runs")
        )
        rows[f"runs list, {label}, status QUEUED"] = timed(
            "runs list by status", lambda: fetch_seconds(f"{console}/runs?status=QUEUED")
        )
        rows[f"runs list, {label}, agent steps_agent"] = timed(
            "runs list by agent", lambda: fetch_seconds(f"{console}/runs?agent=steps_agent")
        )
        rows[f"runs list, {label}, tag prod (none followed it)"] = timed(
            "runs list by tag", lambda: fetch_seconds(f"{console}/runs?tag=prod")
        )
        digest = urllib.parse.quote(agent_digest(address), safe="")
        rows[f"runs list, {label}, the agent's digest"] = timed(
            "runs list by digest", lambda: fetch_seconds(f"{console}/runs?digest={digest}")
        )
        early = urllib.parse.quote(first_created(address, runs_from=1_000), safe="")
        rows[f"runs list, {label}, created before the 1,000th run"] = timed(
            "runs list, early", lambda: fetch_seconds(f"{console}/runs?before={early}")
        )
        token = ""
        for _ in range(19):
            with urllib.request.urlopen(f"{console}/runs?page={token}", timeout=60) as page:
                found = re.search(rb'rel="next" href="/runs\?([^"]+)"', page.read())
            assert found, "a next page"
            token = urllib.parse.parse_qs(found.group(1).decode().replace("&amp;", "&"))["page"][0]
        twentieth = urllib.parse.quote(token, safe="")
        rows[f"runs list, {label}, 20th page"] = timed(
            "runs list page 20", lambda: fetch_seconds(f"{console}/runs?page={twentieth}")
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    results = {engine: run_engine(engine, args.runs) for engine in args.engines.split(",")}
    print(f"Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; cores: {os.cpu_count()}\n")
    for engine, rows in results.items():
        print(f"**{engine}** — {SAMPLES} fetches each, one at a time\n")
        print("| page | p50 | p95 | max | target |")
        print("|---|---|---|---|---|")
        for name, row in rows.items():
            target = (
                f"p95 < {RUN_PAGE_TARGET_S * 1000:.0f} ms — "
                + ("PASS" if row["p95"] < RUN_PAGE_TARGET_S else "FAIL")
                if name.startswith("run page")
                else f"< {LIST_TARGET_S * 1000:.0f} ms (p95) — "
                + ("PASS" if row["p95"] < LIST_TARGET_S else "FAIL")
                if name.startswith("runs list")
                else ""
            )
            print(
                f"| {name} | {row['p50'] * 1000:.1f} ms | {row['p95'] * 1000:.1f} ms"
                f" | {row['max'] * 1000:.1f} ms | {target} |"
            )
        print()


if __name__ == "__main__":
    main()
