"""Runtime benchmark: CreateRun, the worker cycle, and WatchRun delivery, next to an empty call.

For each engine the script starts ``agentrt serve`` in its own process on a fresh database,
publishes a small agent (2 tools, 1 skill) once and creates 32 threads with policy ALLOW. Then:

1. In interleaved repetitions, 16 calls in flight from one grpc.aio client process: the empty
   call (Health/Check); CreateRun (agent by tag, threads round-robin); and 16 workers each
   looping AcquireRun(wait=0.2 s) / Heartbeat / FinishAttempt(SUCCEEDED_COMPLETE_RUN) over
   the runs just created. Figures are from the repetition with the median rate.
2. Event delivery, commit -> watcher receipt. Watchers run in a separate client process, so
   their GIL does not delay the writer (and vice versa). The writer (this process) calls
   AmendRun on the watched run one event at a time: each call is made 20 ms (``--gap``) after
   every watcher has the previous event and the server has executed no statement for 20 ms,
   so each fan-out is measured alone. Each call commits one ``run.amended`` event whose
   sequence the response carries (Run.last_event_sequence). The
   writer records the CLOCK_MONOTONIC time (system-wide on Linux, so comparable between the
   two processes) just before sending and just after the response; each watcher records the
   time it read the event of that sequence off its stream. The commit happened between send
   and response, so the true commit->receipt latency lies between ``receipt - response``
   (the brief's definition; it under-states by the server's work between commit and answer
   plus the answer's trip back) and
   ``receipt - send`` (an upper bound; it adds the request's trip and the transaction).
   Note that the server wakes watchers right after commit, *before* it answers AmendRun, so
   ``receipt - response`` can be negative with one watcher.
3. Idle cost: with 0 and then with 200 watchers subscribed and caught up, nothing is written
   for a few seconds and the SQL statements the server executes in that window are counted.
   The server process is ``agentrt serve`` started through a small bootstrap that adds a
   SQLAlchemy ``before_cursor_execute`` listener counting every statement (both engines;
   ~1 us per statement) and answers the count on a Unix socket. On PostgreSQL the
   ``pg_stat_database.xact_commit + xact_rollback`` delta of the bench database is reported
   as well (after an 11 s settle, because idle backends may flush their statistics up to
   10 s late). The server's CPU time over the window (``/proc/<pid>/stat``) is reported too.
   The reaper's once-a-second pass is the expected floor with 0 watchers.

    .venv/bin/python bench/runtime_bench.py [--engines sqlite,postgres] [--calls 2000]
        [--creates 400] [--repetitions 3] [--watchers 200] [--events-1 100] [--events-n 20]

Output: Markdown tables on stdout (recorded in bench/results/runtime.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402
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
    POSTGRES_ADMIN,
    ROOT,
    Result,
    closed_loop,
    database,
    fmt_row,
    free_port,
)

THREADS = 32
WORKERS = 16
AGENT_REF = "bench_agent:prod"
T = TypeVar("T")
SCRIPT = Path(__file__).resolve()
PG_STATS_SETTLE = 11.0  # PostgreSQL 15 backends flush idle statistics at most 10 s late

# Runs `agentrt serve` (the same module `python -m runtime_service.cli.main` runs) after adding
# a statement counter that answers its value on the Unix socket named in the environment.
SERVER_BOOTSTRAP = r"""
import itertools, os, runpy, socket, sys, threading
import sqlalchemy as sa
_count = itertools.count()
sa.event.listen(sa.engine.Engine, "before_cursor_execute", lambda *a: next(_count))
def _answer(path):
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(repr(_count)[6:-1].encode())
threading.Thread(
    target=_answer, args=(os.environ["AGENTRT_BENCH_COUNTER"],), daemon=True
).start()
sys.argv = ["agentrt", *sys.argv[1:]]
runpy.run_module("runtime_service.cli.main", run_name="__main__", alter_sys=True)
"""


# -- the server process ------------------------------------------------------------------------


@dataclass
class Server:
    address: str
    pid: int
    counter_path: str
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=50))

    def statements(self) -> int:
        """SQL statements the server has executed so far (every engine, every thread)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(self.counter_path)
            return int(sock.recv(64).decode())

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def counted_server_process(database_url: str) -> Iterator[Server]:
    """Like ``bench.common.server_process``, plus the statement counter, the pid for CPU time,
    and a thread draining stderr (so a chatty server can never block on a full pipe)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        counter = f"{tmp}/statements.sock"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "generated")])
        env["AGENTRT_BENCH_COUNTER"] = counter
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVER_BOOTSTRAP,
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--database-url",
                database_url,
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        server = Server(f"127.0.0.1:{port}", process.pid, counter)
        for line in process.stderr:
            server.stderr_tail.append(line)
            if "agentrt ready" in line:
                break
        else:
            raise RuntimeError("server did not start:\n" + "".join(server.stderr_tail))
        stream = process.stderr

        def drain() -> None:
            for line in stream:
                server.stderr_tail.append(line)

        threading.Thread(target=drain, daemon=True).start()
        try:
            yield server
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def pg_transactions(database_url: str) -> int:
    """Committed + rolled-back transactions of the bench database (from the admin database, so
    this query is not counted)."""
    name = sa.make_url(database_url).database
    admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = :name"
                    ),
                    {"name": name},
                ).scalar_one()
            )
    finally:
        admin.dispose()


# -- setup -----------------------------------------------------------------------------------


def _struct(data: dict) -> object:
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    s.update(data)
    return s


def small_agent() -> tuple[list[rmsg.ComponentDraft], rmsg.AgentDefinition]:
    drafts = [
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_TOOL,
            name=f"tool_{i}",
            version="1",
            spec=rmsg.ComponentSpec(
                tool=rmsg.ToolSpec(
                    description=f"tool {i}",
                    input_schema=_struct(
                        {"type": "object", "properties": {"path": {"type": "string"}}}
                    ),
                )
            ),
        )
        for i in range(2)
    ]
    drafts.append(
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_SKILL,
            name="skill_0",
            version="1.0.0",
            spec=rmsg.ComponentSpec(
                skill=rmsg.SkillSpec(description="skill", instructions="Be careful.")
            ),
        )
    )
    drafts.append(
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_MODEL_POLICY,
            name="bench-models",
            version="1",
            spec=rmsg.ComponentSpec(
                model_policy=rmsg.ModelPolicySpec(
                    candidates=[rmsg.ModelCandidate(name="primary", provider="p", model_id="m1")]
                )
            ),
        )
    )
    drafts.append(
        rmsg.ComponentDraft(
            kind=renum.COMPONENT_KIND_PERMISSION_POLICY,
            name="bench-perms",
            version="1",
            spec=rmsg.ComponentSpec(
                permission_policy=rmsg.PermissionPolicySpec(
                    default_decision=renum.PERMISSION_DECISION_ALLOW
                )
            ),
        )
    )
    definition = rmsg.AgentDefinition(
        agent_id="bench_agent",
        version_label="v1",
        description="runtime benchmark agent",
        system_prompt=rmsg.SystemPrompt(text="You are a benchmark agent."),
        model_policy="bench-models@1",
        skills=["skill_0@^1.0"],
        tools=["tool_0@1", "tool_1@1"],
        permission_policy="bench-perms@1",
    )
    return drafts, definition


async def publish_agent(channel: grpc.aio.Channel) -> None:
    registry = registry_service_pb2_grpc.RegistryServiceStub(channel)
    drafts, definition = small_agent()
    for draft in drafts:
        await registry.PublishComponent(rpb.PublishComponentRequest(component=draft))
    version = (
        await registry.PublishAgentVersion(rpb.PublishAgentVersionRequest(definition=definition))
    ).agent_version
    await registry.SetTag(
        rpb.SetTagRequest(agent_id="bench_agent", tag="prod", digest=version.digest)
    )


def create_run_request(thread_id: str) -> pb.CreateRunRequest:
    return pb.CreateRunRequest(
        thread_id=thread_id,
        agent_ref=AGENT_REF,
        goal=message_pb2.Goal(objective="make the tests pass", scope=["src/"]),
    )


def _duration(seconds: float) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))


# -- 1 and 2: CreateRun and the worker cycle -----------------------------------------------------


@dataclass
class Cycles:
    cycle: Result
    acquire: Result
    heartbeat: Result
    finish: Result
    rpcs: Result
    empty_acquires: int


async def worker_cycles(channel: grpc.aio.Channel, cycles: int) -> Cycles:
    """``WORKERS`` workers, each looping acquire -> heartbeat -> finish, ``cycles`` in all."""
    worker = worker_service_pb2_grpc.WorkerServiceStub(channel)
    counter = iter(range(cycles))
    lat: dict[str, list[float]] = {"cycle": [], "acquire": [], "heartbeat": [], "finish": []}
    empty = 0

    async def loop(n: int) -> None:
        nonlocal empty
        request = wpb.AcquireRunRequest(
            worker_id=f"bench-worker-{n}", wait=_duration(0.2), lease_ttl=_duration(30)
        )
        for _ in counter:
            t0 = time.perf_counter()
            got = await worker.AcquireRun(request)
            t1 = time.perf_counter()
            if not got.HasField("run"):
                empty += 1
                continue
            await worker.Heartbeat(wpb.HeartbeatRequest(fence=got.fence))
            t2 = time.perf_counter()
            await worker.FinishAttempt(
                wpb.FinishAttemptRequest(
                    fence=got.fence,
                    outcome=enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN,
                    result_summary="done",
                )
            )
            t3 = time.perf_counter()
            lat["acquire"].append((t1 - t0) * 1000)
            lat["heartbeat"].append((t2 - t1) * 1000)
            lat["finish"].append((t3 - t2) * 1000)
            lat["cycle"].append((t3 - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(WORKERS)))
    seconds = time.perf_counter() - started
    done = len(lat["cycle"])
    return Cycles(
        Result(
            f"acquire+heartbeat+finish cycle, {WORKERS} workers (cycles/s)",
            done,
            seconds,
            lat["cycle"],
        ),
        Result("  AcquireRun(wait=0.2 s) in the cycle", done, seconds, lat["acquire"]),
        Result("  Heartbeat in the cycle", done, seconds, lat["heartbeat"]),
        Result(
            "  FinishAttempt(SUCCEEDED_COMPLETE_RUN) in the cycle", done, seconds, lat["finish"]
        ),
        Result(
            "  the cycle's 3 RPCs together (RPC/s)",
            3 * done,
            seconds,
            lat["acquire"] + lat["heartbeat"] + lat["finish"],
        ),
        empty,
    )


# -- 3: delivery and idle cost -------------------------------------------------------------------


async def watcher_main(address: str, run_id: str, count: int, after: int) -> None:
    """Child process: ``count`` WatchRun streams on one run from ``after``. Prints ``started``,
    then ``got <sequence>`` each time every stream has received that event, and at the end
    (the run ended, every stream closed) one JSON line: the receipt times of every sequence,
    and this process's CPU seconds from the first complete event to the end."""
    async with grpc.aio.insecure_channel(address) as channel:
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
        receipts: dict[int, list[float]] = {}
        cpu_from: list[float] = []

        async def watch() -> None:
            call = runtime.WatchRun(pb.WatchRunRequest(run_id=run_id, after_sequence=after))
            async for response in call:
                received = time.monotonic()
                got = receipts.setdefault(response.event.sequence, [])
                got.append(received)
                if len(got) == count:
                    if not cpu_from:
                        cpu_from.append(time.process_time())
                    print(f"got {response.event.sequence}", flush=True)

        tasks = [asyncio.create_task(watch()) for _ in range(count)]
        print("started", flush=True)
        await asyncio.gather(*tasks)
        cpu = time.process_time() - cpu_from[0] if cpu_from else 0.0
        print(json.dumps({"receipts": receipts, "cpu_s": cpu}), flush=True)


