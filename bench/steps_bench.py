"""Step benchmark: BeginStep + EndStep pairs over gRPC, next to an empty call and to DBOS.

The step path is the hot path (issue: "Performance"). For each engine the script starts
``agentrt serve`` in its own process on a fresh database and publishes a small agent (an inline
prompt, a model policy with one candidate, a tool ``noop@1``, a permission policy whose default
is ALLOW, no completion policy). It creates 64 threads (policy ALLOW) with one run each,
acquires every run (lease 600 s, so no heartbeats are needed) and opens a turn in each.

Then, in 3 interleaved repetitions, for 1, 16 and 64 concurrent workers:

* the empty call (``grpc.health.v1.Health/Check``) with as many calls in flight as workers;
* the workers: each is an asyncio task driving its own run, looping
  ``BeginStep(MODEL_CALL, model_call={})`` then ``EndStep(SUCCEEDED, small usage)``, with no
  idempotency key, for a fixed number of pairs (``--pairs`` in all at 16 and 64 workers, an
  eighth of it with one worker). Every write is acknowledged only once it is
  committed (the server's SQLite runs WAL + ``synchronous=FULL`` with group commit).

Both loops run in this process, on the same grpc.aio channels (worker ``i`` uses channel
``i % 4``), so a step RPC and an empty RPC pay the same client cost. Reported per cell: the
repetition with the median rate (its latencies with it). "step RPC/s" counts both calls of a
pair, so it is twice the pairs/s; its ratio to the empty rate at the same concurrency is the
issue's "each step RPC at >= 0.5x the empty-RPC rate". The server's CPU time (user + system,
from ``/proc/<pid>/stat``) over each loop, divided by its calls or pairs, is reported too
(median over the repetitions): it does not depend on what else the machine is running. The
server writes the step path's common case in a second process
(``runtime_service.step_process``; on PostgreSQL in batches of two round trips); that
process's CPU per pair is reported beside the server's, in parentheses.

DBOS (the ``bench`` extra), in process, no network hop: a child Python process per
configuration runs workflows whose body calls a trivial ``@DBOS.step()`` repeatedly, one
workflow at a time (1 thread) and 16 workflows in parallel (16 threads), each for a fixed
wall time; steps/s is steps completed / time. Configurations: the SQLite system database with
DBOS's defaults (rollback journal, ``synchronous=FULL``: durable), with WAL +
``synchronous=FULL`` (durable; what agentrt uses), and with WAL + ``synchronous=NORMAL``
(not durable across power loss; reported as a reference only), plus a PostgreSQL system
database. DBOS repetitions are interleaved with the first engine's repetitions. The target's
denominator is the best durable SQLite DBOS figure of the run.

    .venv/bin/python bench/steps_bench.py [--engines sqlite,postgres] [--pairs 512]

Output: Markdown tables on stdout (recorded in bench/results/steps.md).

A/B mode, to show that a change keeps the step path's speed: ``--ab OLD_REF[,NEW_REF]``.
Side A runs the code of ``OLD_REF``; side B that of ``NEW_REF``, or, without it, this
checkout's working tree (uncommitted changes included). A ref is checked out with
``git worktree add --detach`` into a temporary directory, removed afterwards. A side's server
is ``agentrt serve`` on the same interpreter, started in its checkout with the checkout first
on ``PYTHONPATH`` (ahead of the virtualenv's editable install); the report says which
``runtime_service`` each server imports, and the run stops if the server or a process under
it (the step writer's) runs elsewhere. The client, this file, is the same for both sides. Per
engine, both servers start on fresh databases and each gets 16 workers, set up and warmed up
as above; then in each repetition (``--repetitions``, default 5) each side in turn, A first
in odd repetitions and B first in even ones, runs the empty loop then the 16-worker step loop
while the other server idles. No DBOS. Reported per engine and side: the medians over the
repetitions of the empty calls/s, step RPC/s, step RPC / empty (each repetition's own ratio,
then their median), pairs/s, server CPU per pair and machine busy; each repetition's figures;
and B/A of the median ratio and of the median pairs/s. The criterion (the step path
refactor's), with PASS or FAIL: B/A >= 0.95 on SQLite's step RPC / empty and on PostgreSQL's
pairs/s, over at least 5 repetitions.

    .venv/bin/python bench/steps_bench.py --ab main [--engines sqlite,postgres] [--repetitions 5]

Reading it: the "B/A within each repetition" lines compare the two sides measured seconds
apart, so their spread is the run's noise; a B/A of the medians closer to 1 than that spread
is no evidence of a change either way. An A/A run (``--ab HEAD,HEAD``: the same code on both
sides) measures the noise. Two A/A runs at the default sizes on the shared 2-core machine,
with other sessions at work (machine 88-95 % busy), gave these B/A of the medians: SQLite
step RPC / empty 1.21 and 1.40, SQLite pairs/s 1.02 and 1.11, PostgreSQL pairs/s 0.73 (a
FAIL on identical code) and 0.96, CPU per pair 0.99 to 1.04; single repetitions' B/A spanned
0.25-2.6 for the ratio, 0.57-1.63 for pairs/s, 0.84-1.10 for the CPU per pair. So:

* the ratio is the noisiest figure here: the interleaving already cancels the machine's
  speed, and dividing by the empty rate (2,400 to 6,100 calls/s within one run) adds that
  loop's noise. In one A/A run one server's empty rate stayed below the other's in every
  repetition: two servers of the same code can differ for a whole run (placement on the two
  cores), which interleaving cannot cancel;
* a 5 % criterion needs a quiet machine (check ``uptime``), longer loops (``--pairs``,
  ``--calls``) and more repetitions, an even number so that each side goes first as often;
* the CPU per pair, barely moved by other load, is the steadiest check of a change in the
  step path's cost (10 ms clock ticks: about 20 µs per pair at 512 pairs).

Observability mode, the cost of metrics and of tracing (issue 29): ``--observability``. This
checkout's code twice, for each of the two: one side serves as it is, the other with
``--metrics-listen`` and its ``/metrics`` scraped every second while it is measured (the runs
gauge reads the database at each scrape), or with the ``OTEL_*`` variables exporting every
trace (and the GenAI metrics) to an OTLP receiver on this machine. Unlike ``--ab``, every
repetition starts both servers anew (in turn which first) and measures them A B B A or B A A B:
two servers of the same code kept for a whole run differed by up to 14 % (an A/A run on
PostgreSQL), which the two sides' interleaving cannot cancel, and which a fresh pair per
repetition turns into noise that the median over repetitions absorbs. ``--rounds N`` measures
each repetition's pair N times over, each sample an N-th of ``--pairs``: the machine's speed
moves within seconds, and the closer together the two sides' samples, the more of it their
ratio cancels. The criteria: the
median over the repetitions of on/off pairs/s >= 0.95 for metrics and >= 0.85 for tracing on
each engine.

    .venv/bin/python bench/steps_bench.py --observability [--engines sqlite,postgres] \
        [--repetitions 10 --pairs 2048 --rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402
from google.protobuf import duration_pb2, struct_pb2  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from agentrt.registry.v1 import enum_pb2 as renum  # noqa: E402
from agentrt.registry.v1 import message_pb2 as rmsg  # noqa: E402
from agentrt.registry.v1 import registry_service_pb2 as rpb  # noqa: E402
from agentrt.registry.v1 import registry_service_pb2_grpc  # noqa: E402
from agentrt.runtime.v1 import (  # noqa: E402
    enum_pb2,
    message_pb2,
    runtime_service_pb2_grpc,
    worker_service_pb2_grpc,
)
from agentrt.runtime.v1 import runtime_service_pb2 as pb  # noqa: E402
from agentrt.runtime.v1 import worker_service_pb2 as wpb  # noqa: E402
from bench.common import (  # noqa: E402
    ROOT,
    Result,
    closed_loop,
    database,
    free_port,
    median_result,
    server_env,
    server_process,
)

CONCURRENCY = (1, 16, 64)
CHANNELS = 4
AGENT_REF = "steps_agent@v1"
DBOS_CONFIGS = {
    "sqlite-default": "SQLite, DBOS defaults (rollback journal, synchronous=FULL)",
    "sqlite-wal-full": "SQLite, WAL + synchronous=FULL",
    "sqlite-wal-normal": "SQLite, WAL + synchronous=NORMAL (not power-loss durable)",
    "postgres": "PostgreSQL 15 (loopback)",
}
DURABLE_SQLITE = ("sqlite-default", "sqlite-wal-full")


# --------------------------------------------------------------------------- agentrt


def components() -> list[rmsg.ComponentDraft]:
    schema = struct_pb2.Struct()
    schema.update({"type": "object"})
    return [
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_TOOL,
            name="noop",
            version="1",
            spec=rmsg.ComponentSpec(
                tool=rmsg.ToolSpec(description="does nothing", input_schema=schema)
            ),
        ),
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_MODEL_POLICY,
            name="steps-model",
            version="1",
            spec=rmsg.ComponentSpec(
                model_policy=rmsg.ModelPolicySpec(
                    candidates=[rmsg.ModelCandidate(name="primary", provider="p", model_id="m1")]
                )
            ),
        ),
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_PERMISSION_POLICY,
            name="steps-perms",
            version="1",
            spec=rmsg.ComponentSpec(
                permission_policy=rmsg.PermissionPolicySpec(
                    default_decision=renum.PERMISSION_DECISION_ALLOW
                )
            ),
        ),
    ]


def definition() -> rmsg.AgentDefinition:
    return rmsg.AgentDefinition(
        agent_id="steps_agent",
        version_label="v1",
        description="step benchmark",
        system_prompt=rmsg.SystemPrompt(text="You are a benchmark agent."),
        model_policy="steps-model@1",
        tools=["noop@1"],
        permission_policy="steps-perms@1",
    )


class Worker:
    """One acquired run with an open turn; records BeginStep and EndStep latencies."""

    def __init__(self, stub: Any, fence: message_pb2.Fence, turn_id: str) -> None:
        self.stub = stub
        self.fence = fence
        self.turn_id = turn_id

    async def pairs(self, count: int, begin_ms: list[float], end_ms: list[float]) -> None:
        usage = message_pb2.Usage(input_tokens=12, output_tokens=3, cost_usd=0.0001)
        for _ in range(count):
            t0 = time.perf_counter()
            begun = await self.stub.BeginStep(
                wpb.BeginStepRequest(
                    fence=self.fence,
                    turn_id=self.turn_id,
                    type=enum_pb2.STEP_TYPE_MODEL_CALL,
                    model_call=message_pb2.ModelCallSpec(),
                )
            )
            t1 = time.perf_counter()
            await self.stub.EndStep(
                wpb.EndStepRequest(
                    fence=self.fence,
                    step_id=begun.step.id,
                    status=enum_pb2.STEP_STATUS_SUCCEEDED,
                    usage=usage,
                )
            )
            t2 = time.perf_counter()
            begin_ms.append((t1 - t0) * 1000)
            end_ms.append((t2 - t1) * 1000)


async def setup_workers(channels: list[grpc.aio.Channel], count: int) -> list[Worker]:
    registry = registry_service_pb2_grpc.RegistryServiceStub(channels[0])
    runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channels[0])
    for draft in components():
        await registry.PublishComponent(rpb.PublishComponentRequest(component=draft))
    await registry.PublishAgentVersion(rpb.PublishAgentVersionRequest(definition=definition()))
    for i in range(count):
        thread = await runtime.CreateThread(
            pb.CreateThreadRequest(
                request_id=f"t{i}",
                title=f"steps {i}",
                concurrency_policy=enum_pb2.CONCURRENCY_POLICY_ALLOW,
            )
        )
        await runtime.CreateRun(
            pb.CreateRunRequest(
                request_id=f"r{i}",
                thread_id=thread.thread.id,
                agent_ref=AGENT_REF,
                goal=message_pb2.Goal(objective="step benchmark"),
            )
        )
    workers = []
    for i in range(count):
        stub = worker_service_pb2_grpc.WorkerServiceStub(channels[i % len(channels)])
        acquired = await stub.AcquireRun(
            wpb.AcquireRunRequest(
                worker_id=f"bench-{os.getpid()}-{i}",
                lease_ttl=duration_pb2.Duration(seconds=600),
                wait=duration_pb2.Duration(seconds=5),
            ),
            timeout=10,
        )
        if not acquired.HasField("run"):
            raise RuntimeError(f"AcquireRun {i} returned no run")
        turn = await stub.BeginTurn(wpb.BeginTurnRequest(fence=acquired.fence, request_id="turn1"))
        workers.append(Worker(stub, acquired.fence, turn.turn.id))
    return workers


def server_pid(address: str | None = None) -> int | None:
    """The pid of the ``agentrt serve`` child of this process (Linux ``/proc``) listening on
    ``address`` (any, when None; the A/B mode runs two at once), if found."""
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"runtime_service.cli.main" in cmdline and (
                    address is None or address.encode() in cmdline
                ):
                    return int(pid)
    return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the server's forkserver and step writer process)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    found += [int(child), *descendants(int(child))]
    return found


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (10 ms resolution), 0 when unknown."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of the server process itself and of all its child processes."""
    if pid is None:
        return 0.0, 0.0
    return cpu_seconds(pid), sum(cpu_seconds(child) for child in descendants(pid))