@dataclass
class Watchers:
    process: asyncio.subprocess.Process

    @classmethod
    async def start(cls, address: str, run_id: str, count: int, after: int) -> Watchers:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--watchers-child",
            f"{address},{run_id},{count},{after}",
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,  # the final line holds every receipt time
        )
        watchers = cls(process)
        await watchers.expect("started")
        return watchers

    async def expect(self, word: str, timeout: float = 120) -> str:  # noqa: ASYNC109
        assert self.process.stdout is not None
        line = (await asyncio.wait_for(self.process.stdout.readline(), timeout)).decode()
        if not line.startswith(word):
            raise RuntimeError(f"watcher process said {line!r}, expected {word!r}")
        return line

    async def finish(self) -> tuple[dict[int, list[float]], float]:
        """Receipts by sequence and the process's CPU seconds, once every stream has ended."""
        while not (line := await self.expect("")).startswith("{"):
            pass
        await self.process.wait()
        data = json.loads(line)
        return {int(k): v for k, v in data["receipts"].items()}, data["cpu_s"]


@dataclass
class Idle:
    watchers: int
    seconds: float
    statements: int
    pg_transactions: int | None
    cpu_ms: float


async def idle_window(server: Server, url: str, watchers: int, seconds: float) -> Idle:
    """Count what the server does while nothing is written for ``seconds``."""
    postgres = not url.startswith("sqlite")
    await asyncio.sleep(PG_STATS_SETTLE if postgres else 1.0)
    xact0 = await asyncio.to_thread(pg_transactions, url) if postgres else None
    stmts0, cpu0 = server.statements(), server.cpu_seconds()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    stmts1, cpu1 = server.statements(), server.cpu_seconds()
    elapsed = time.monotonic() - started
    xact = None
    if postgres:
        await asyncio.sleep(PG_STATS_SETTLE)  # let this window's own statistics arrive
        assert xact0 is not None
        xact = await asyncio.to_thread(pg_transactions, url) - xact0
    return Idle(watchers, elapsed, stmts1 - stmts0, xact, (cpu1 - cpu0) * 1000)


@dataclass
class Delivery:
    watchers: int
    events: int
    gap_ms: float
    seconds: float
    from_response: list[float]  # receipt - AmendRun response, every (event, watcher), ms
    from_send: list[float]  # receipt - AmendRun send, ms
    last_watcher: list[float]  # per event: the last watcher's receipt - response, ms
    missing: int
    statements_per_event: float
    cpu_ms_per_event: float
    watcher_cpu_ms_per_event: float
    amend_ms: list[float]


async def quiescent(server: Server, limit: float = 10.0) -> None:
    """Wait until the server has executed no statement for 20 ms: every watcher has done the
    reads that follow a delivery (they continue after the event has been sent)."""
    deadline = time.monotonic() + limit
    last = server.statements()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = server.statements()
        if now == last:
            return
        last = now


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def delivery(
    channel: grpc.aio.Channel,
    server: Server,
    url: str,
    thread_id: str,
    watchers: int,
    events: int,
    gap: float,
) -> tuple[Delivery, Idle | None]:
    """``events`` AmendRun calls, each written ``gap`` s after every watcher has the previous
    one and the server has gone quiet (no statement for 20 ms), so each event's fan-out is
    measured alone, with no earlier work queued in front of it.
    With more than one watcher, an idle window first (everyone subscribed and caught up)."""
    runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
    run = (await runtime.CreateRun(create_run_request(thread_id))).run
    child = await Watchers.start(server.address, run.id, watchers, run.last_event_sequence)

    async def amend(note: str) -> tuple[float, float, int]:
        sent = time.monotonic()
        response = await runtime.AmendRun(
            pb.AmendRunRequest(
                run_id=run.id, amendment=message_pb2.Amendment(note=note), actor="bench"
            )
        )
        returned = time.monotonic()
        sequence = response.run.last_event_sequence
        await child.expect(f"got {sequence}\n")
        return sent, returned, sequence

    await amend("warm-up")  # every stream is live and caught up once each has received it
    await quiescent(server)
    idle = await idle_window(server, url, watchers, 5.0) if watchers > 1 else None

    writes: dict[int, tuple[float, float]] = {}
    stmts0, cpu0, started = server.statements(), server.cpu_seconds(), time.monotonic()
    for i in range(events):
        sent, returned, sequence = await amend(f"amendment {i}")
        writes[sequence] = (sent, returned)
        await quiescent(server)
        await asyncio.sleep(gap)
    stmts1, cpu1, seconds = server.statements(), server.cpu_seconds(), time.monotonic() - started
    await runtime.CancelRun(pb.CancelRunRequest(run_id=run.id, reason="bench done"))
    receipts, child_cpu = await child.finish()

    from_response, from_send, last, missing = [], [], [], 0
    for sequence, (sent, returned) in writes.items():
        got = receipts.get(sequence, [])
        missing += watchers - len(got)
        from_response += [(t - returned) * 1000 for t in got]
        from_send += [(t - sent) * 1000 for t in got]
        if got:
            last.append((max(got) - returned) * 1000)
    return (
        Delivery(
            watchers,
            events,
            gap * 1000,
            seconds,
            from_response,
            from_send,
            last,
            missing,
            (stmts1 - stmts0) / events,
            (cpu1 - cpu0) * 1000 / events,
            child_cpu * 1000 / (events + 2),  # + the warm-up and run.ended fan-outs
            [(r - s) * 1000 for s, r in writes.values()],
        ),
        idle,
    )