class StepRun:
    """One measurement of ``workers`` concurrent step loops."""

    def __init__(
        self,
        workers: int,
        pairs: int,
        seconds: float,
        begin_ms: list[float],
        end_ms: list[float],
        machine_busy: float = 0.0,
        client_cpu_s: float = 0.0,
    ) -> None:
        self.workers, self.pairs, self.seconds = workers, pairs, seconds
        self.begin = Result("BeginStep", pairs, seconds, begin_ms)
        self.end = Result("EndStep", pairs, seconds, end_ms)
        #: Share of the whole machine's CPU time that was busy meanwhile (every process).
        self.machine_busy = machine_busy
        self.client_cpu_s = client_cpu_s

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds


def machine_times() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (Linux ``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


async def step_run(workers: list[Worker], pairs_each: int) -> StepRun:
    begin_ms: list[float] = []
    end_ms: list[float] = []
    busy, total = machine_times()
    client = os.times()
    started = time.perf_counter()
    await asyncio.gather(*(w.pairs(pairs_each, begin_ms, end_ms) for w in workers))
    seconds = time.perf_counter() - started
    client_after = os.times()
    busy_after, total_after = machine_times()
    return StepRun(
        len(workers),
        pairs_each * len(workers),
        seconds,
        begin_ms,
        end_ms,
        machine_busy=(busy_after - busy) / max(total_after - total, 1),
        client_cpu_s=(client_after.user + client_after.system) - (client.user + client.system),
    )


def pairs_for(concurrency: int, pairs: int) -> int:
    """Pairs per worker: ``pairs`` in total at 16 and 64 workers, an eighth of it with one."""
    total = pairs // 8 if concurrency == 1 else pairs
    return max(total // concurrency, 5)


@dataclass
class Sample:
    """One empty loop and the step loop right after it, against one server."""

    empty: Result
    steps: StepRun
    empty_cpu_us: float  # server CPU per empty call
    pair_cpu_us: float  # server process CPU per Begin+End pair
    pair_child_cpu_us: float  # its step writer process's CPU per pair

    @property
    def ratio(self) -> float:
        """Step RPC / empty: both calls of a pair, over the empty rate measured just before."""
        return 2 * self.steps.pairs_per_s / self.empty.rps


class Target:
    """One running server, with this process's channels to it and its acquired workers."""

    def __init__(
        self, address: str, channels: list[grpc.aio.Channel], workers: list[Worker]
    ) -> None:
        self.channels = channels
        self.workers = workers
        self.healths: list[Any] = [health_pb2_grpc.HealthStub(ch) for ch in channels]
        self.request = health_pb2.HealthCheckRequest()
        self.pid = server_pid(address)

    @classmethod
    async def open(cls, address: str, workers: int) -> Target:
        """Set up ``workers`` workers on the server at ``address`` and warm it up."""
        channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]
        try:
            target = cls(address, channels, await setup_workers(channels, workers))
            # Warm-up: connections, the server's caches, SQLite's page cache.
            await step_run(target.workers[:16], 10)
            await target.empty("warm", 500, 16)
        except BaseException:
            await cls.close_all(channels)
            raise
        return target

    async def empty(self, name: str, calls: int, concurrency: int) -> Result:
        return await closed_loop(
            name, lambda i: self.healths[i % CHANNELS].Check(self.request), calls, concurrency
        )

    async def sample(self, concurrency: int, calls: int, pairs_each: int) -> Sample:
        """``calls`` empty calls, then ``pairs_each`` pairs by each of ``concurrency`` workers."""
        cpu = cpu_seconds(self.pid)
        e = await self.empty("empty", calls, concurrency)
        empty_cpu = (cpu_seconds(self.pid) - cpu) / calls * 1e6
        main_cpu, child_cpu = cpu_split(self.pid)
        r = await step_run(self.workers[:concurrency], pairs_each)
        main_after, child_after = cpu_split(self.pid)
        return Sample(
            e,
            r,
            empty_cpu,
            (main_after - main_cpu) / r.pairs * 1e6,
            (child_after - child_cpu) / r.pairs * 1e6,
        )

    async def close(self) -> None:
        await self.close_all(self.channels)

    @staticmethod
    async def close_all(channels: list[grpc.aio.Channel]) -> None:
        for ch in channels:
            await ch.close()


@dataclass
class Cell:
    """One concurrency level of one engine: the median repetitions and server CPU costs."""

    empty: Result
    steps: StepRun
    empty_cpu_us: float  # server CPU per empty call, median over repetitions
    pair_cpu_us: float  # server process CPU per Begin+End pair, median over repetitions
    pair_child_cpu_us: float  # its step writer process's CPU per pair, likewise
    #: Step RPC / empty of each repetition (its empty loop and the step loop right after it).
    ratios: list[float]

    @classmethod
    def of(cls, samples: list[Sample]) -> Cell:
        ordered = sorted(samples, key=lambda one: one.steps.pairs_per_s)
        return cls(
            median_result([one.empty for one in samples]),
            ordered[len(ordered) // 2].steps,
            statistics.median(one.empty_cpu_us for one in samples),
            statistics.median(one.pair_cpu_us for one in samples),
            statistics.median(one.pair_child_cpu_us for one in samples),
            [one.ratio for one in samples],
        )


async def run_engine(
    engine: str, pairs: int, calls: int, repetitions: int, dbos: DbosPool | None
) -> dict[int, Cell]:
    with database(engine) as url, server_process(url) as address:
        target = await Target.open(address, max(CONCURRENCY))
        try:
            samples: dict[int, list[Sample]] = {c: [] for c in CONCURRENCY}
            for rep in range(repetitions):
                for c in CONCURRENCY:
                    one = await target.sample(
                        c, calls // 4 if c == 1 else calls, pairs_for(c, pairs)
                    )
                    samples[c].append(one)
                    print(
                        f"  [{engine} rep {rep + 1}] {c:>2} workers: empty {one.empty.rps:,.0f}/s, "
                        f"pairs {one.steps.pairs_per_s:,.0f}/s",
                        file=sys.stderr,
                        flush=True,
                    )
                if dbos is not None:
                    dbos.repetition()
        finally:
            await target.close()
    return {c: Cell.of(samples[c]) for c in CONCURRENCY}


# --------------------------------------------------------------------------- DBOS


def dbos_child(config: str, seconds: float, url: str) -> None:
    """Runs in a child process: answers one JSON line of steps/s per ``rep`` line on stdin."""
    import logging

    import sqlalchemy as sa
    from sqlalchemy import event

    if config.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if config != "sqlite-default":
            import sqlite3

            with contextlib.closing(sqlite3.connect(path)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        sync = "NORMAL" if config == "sqlite-wal-normal" else "FULL"

        @event.listens_for(sa.engine.Engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute(f"PRAGMA synchronous={sync}")

    from dbos import DBOS, DBOSConfig

    cfg: DBOSConfig = {
        "name": "steps-bench",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=cfg)
    logging.getLogger("dbos").setLevel(logging.WARNING)

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def workflow(k: int) -> int:
        total = 0
        for i in range(k):
            total += noop(i)
        return total

    DBOS.launch()
    workflow(20)  # warm-up (tables, prepared statements)

    def loop(deadline: float, k: int, done: list[int]) -> None:
        while time.perf_counter() < deadline:
            workflow(k)
            done.append(k)

    def measure(threads: int, k: int) -> float:
        done: list[int] = []
        started = time.perf_counter()
        deadline = started + seconds
        pool = [threading.Thread(target=loop, args=(deadline, k, done)) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return sum(done) / (time.perf_counter() - started)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "rep":
            break
        one = measure(1, 50)
        sixteen = measure(16, 10)
        print(json.dumps({"1": one, "16": sixteen}), flush=True)
    DBOS.destroy()


class DbosPool:
    """The DBOS child processes, one per configuration, driven a repetition at a time."""

    def __init__(self, seconds: float, use_postgres: bool) -> None:
        self.seconds = seconds
        self.stack = contextlib.ExitStack()
        self.children: dict[str, subprocess.Popen[str]] = {}
        self.results: dict[str, list[dict[str, float]]] = {}
        self.errors: dict[str, str] = {}
        self.configs = [c for c in DBOS_CONFIGS if use_postgres or c != "postgres"]

    def __enter__(self) -> DbosPool:
        for config in self.configs:
            if config == "postgres":
                url = self.stack.enter_context(database("postgres"))
            else:
                tmp = self.stack.enter_context(tempfile.TemporaryDirectory())
                url = f"sqlite:///{tmp}/dbos.db"
            child = subprocess.Popen(
                [
                    *(sys.executable, __file__, "--dbos-child", config),
                    *("--dbos-url", url, "--dbos-seconds", str(self.seconds)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None
            ready = child.stdout.readline()
            if not ready:
                self.errors[config] = (child.stderr.read() if child.stderr else "").strip()[-400:]
                continue
            self.children[config] = child
            self.results[config] = []
        return self

    def repetition(self) -> None:
        for config, child in self.children.items():
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("rep\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if not line:
                self.errors[config] = "child exited during a repetition"
                continue
            self.results[config].append(json.loads(line))
            print(f"  [dbos {config}] {line.strip()}", file=sys.stderr, flush=True)

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            config: {k: statistics.median(r[k] for r in reps) for k in ("1", "16")}
            for config, reps in self.results.items()
            if reps
        }

    def __exit__(self, *exc: object) -> None:
        for child in self.children.values():
            with contextlib.suppress(Exception):
                assert child.stdin is not None
                child.stdin.close()
                child.wait(timeout=30)
        self.stack.close()


# --------------------------------------------------------------------------- A/B

AB_WORKERS = 16
AB_THRESHOLD = 0.95
AB_MIN_REPETITIONS = 5
#: Issue 29: the step path with metrics on keeps at least this share of its pairs/s.
OBSERVABILITY_THRESHOLD = 0.95
#: Tracing on (every trace sampled and exported) against off: issue 29's criterion.
TRACING_THRESHOLD = 0.85
#: The figure each engine's criterion is on (the step path refactor's): SQLite's step RPC /
#: empty ratio, PostgreSQL's pairs/s.
AB_CRITERION = {"sqlite": "ratio", "postgres": "pairs"}
AB_METRICS = {
    "ratio": "step RPC / empty",
    "pairs": "pairs/s",
    # Not a criterion, but CPU time barely depends on what else the machine runs, so it shows
    # a change in the cost of a pair through noise that swamps the rates.
    "cpu": "CPU µs / pair, server + step writer (lower is better)",
}


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class Side:
    """One side of an A/B run: the checkout whose code its servers run."""

    name: str  # "A" or "B"
    ref: str  # as given on the command line, or "working tree"
    root: Path
    describe: str  # ``git describe --always --dirty`` and the commit's subject
    #: ``agentrt serve``'s flags on this side (``--observability``: the same code, with
    #: metrics served and scraped on side B).
    server_args: tuple[str, ...] = ()
    #: Where this side's /metrics is scraped while it is measured (None: not served).
    metrics_url: str | None = None
    #: Its server's environment besides this process's (``OTEL_*`` on a traced side).
    server_env: Mapping[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def checkouts(refs: list[str | None]) -> Iterator[list[Side]]:
    """A side per ref: a detached worktree of the ref in a temporary directory (removed
    afterwards); None is this checkout's working tree, uncommitted changes included."""
    with (
        tempfile.TemporaryDirectory(prefix="agentrt-ab-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        sides = []
        for name, ref in zip("AB", refs, strict=True):
            if ref is None:
                root, label = ROOT, "working tree"
            else:
                commit = git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
                root, label = Path(tmp) / name, ref
                git("worktree", "add", "--detach", "--quiet", str(root), commit)
                stack.callback(git, "worktree", "remove", "--force", str(root))
            describe = git("describe", "--always", "--dirty", cwd=root)
            subject = git("log", "-1", "--format=%s", cwd=root)
            sides.append(Side(name, label, root, f"{describe} {subject[:60]}"))
        yield sides


#: How often ``--observability`` scrapes the metrics side's /metrics while it is measured
#: (env ``AGENTRT_BENCH_SCRAPE_EVERY``, seconds): by default every second, far more often than
#: a Prometheus would (15 s is the common interval), so the scrape's own cost (rendering every
#: series; the runs gauge reads the database) is in the figure, not hidden between scrapes.
SCRAPE_EVERY = float(os.environ.get("AGENTRT_BENCH_SCRAPE_EVERY", "1.0"))


@contextlib.asynccontextmanager
async def scraped(url: str | None) -> AsyncIterator[None]:
    """Scrape ``url`` every :data:`SCRAPE_EVERY` seconds on a thread while the block runs."""
    if url is None:
        yield
        return
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(SCRAPE_EVERY):
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        yield
    finally:
        stop.set()
        await asyncio.to_thread(scraper.join)


def running_code(side: Side, pid: int | None) -> str:
    """Where the server ``pid``, started for ``side``, takes its code from, checked.

    The ``runtime_service`` that the server's interpreter imports with its environment and
    working directory must be the side's checkout's, and the server and every process under it
    (the step writer's) must run with that working directory and that checkout first on
    ``PYTHONPATH``: an old side silently running the new code would compare the new code with
    itself.
    """
    root = side.root.resolve()
    probe = subprocess.run(
        [sys.executable, "-B", "-c", "import runtime_service; print(runtime_service.__file__)"],
        cwd=root,
        env=server_env(root),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(probe).resolve().is_relative_to(root):
        raise RuntimeError(f"side {side.name} imports {probe}, not its checkout {root}")
    if pid is None:
        raise RuntimeError(f"side {side.name}: its server process was not found")
    processes = [pid, *descendants(pid)]
    for one in processes:
        try:
            cwd = Path(f"/proc/{one}/cwd").resolve(strict=True)
            environ = Path(f"/proc/{one}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:  # it exited meanwhile
            continue
        path = next((e[11:].decode() for e in environ if e.startswith(b"PYTHONPATH=")), "")
        first = Path(path.split(os.pathsep)[0]).resolve() if path else None
        if cwd != root or first != root:
            raise RuntimeError(
                f"side {side.name}: process {one} runs in {cwd} with PYTHONPATH {path!r}, "
                f"not in its checkout {root}"
            )
    return (
        f"`{probe}`; server pid {pid} and the {len(processes) - 1} processes under it run in "
        "that checkout, first on their PYTHONPATH"
    )


async def run_ab(
    engine: str, sides: list[Side], pairs: int, calls: int, repetitions: int
) -> tuple[dict[str, list[Sample]], dict[str, str]]:
    """Each side's samples in repetition order, and where each side's server takes its code."""
    samples: dict[str, list[Sample]] = {side.name: [] for side in sides}
    code: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        targets: dict[str, Target] = {}
        try:
            for side in sides:
                url = stack.enter_context(database(engine))
                address = stack.enter_context(
                    server_process(url, side.root, side.server_args, side.server_env)
                )
                targets[side.name] = await Target.open(address, AB_WORKERS)
                code[side.name] = running_code(side, targets[side.name].pid)
                print(f"  [{engine} {side.name}] {code[side.name]}", file=sys.stderr, flush=True)
            for rep in range(repetitions):
                # Alternating which side goes first spreads a drift of the machine (and any
                # advantage of going first or second) evenly over both sides. The server
                # not being measured is idle meanwhile.
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    async with scraped(side.metrics_url):
                        one = await targets[side.name].sample(
                            AB_WORKERS, calls, pairs_for(AB_WORKERS, pairs)
                        )
                    samples[side.name].append(one)
                    print(
                        f"  [{engine} rep {rep + 1} {side.name}] empty {one.empty.rps:,.0f}/s, "
                        f"pairs {one.steps.pairs_per_s:,.0f}/s, ratio {one.ratio:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for target in targets.values():
                await target.close()
    return samples, code


def ab_figure(samples: list[Sample], metric: str) -> list[float]:
    """The figure ``metric`` (a key of ``AB_METRICS``) of each repetition."""
    if metric == "ratio":
        return [one.ratio for one in samples]
    if metric == "pairs":
        return [one.steps.pairs_per_s for one in samples]
    return [one.pair_cpu_us + one.pair_child_cpu_us for one in samples]


def ab_table(
    engine: str,
    sides: list[Side],
    samples: dict[str, list[Sample]],
    *,
    criterion: str | None = None,
    threshold: float = AB_THRESHOLD,
    verdict: bool = True,
) -> list[str]:
    """One engine's A/B report; the verdict is on ``criterion`` (default: the engine's
    :data:`AB_CRITERION`) against ``threshold`` (none when ``verdict`` is False: the caller
    combines runs)."""
    a, b = (samples[side.name] for side in sides)
    rows = [
        f"**{engine}** — {AB_WORKERS} workers, medians over {len(a)} interleaved repetitions",
        "",
        "| side | code | empty calls/s | step RPC/s | step RPC / empty | pairs/s "
        "| server CPU µs / pair (+ step writer) | machine busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in sides:
        mine = samples[side.name]
        pairs = statistics.median(one.steps.pairs_per_s for one in mine)
        rows.append(
            f"| {side.name} | {side.ref}"
            f"{'' if side.describe.startswith(side.ref) else f' ({side.describe.split()[0]})'} "
            f"| {statistics.median(one.empty.rps for one in mine):,.0f} | {2 * pairs:,.0f} "
            f"| {statistics.median(one.ratio for one in mine):.2f}x | {pairs:,.0f} "
            f"| {statistics.median(one.pair_cpu_us for one in mine):,.0f}"
            f" (+ {statistics.median(one.pair_child_cpu_us for one in mine):,.0f}) "
            f"| {statistics.median(one.steps.machine_busy for one in mine):.0%} |"
        )
    rows.append("")
    criterion = (criterion or AB_CRITERION.get(engine)) if verdict else None
    for metric, label in AB_METRICS.items():
        each_a, each_b = ab_figure(a, metric), ab_figure(b, metric)
        paired = [y / x for x, y in zip(each_a, each_b, strict=True)]
        spec = ".2f" if metric == "ratio" else ",.0f"
        rows.append(
            f"- {label} of each repetition: A {', '.join(format(v, spec) for v in each_a)}; "
            f"B {', '.join(format(v, spec) for v in each_b)}; B/A within each repetition "
            f"{', '.join(f'{v:.2f}' for v in paired)} (median {statistics.median(paired):.2f})"
        )
    for metric, label in AB_METRICS.items():
        ratio = statistics.median(ab_figure(b, metric)) / statistics.median(ab_figure(a, metric))
        if metric != criterion:
            rows.append(f"- B/A of the median {label}: {ratio:.3f} (for reference)")
            continue
        said = "PASS" if ratio >= threshold else "FAIL"
        if len(a) < AB_MIN_REPETITIONS:
            said += f" (inconclusive: fewer than {AB_MIN_REPETITIONS} repetitions)"
        rows.append(
            f"- **B/A of the median {label}: {ratio:.3f} — {said}** (criterion: >= {threshold})"
        )
    return rows


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, Callable[[], str]]]:
    """A real OTLP/gRPC receiver on this machine, in a process of its own (so its work is
    not the load generator's), counting what it receives: yields its endpoint and a function
    reporting the counts so far (``tests/otlp_receiver.py``, ``--count``)."""
    port = free_port()
    report = Path(tempfile.mkdtemp(prefix="agentrt-otlp-")) / "counts.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.otlp_receiver",
            "--listen",
            f"127.0.0.1:{port}",
            "--count",
            str(report),
        ],
        cwd=ROOT,
        env=server_env(ROOT),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        if "listening" not in process.stdout.readline():
            raise RuntimeError("the OTLP receiver did not start")
        yield f"http://127.0.0.1:{port}", lambda: report.read_text() if report.exists() else "{}"
    finally:
        process.terminate()
        process.wait(10)


def observability_sides(feature: str, endpoint: str) -> tuple[Side, Side]:
    """(off, on) for ``feature``: "metrics" (``--metrics-listen``, scraped) or "tracing"
    (the ``OTEL_*`` variables: every trace sampled, exported to ``endpoint``)."""
    describe = git("describe", "--always", "--dirty")
    subject = git("log", "-1", "--format=%s")[:60]
    label = f"{describe} {subject}"
    off = Side("", f"{feature} off", ROOT, label)
    if feature == "metrics":
        port = free_port()
        flags = ("--metrics-listen", f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/metrics"
        return off, Side("", "metrics on", ROOT, label, flags, url)
    traced = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        # The GenAI metrics over OTLP are measured with tracing: they are made by the same
        # thread from the same ledger facts.
        "OTEL_SERVICE_NAME": "agentrt-bench",
    }
    return off, Side("", "tracing on", ROOT, label, server_env=traced)


async def run_fresh(
    engine: str, sides: list[Side], pairs: int, calls: int, repetitions: int, rounds: int = 1
) -> tuple[dict[str, list[Sample]], list[float]]:
    """Each side's samples, two per repetition, and each repetition's on/off ratio (side B
    over side A) of pairs/s.

    Every repetition starts both sides' servers anew on fresh databases, the first side's
    first in even repetitions and the second side's in odd ones, and measures them A B B A or
    B A A B (in turn): a repetition's ratio is of the two samples of each side summed, so a
    drift of the machine within it cancels, and which server started first, or how the two
    happened to be placed on the cores, is new in every repetition instead of fixed for the
    whole run (two servers of the same code differed by up to 14 % for a whole run).

    With ``rounds`` above 1, a repetition measures A B B A (or B A A B) that many times, each
    sample ``pairs / rounds`` pairs and ``calls / rounds`` empty calls: the machine's speed
    moves by 10-20 % within seconds, and the shorter the time between one side's sample and
    the other's, the more of that move the ratio cancels."""
    samples: dict[str, list[Sample]] = {side.name: [] for side in sides}
    ratios: list[float] = []
    for rep in range(repetitions):
        order = sides if rep % 2 == 0 else sides[::-1]
        with contextlib.ExitStack() as stack:
            targets: dict[str, Target] = {}
            try:
                for side in order:
                    url = stack.enter_context(database(engine))
                    address = stack.enter_context(
                        server_process(url, side.root, side.server_args, side.server_env)
                    )
                    targets[side.name] = await Target.open(address, AB_WORKERS)
                    running_code(side, targets[side.name].pid)
                rates: dict[str, float] = {side.name: 0.0 for side in sides}
                for side in (*order, *order[::-1]) * rounds:
                    async with scraped(side.metrics_url):
                        one = await targets[side.name].sample(
                            AB_WORKERS,
                            max(calls // rounds, 1),
                            pairs_for(AB_WORKERS, pairs // rounds),
                        )
                    samples[side.name].append(one)
                    rates[side.name] += one.steps.pairs_per_s
                ratios.append(rates[sides[1].name] / rates[sides[0].name])
                means = ", ".join(f"{k} {v / 2 / rounds:,.0f}" for k, v in rates.items())
                print(
                    f"  [{engine} rep {rep + 1}] {sides[1].ref} / {sides[0].ref}: "
                    f"{ratios[-1]:.3f} ({means} pairs/s)",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                for target in targets.values():
                    await target.close()
    return samples, ratios


def main_observability(
    engines: list[str],
    pairs: int,
    calls: int,
    repetitions: int,
    rounds: int,
    features: tuple[str, ...] = ("metrics", "tracing"),
) -> None:
    """Issue 29's cost: this checkout's code with metrics on (scraped) and with tracing on
    (every trace sampled, spans and GenAI metrics exported to a receiver on this machine),
    each against both off, in the same run, by :func:`run_fresh`. Criteria: the median over
    the repetitions of on/off pairs/s >= :data:`OBSERVABILITY_THRESHOLD` for metrics and
    >= :data:`TRACING_THRESHOLD` for tracing, on each engine."""
    started = time.perf_counter()
    with otlp_sink() as (endpoint, counts):
        results: dict[tuple[str, str], tuple[dict[str, list[Sample]], list[float]]] = {}
        plans: dict[str, list[Side]] = {}
        for feature in features:
            off, on = observability_sides(feature, endpoint)
            plans[feature] = [dataclasses.replace(off, name="A"), dataclasses.replace(on, name="B")]
            for engine in engines:
                results[engine, feature] = asyncio.run(
                    run_fresh(engine, plans[feature], pairs, calls, repetitions, rounds)
                )
        received = counts()
    label = plans[features[0]][0].describe
    print(f"Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; cores: {os.cpu_count()}\n")
    print(f"- code: {label}")
    print("- off: `agentrt serve` as it is; metrics on: with `--metrics-listen`, /metrics")
    print(f"  scraped every {SCRAPE_EVERY:g} s while that side is measured; tracing on: with")
    print("  OTEL_EXPORTER_OTLP_ENDPOINT at a receiver on this machine (a process of its own)")
    print("  and OTEL_TRACES_SAMPLER=always_on: every RPC's span, its database spans, every")
    print("  step's and attempt's GenAI span and the GenAI metrics exported")
    print(f"- the receiver received: {received}")
    print(
        f"- {repetitions} repetitions per engine and feature, each with both servers started"
        f" anew (in turn which first), measured A B B A or B A A B"
        f"{f', {rounds} times over' if rounds > 1 else ''}; {max(calls // rounds, 1)} empty"
        f" calls and {pairs_for(AB_WORKERS, pairs // rounds) * AB_WORKERS} pairs per sample"
    )
    thresholds = {"metrics": OBSERVABILITY_THRESHOLD, "tracing": TRACING_THRESHOLD}
    for (engine, feature), (samples, ratios) in results.items():
        print()
        print("\n".join(ab_table(engine, plans[feature], samples, verdict=False)))
        median = statistics.median(ratios)
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        verdict = "PASS" if median >= thresholds[feature] else "FAIL"
        print(
            f"\n- on / off pairs/s of each repetition: {', '.join(f'{r:.3f}' for r in ratios)}"
            f"\n- **{engine}: {feature} on / off, median over the repetitions {median:.3f} —"
            f" {verdict}** (criterion: >= {thresholds[feature]}); geometric mean {mean:.3f}"
        )
    print(f"\nWall time: {time.perf_counter() - started:.0f} s")


def main_ab(spec: str, engines: list[str], pairs: int, calls: int, repetitions: int) -> None:
    refs: list[str | None] = [ref.strip() for ref in spec.split(",")]
    if len(refs) == 1:
        refs.append(None)
    if len(refs) != 2 or not all(ref is None or ref for ref in refs):
        raise SystemExit("--ab takes OLD_REF or OLD_REF,NEW_REF")
    started = time.perf_counter()
    with checkouts(refs) as sides:
        results = {
            engine: asyncio.run(run_ab(engine, sides, pairs, calls, repetitions))
            for engine in engines
        }
    print(f"Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; cores: {os.cpu_count()}\n")
    for side in sides:
        print(f"- {side.name} = {side.ref}: {side.describe}")
    print(
        f"- {pairs_for(AB_WORKERS, pairs) * AB_WORKERS} pairs and {calls} empty calls per loop; "
        "A goes first in odd repetitions, B in even ones"
    )
    for engine, (samples, code) in results.items():
        print()
        for side in sides:
            print(f"- {engine} {side.name} runs {code[side.name]}")
        print()
        print("\n".join(ab_table(engine, sides, samples)))
    print(f"\nWall time: {time.perf_counter() - started:.0f} s")


# --------------------------------------------------------------------------- report


def table(
    engine: str,
    cells: dict[int, Cell],
    dbos_ref: float | None,
    dbos_label: str,
    dbos_same: dict[str, float] | None,
) -> list[str]:
    """One engine's rows. ``dbos_ref`` is DBOS's best figure (the strict denominator);
    ``dbos_same`` its figure by workflows in parallel ("1", "16"), for the same-concurrency
    column (64 workers are compared with DBOS's 16, the most it was run with)."""
    rows = [
        f"**{engine}** — pairs/s compared with {dbos_label}",
        "",
        "| workers | empty RPC/s | empty p50 / p99 ms | Begin+End pairs/s | step RPC/s "
        "| step RPC / empty | BeginStep p50 / p99 ms | EndStep p50 / p99 ms | pairs/s / DBOS best "
        "| pairs/s / DBOS same concurrency | server CPU µs: empty call / pair "
        "(+ step writer process) | bench client CPU µs / pair | machine busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, cell in cells.items():
        empty, steps = cell.empty, cell.steps
        step_rps = 2 * steps.pairs_per_s
        vs_dbos = f"{steps.pairs_per_s / dbos_ref:.2f}x" if dbos_ref else "n/a"
        same = dbos_same.get("1" if c == 1 else "16") if dbos_same else None
        vs_same = f"{steps.pairs_per_s / same:.2f}x" if same else "n/a"
        rows.append(
            f"| {c} | {empty.rps:,.0f} | {empty.pct(0.5):.2f} / {empty.pct(0.99):.2f} "
            f"| {steps.pairs_per_s:,.0f} | {step_rps:,.0f} | {step_rps / empty.rps:.2f}x "
            f"| {steps.begin.pct(0.5):.2f} / {steps.begin.pct(0.99):.2f} "
            f"| {steps.end.pct(0.5):.2f} / {steps.end.pct(0.99):.2f} | {vs_dbos} | {vs_same} "
            f"| {cell.empty_cpu_us:,.0f} / {cell.pair_cpu_us:,.0f}"
            f" (+ {cell.pair_child_cpu_us:,.0f}) "
            f"| {steps.client_cpu_s / steps.pairs * 1e6:,.0f} | {steps.machine_busy:.0%} |"
        )
    # The column above divides the median step loop by the median empty loop, which may come
    # from different repetitions; on a noisy machine each repetition's own ratio says more.
    rows.append("")
    for c, cell in cells.items():
        each = ", ".join(f"{ratio:.2f}" for ratio in cell.ratios)
        rows.append(
            f"- {c} workers, step RPC / empty of each repetition: {each} "
            f"(median {statistics.median(cell.ratios):.2f})"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument(
        "--pairs", type=int, default=512, help="pairs per cell at 16 and 64 workers"
    )
    parser.add_argument("--calls", type=int, default=3000, help="empty calls per cell")
    parser.add_argument(
        "--repetitions", type=int, help=f"default 3, or {AB_MIN_REPETITIONS} with --ab"
    )
    parser.add_argument(
        "--ab",
        metavar="OLD_REF[,NEW_REF]",
        help="compare two commits' servers (NEW_REF: this working tree); see the docstring",
    )
    parser.add_argument(
        "--observability",
        action="store_true",
        help="this code with metrics off and on (scraped), as --ab compares two commits",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="--observability: measure each repetition's servers A B B A this many times",
    )
    parser.add_argument(
        "--features",
        default="metrics,tracing",
        help="--observability: which to measure (metrics, tracing or both)",
    )
    parser.add_argument("--dbos-seconds", type=float, default=1.0)
    parser.add_argument("--dbos-child", help=argparse.SUPPRESS)
    parser.add_argument("--dbos-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dbos_child:
        dbos_child(args.dbos_child, args.dbos_seconds, args.dbos_url)
        return
    engines = args.engines.split(",")
    if args.ab:
        repetitions = args.repetitions or AB_MIN_REPETITIONS
        main_ab(args.ab, engines, args.pairs, args.calls, repetitions)
        return
    if args.observability:
        repetitions = args.repetitions or AB_MIN_REPETITIONS
        features = tuple(f for f in args.features.split(",") if f)
        if not features or set(features) - {"metrics", "tracing"}:
            raise SystemExit("--features takes metrics, tracing or metrics,tracing")
        main_observability(engines, args.pairs, args.calls, repetitions, args.rounds, features)
        return
    started = time.perf_counter()
    results: dict[str, dict[int, Cell]] = {}
    with DbosPool(args.dbos_seconds, "postgres" in engines) as dbos:
        for n, engine in enumerate(engines):
            results[engine] = asyncio.run(
                run_engine(
                    engine, args.pairs, args.calls, args.repetitions or 3, dbos if n == 0 else None
                )
            )
        medians = dbos.medians()
        errors = dict(dbos.errors)
    print(f"Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; cores: {os.cpu_count()}\n")
    print("DBOS durable steps/s, in process (median of the repetitions):\n")
    print("| DBOS system database | 1 workflow at a time | 16 workflows in parallel |")
    print("|---|---|---|")
    for config, label in DBOS_CONFIGS.items():
        if config in medians:
            m = medians[config]
            print(f"| {label} | {m['1']:,.0f} | {m['16']:,.0f} |")
        elif config in errors:
            print(f"| {label} | failed: {errors[config]} | |")
    durable = {c: max(medians[c].values()) for c in DURABLE_SQLITE if c in medians}
    best = max(durable, key=lambda c: durable[c]) if durable else None
    # At the same concurrency: the best durable SQLite configuration at 1 and at 16 workflows.
    same_sqlite = {
        n: max(medians[c][n] for c in DURABLE_SQLITE if c in medians)
        for n in ("1", "16")
        if any(c in medians for c in DURABLE_SQLITE)
    }
    for engine, cells in results.items():
        same: dict[str, float] | None = same_sqlite or None
        if engine == "postgres" and "postgres" in medians:
            ref: float | None = max(medians["postgres"].values())
            label = f"best DBOS on PostgreSQL, {ref:,.0f} steps/s"
            same = medians["postgres"]
        elif best is not None:
            ref = durable[best]
            label = f"best durable DBOS on SQLite ({DBOS_CONFIGS[best]}), {ref:,.0f} steps/s"
        else:
            ref, label = None, "DBOS unavailable"
        print()
        print("\n".join(table(engine, cells, ref, label, same)))
    print(f"\nWall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