# -- per engine ----------------------------------------------------------------------------------


@dataclass
class Counted:
    """What the server spent during one measured phase."""

    statements: int
    cpu_s: float

    def row(self, per: int) -> str:
        return f" {self.statements / per:.1f} | {self.cpu_s * 1000 / per:.2f} |"


async def counted(server: Server, phase: Awaitable[T]) -> tuple[T, Counted]:
    stmts, cpu = server.statements(), server.cpu_seconds()
    result = await phase
    return result, Counted(server.statements() - stmts, server.cpu_seconds() - cpu)


@dataclass
class EngineResult:
    engine: str
    rows: list[str]
    deliveries: list[Delivery]
    idles: list[Idle]
    empty_1: Result
    server_log: list[str]


async def run_engine(engine: str, args: argparse.Namespace) -> EngineResult:
    with database(engine) as url, counted_server_process(url) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            await publish_agent(channel)
            runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            threads = [
                (
                    await runtime.CreateThread(
                        pb.CreateThreadRequest(
                            title=f"bench {i}", concurrency_policy=enum_pb2.CONCURRENCY_POLICY_ALLOW
                        )
                    )
                ).thread.id
                for i in range(THREADS)
            ]
            empty, create, cycles = [], [], []
            for repetition in range(args.repetitions):
                progress(f"{engine}: repetition {repetition + 1}")
                empty.append(
                    await counted(
                        server,
                        closed_loop(
                            "empty call (Health/Check), 16 in flight",
                            lambda i: health.Check(health_pb2.HealthCheckRequest()),
                            args.calls,
                            16,
                        ),
                    )
                )
                create.append(
                    await counted(
                        server,
                        closed_loop(
                            "CreateRun (ALLOW thread, agent by tag), 16 in flight",
                            lambda i: runtime.CreateRun(create_run_request(threads[i % THREADS])),
                            args.creates,
                            16,
                        ),
                    )
                )
                cycles.append(await counted(server, worker_cycles(channel, args.creates)))
            empty_1 = await closed_loop(
                "empty call, 1 in flight",
                lambda i: health.Check(health_pb2.HealthCheckRequest()),
                max(args.calls // 4, 200),
                1,
            )

            base, base_n = median_of(empty, lambda r: r.rps)
            rows = [f"| **{engine}** | | | | | | | |", fmt_row(base, base) + base_n.row(base.calls)]
            made, made_n = median_of(create, lambda r: r.rps)
            rows.append(fmt_row(made, base) + made_n.row(made.calls))
            mid, mid_n = median_of(cycles, lambda c: c.cycle.rps)
            rows.append(fmt_row(mid.cycle, base) + mid_n.row(mid.cycle.calls))
            for r in (mid.acquire, mid.heartbeat, mid.finish):
                rows.append(fmt_row(r, base) + " | |")
            rows.append(fmt_row(mid.rpcs, base) + mid_n.row(mid.rpcs.calls))
            if any(c.empty_acquires for c, _ in cycles):
                rows.append(
                    f"| (AcquireRun answered empty {sum(c.empty_acquires for c, _ in cycles)} "
                    "times within its 0.2 s wait) | | | | | | | |"
                )
            rows.append(fmt_row(empty_1, empty_1) + " | |")

            progress(f"{engine}: idle window, no watcher")
            idles = [await idle_window(server, url, 0, 5.0)]
            progress(f"{engine}: delivery, 1 watcher")
            one, _ = await delivery(
                channel, server, url, threads[0], 1, args.events_1, args.gap / 1000
            )
            progress(f"{engine}: delivery and idle window, {args.watchers} watchers")
            many, idle = await delivery(
                channel, server, url, threads[1], args.watchers, args.events_n, args.gap / 1000
            )
            assert idle is not None
            idles.append(idle)
        log = [line.rstrip() for line in server.stderr_tail if "agentrt ready" not in line]
    return EngineResult(engine, rows, [one, many], idles, empty_1, log)


def median_of(runs: list[tuple[T, Counted]], key: Callable[[T], float]) -> tuple[T, Counted]:
    """The repetition with the median rate, with what the server spent in that repetition."""
    return sorted(runs, key=lambda run: key(run[0]))[len(runs) // 2]


def delivery_rows(result: EngineResult) -> list[str]:
    rows = []
    for d in result.deliveries:
        if not d.from_response:
            rows.append(f"| {result.engine} | {d.watchers} | no event received | | | | | | | |")
            continue
        rows.append(
            f"| {result.engine} | {d.watchers} | {d.events} ({d.events / d.seconds:.1f}/s) "
            f"| **{pct(d.from_response, 0.5):.1f} / {pct(d.from_response, 0.99):.1f}** "
            f"/ {max(d.from_response):.1f} "
            f"| {pct(d.from_send, 0.5):.1f} / {pct(d.from_send, 0.99):.1f} "
            f"| {statistics.median(d.last_watcher):.1f} / {max(d.last_watcher):.1f} "
            f"| {pct(d.amend_ms, 0.5):.1f} / {pct(d.amend_ms, 0.99):.1f} "
            f"| {d.statements_per_event:.0f} / {d.cpu_ms_per_event:.1f} "
            f"| {d.watcher_cpu_ms_per_event:.1f} | {d.missing} |"
        )
    return rows


def idle_rows(result: EngineResult) -> list[str]:
    rows = []
    for i in result.idles:
        xact = "n/a" if i.pg_transactions is None else f"{i.pg_transactions}"
        rows.append(
            f"| {result.engine} | {i.watchers} | {i.seconds:.1f} | {i.statements} "
            f"| {i.statements / i.seconds:.1f} | {xact} | {i.cpu_ms / i.seconds:.1f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--calls", type=int, default=2000, help="empty calls per repetition")
    parser.add_argument(
        "--creates", type=int, default=400, help="CreateRun calls and cycles per repetition"
    )
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--events-1", type=int, default=100, help="events with one watcher")
    parser.add_argument("--events-n", type=int, default=20, help="events with many watchers")
    parser.add_argument(
        "--gap", type=float, default=20.0, help="ms from one event's full fan-out to the next"
    )
    parser.add_argument("--watchers-child", dest="child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        address, run_id, count, after = args.child.split(",")
        asyncio.run(watcher_main(address, run_id, int(count), int(after)))
        return

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results = [asyncio.run(run_engine(e, args)) for e in args.engines.split(",")]
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"Machine load average (1/5/15 min) before: {' '.join(load_before)}, "
        f"after: {' '.join(load_after)} on {os.cpu_count()} cores.\n"
    )
    print(
        f"Throughput and latency from one grpc.aio client process; the repetition with the "
        f"median rate of {args.repetitions} interleaved ones ({args.calls} empty calls, "
        f"{args.creates} CreateRun and {args.creates} cycles each). Cycle sub-rows: the rate is "
        "the cycle rate (each RPC runs once per cycle), the latency that RPC's own. Server "
        "statements and CPU are per call (per cycle on the cycle row).\n"
    )
    print(
        "| engine / call | calls/s | p50 ms | p99 ms | rate vs empty | p50 vs empty "
        "| server SQL statements | server CPU ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print("\n".join(r.rows))
    print(
        "\nEvent delivery, AmendRun commit -> WatchRun receipt; watchers in a separate process, "
        "all on one run; each event is written alone, "
        f"{args.gap:.0f} ms after every watcher had the previous one and the server had gone "
        "quiet (no SQL statement for 20 ms). Latencies in ms, over "
        "every (event, watcher) pair; the true commit->receipt lies between the two columns.\n"
    )
    print(
        "| engine | watchers | events (rate) | receipt - AmendRun response p50 / p99 / max "
        "| receipt - AmendRun send p50 / p99 | last watcher per event, median / max "
        "| AmendRun RPC p50 / p99 | server statements / CPU ms per event "
        "| watcher process CPU ms per event | missed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print("\n".join(delivery_rows(r)))
    print("\nFor reference, the empty call one at a time (same runs):")
    for r in results:
        e = r.empty_1
        print(f"- {r.engine}: p50 {e.pct(0.5):.2f} ms, p99 {e.pct(0.99):.2f} ms")
    print(
        "\nIdle cost: nothing written for the window, 0 or N watchers subscribed and caught up; "
        "statements counted inside the server process (every SQL statement of every engine "
        "and thread, the reaper's once-a-second pass included).\n"
    )
    print(
        "| engine | watchers | window s | server SQL statements | per second "
        "| PostgreSQL xact delta | server CPU ms/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print("\n".join(idle_rows(r)))
    for r in results:
        if r.server_log:
            print(f"\nServer log ({r.engine}), last lines:\n")
            print("\n".join(f"    {line}" for line in r.server_log[-15:]))


if __name__ == "__main__":
    main()
