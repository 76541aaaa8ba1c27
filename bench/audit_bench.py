"""Audit benchmark: GetProvenance and FindUsages on a large history, next to an empty call.

For each engine:

1. A fresh database; ``agentrt serve`` migrates it and the registry is filled through the
   API (the seed's coding components, plus ``rare-skill@1.0.0``): ``coding_agent@agent_v7``
   (tagged ``prod``) and ``coding_agent@agent_v7r``, which also pins the rare skill.
2. The server stops and a generator writes the history straight into the database with
   SQLAlchemy Core bulk inserts (executemany, one transaction per chunk of runs): threads
   (one per 4 runs), ``--runs`` runs of ``--steps`` steps (one attempt each, 1 in 20 with a
   second attempt after a lost worker), plus 5 runs of 200 steps, and their usage rows
   exactly as ``BeginStep``/``EndStep`` write them (``runtime_step_usages``: model policy,
   requested and reported model, system prompt, skills and tools offered for a model call,
   the tool for a tool call). Odd steps are model calls, even ones tool calls, the last two
   completion checks. 1% of runs are bound to agent_v7r and offer the rare skill. Runs are
   spread over 60 days. **Events are not generated**: no audit query measured here reads
   them (VerifyRun and ExportBundle read one run's chain by its index).
3. ``agentrt serve`` starts on the loaded database and one client calls, one at a time,
   ``--calls`` times each after a warm-up: the empty call (Health/Check); GetProvenance of
   a 200-step run (all 200 steps with their versions); GetProvenance of a step; FindUsages
   first page (100) for the 1% component; and, for contrast, first pages for queries that
   match most of the history (the model every model call requested, the read_file schema,
   the agent digest of 99% of the runs).

    .venv/bin/python bench/audit_bench.py [--engines sqlite,postgres] [--runs 20000]
        [--steps 50] [--calls 50]

Output: Markdown on stdout (recorded in bench/results/audit.md).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from agentrt.audit.v1 import audit_service_pb2 as apb  # noqa: E402
from agentrt.audit.v1 import audit_service_pb2_grpc  # noqa: E402
from agentrt.audit.v1 import message_pb2 as amsg  # noqa: E402
from agentrt.registry.v1 import registry_service_pb2 as rpb  # noqa: E402
from agentrt.registry.v1 import registry_service_pb2_grpc  # noqa: E402
from agentrt_base.db_engines import normalise_url  # noqa: E402
from bench.common import Result, database, server_process  # noqa: E402
from runtime_service.records import BLANK_STEP  # noqa: E402
from runtime_service.store.ledger import StepRow, StepUsageRow  # noqa: E402
from runtime_service.store.tables import AttemptRow, RunRow, ThreadRow  # noqa: E402
from tests import registry_data  # noqa: E402

THREADS = cast(sa.Table, ThreadRow.__table__)
RUNS = cast(sa.Table, RunRow.__table__)
ATTEMPTS = cast(sa.Table, AttemptRow.__table__)
STEPS = cast(sa.Table, StepRow.__table__)
USAGES = cast(sa.Table, StepUsageRow.__table__)

LONG_RUNS, LONG_STEPS = 5, 200
CHUNK_RUNS = 500
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(prefix: str, moment: dt.datetime, serial: int) -> str:
    """A time-ordered id like the server's (48-bit ms time + 80 bits, Crockford base32)."""
    value = (int(moment.timestamp() * 1000) << 80) | (serial & ((1 << 80) - 1))
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


# -- registry (through the API) --------------------------------------------------------------


def publish(address: str) -> dict[str, Any]:
    """Publish the agents; return what the generator needs of their closures."""
    with grpc.insecure_channel(address) as channel:
        stub = registry_service_pb2_grpc.RegistryServiceStub(channel)
        registry_data.publish_all(
            stub, [*registry_data.coding_components(), registry_data.skill("rare-skill", "1.0.0")]
        )
        common = stub.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition())
        ).agent_version
        rare_definition = registry_data.coding_definition("agent_v7r")
        rare_definition.skills.append("rare-skill@1.0.0")
        rare = stub.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=rare_definition)
        ).agent_version
        tag = stub.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=common.digest, actor="b")
        ).tag
    out: dict[str, Any] = {"tag_sequence": tag.event_sequence}
    for key, version in (("common", common), ("rare", rare)):
        c = version.closure
        out[key] = {
            "digest": version.digest,
            "label": version.version_label,
            "policy": c.model_policy.digest,
            "prompt": c.system_prompt.digest,
            "skills": [
                {"name": s.name, "version": s.version, "digest": s.digest} for s in c.skills
            ],
            "tools": {
                t.name: {
                    "name": t.name,
                    "version": t.version,
                    "digest": t.digest,
                    "schema_digest": t.schema_digest,
                }
                for t in c.tools
            },
        }
    return out


# -- the generator ---------------------------------------------------------------------------

# The columns a recorded step leaves at their defaults, as the runtime writes them.
_STEP_DEFAULTS: dict[str, Any] = {**BLANK_STEP, "input_revision": 1}


class Generator:
    def __init__(self, agents: dict[str, Any], runs: int, steps: int) -> None:
        self.agents = agents
        self.runs = runs
        self.steps = steps
        self.rng = random.Random(7)
        self.start = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
        self.spacing = dt.timedelta(days=60) / (runs + LONG_RUNS)
        self.serial = 0
        self.rare_runs: list[str] = []
        self.long_runs: list[str] = []
        self.step_ids: list[str] = []
        self.counts = {"threads": 0, "runs": 0, "attempts": 0, "steps": 0, "usages": 0}
        self._cache: dict[str, dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]] = {}
        # Step i of a run starts 2i s after the run; precomputed, like each tool call's
        # arguments, so the generator spends its time writing rather than formatting.
        longest = max(steps, LONG_STEPS) + 1
        self.offsets = [dt.timedelta(seconds=2 * i) for i in range(longest)]
        self.duration = dt.timedelta(seconds=1)
        self.arguments = [json.dumps({"path": f"src/module_{i}.py"}) for i in range(longest)]

    def _id(self, prefix: str, moment: dt.datetime) -> str:
        self.serial += 1
        return ulid(prefix, moment, self.serial)

    def write(self, url: str) -> float:
        # Plain executemany: on PostgreSQL, psycopg's pipelined executemany of one prepared
        # INSERT writes the narrow usage rows ~1.8x faster than SQLAlchemy's multi-VALUES
        # batches (insertmanyvalues); for the wide step rows the two are even.
        engine = sa.create_engine(normalise_url(url), use_insertmanyvalues=False)
        started = time.perf_counter()
        total = self.runs + LONG_RUNS
        # As any bulk load does: the two big tables' secondary indexes are dropped first and
        # built once at the end (a sorted build is several times cheaper than millions of
        # random inserts into five B-trees). Their build time is included in the total.
        indexes = [*STEPS.indexes, *USAGES.indexes]
        with engine.begin() as conn:
            for secondary in indexes:
                secondary.drop(conn)
        # Rows are built here while earlier chunks are written by worker threads (the drivers
        # release the GIL while the database works). PostgreSQL takes two writers at once;
        # SQLite has one write lock, so one writer, overlapping only the building.
        writers = 1 if engine.dialect.name == "sqlite" else 2
        try:
            with ThreadPoolExecutor(writers) as pool:
                pending: deque[Future[None]] = deque()
                for first in range(0, total, CHUNK_RUNS):
                    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in self.counts}
                    for index in range(first, min(total, first + CHUNK_RUNS)):
                        self._run(index, rows)
                    for name, chunk in rows.items():
                        self.counts[name] += len(chunk)
                    pending.append(pool.submit(_insert, engine, rows))
                    while len(pending) > writers:
                        pending.popleft().result()
                    if first // CHUNK_RUNS % 8 == 0:
                        elapsed = time.perf_counter() - started
                        print(
                            f"  ... {first + CHUNK_RUNS} runs, {self.counts['steps']:,} steps, "
                            f"{elapsed:.0f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                for future in pending:
                    future.result()
            print("  ... building indexes", file=sys.stderr, flush=True)
            with engine.begin() as conn:
                for secondary in indexes:
                    secondary.create(conn)
        finally:
            engine.dispose()
        return time.perf_counter() - started

    def _run(self, index: int, rows: dict[str, list[dict[str, Any]]]) -> None:
        long = index >= self.runs
        steps = LONG_STEPS if long else self.steps
        rare = not long and index % 100 == 37
        agent = self.agents["rare" if rare else "common"]
        created = self.start + self.spacing * index
        if index % 4 == 0:
            rows["threads"].append(
                {
                    "id": ulid("thr", created, index),
                    "title": f"bench thread {index // 4}",
                    "metadata_json": "{}",
                    "concurrency_policy": "ALLOW",
                    "create_time": created,
                    "request_id": None,
                    "last_event_sequence": 0,
                    "last_event_hash": "",
                    "event_cursor": 0,
                }
            )
        thread_id = ulid("thr", self.start + self.spacing * (index - index % 4), index - index % 4)
        run_id = self._id("run", created)
        if rare:
            self.rare_runs.append(run_id)
        if long:
            self.long_runs.append(run_id)
        two_attempts = index % 20 == 3
        attempts = [self._id("att", created) for _ in range(2 if two_attempts else 1)]
        end = created + dt.timedelta(seconds=2 * steps + 5)
        for number, attempt_id in enumerate(attempts, start=1):
            lost = two_attempts and number == 1
            rows["attempts"].append(
                {
                    "id": attempt_id,
                    "run_id": run_id,
                    "number": number,
                    "reason": "INITIAL" if number == 1 else "WORKER_LOST",
                    "worker_id": f"worker-{index % 16}",
                    "lease_epoch": number,
                    "resume_from_checkpoint_id": "",
                    "status": "LOST" if lost else "SUCCEEDED",
                    "start_time": created,
                    "end_time": end,
                    "lease_expire_time": end,
                    "lease_ttl_ms": 30000,
                    "error_class": "WORKER_LOST" if lost else "",
                    "error_message": "lease expired" if lost else "",
                    "retryable": lost,
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "cost_usd": 0.0,
                    "result_summary": "" if lost else "tests pass",
                    "output_ref": "",
                }
            )
        rows["runs"].append(
            {
                "id": run_id,
                "thread_id": thread_id,
                "request_id": None,
                "agent_requested_ref": "coding_agent@agent_v7r" if rare else "coding_agent:prod",
                "agent_digest": agent["digest"],
                "agent_id": "coding_agent",
                "agent_version_label": agent["label"],
                "agent_resolved_via_tag": "" if rare else "prod",
                "agent_tag_event_sequence": 0 if rare else self.agents["tag_sequence"],
                "agent_resolve_time": created,
                "goal_json": json.dumps({"objective": f"fix issue {index}", "scope": ["src/"]}),
                "amendments_json": "[]",
                "input_revision": 1,
                "max_steps": 500,
                "max_model_tokens": 0,
                "max_cost_usd": 0.0,
                "deadline_time": None,
                "priority": 0,
                "max_attempts": 3,
                "parent_run_id": "",
                "derived_from_run_id": "",
                "permission_ceiling": "FULL",
                "concurrency_policy": "ALLOW",
                "labels_json": "{}",
                "runtime_version": "0.1.0",
                "status": "COMPLETED",
                "terminal_reason": "COMPLETED_BY_WORKER",
                "terminal_message": "",
                "cancel_requested": False,
                "pause_requested": False,
                "stop_reason": "",
                "stop_deadline_time": None,
                "blocked_by_run_id": "",
                "next_attempt_reason": "",
                "latest_checkpoint_id": "",
                "input_tokens": 1200 * steps,
                "output_tokens": 300 * steps,
                "cost_usd": 0.004 * steps,
                "step_count": steps,
                "last_step_sequence": steps,
                "turn_count": 1,
                "attempt_count": len(attempts),
                "current_attempt_id": "",
                "lease_epoch": len(attempts),
                "result_summary": "tests pass",
                "output_ref": "",
                "create_time": created,
                "start_time": created,
                "end_time": end,
                "update_time": end,
                "last_event_sequence": 0,
                "last_event_hash": "",
            }
        )
        turn_id = self._id("trn", created)
        templates = self._templates("rare" if rare else "common")
        steps_out, usages_out = rows["steps"], rows["usages"]
        switch = steps // 3
        for sequence in range(1, steps + 1):
            start = created + self.offsets[sequence]
            step_id = self._id("stp", start)
            if sequence > steps - 2:
                kind = "check"
            else:
                kind = "model" if sequence % 2 else ("read_file", "run_tests")[sequence // 2 % 2]
            step, usages = templates[kind]
            step = {
                **step,
                "id": step_id,
                "run_id": run_id,
                "attempt_id": attempts[-1] if sequence > switch else attempts[0],
                "turn_id": turn_id,
                "sequence": sequence,
                "start_time": start,
                "end_time": start + self.duration,
            }
            if kind == "model":
                self.serial += 1
                step["context_digest"] = f"sha256:{self.serial:064x}"
                step["output_ref"] = f"sha256:{self.serial + (1 << 200):064x}"
            elif kind == "check":
                step["completion_check"] = f"check-{sequence}"
            else:
                step["idempotency_key"] = f"t{sequence}"
                step["tool_arguments_json"] = self.arguments[sequence]
            steps_out.append(step)
            if long and sequence == 100:
                self.step_ids.append(step_id)
            usages_out += [
                {**usage, "step_id": step_id, "run_id": run_id, "start_time": start}
                for usage in usages
            ]

    def _templates(self, which: str) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Per agent: a row and its usage rows for each kind of step, built once."""
        if which in self._cache:
            return self._cache[which]
        agent = self.agents[which]
        tools = agent["tools"]
        offered = [tools["read_file"], tools["run_tests"]]

        def usage(kind: str, name: str, version: str, digest: str, schema: str) -> dict[str, Any]:
            return {
                "kind": kind,
                "name": name,
                "version": version,
                "digest": digest,
                "schema_digest": schema,
            }

        reported = "claude-sonnet-4-20250514"
        model = {
            **_STEP_DEFAULTS,
            "status": "SUCCEEDED",
            "type": "MODEL_CALL",
            "operation": "plan",
            "input_tokens": 1200,
            "output_tokens": 300,
            "cost_usd": 0.004,
            "model_policy_digest": agent["policy"],
            "candidate_name": "primary",
            "candidate_reason": "PRIMARY",
            "provider": "anthropic",
            "requested_model_id": "claude-sonnet-4",
            "parameters_json": '{"max_tokens":4096,"temperature":0.2}',
            "reported_model_id": reported,
            "system_prompt_digest": agent["prompt"],
            "skills_json": json.dumps(agent["skills"], separators=(",", ":")),
            "tools_json": json.dumps(
                [{**t, "decision": "ALLOW"} for t in offered], separators=(",", ":")
            ),
        }
        model_usages = [
            usage("model_policy", "", "", agent["policy"], ""),
            usage("model_requested", "claude-sonnet-4", "", "", ""),
            usage("model_reported", reported, "", "", ""),
            usage("system_prompt", "", "", agent["prompt"], ""),
            *(usage("skill", s["name"], s["version"], s["digest"], "") for s in agent["skills"]),
            *(
                usage("tool", t["name"], t["version"], t["digest"], t["schema_digest"])
                for t in offered
            ),
        ]
        out = {
            "model": (model, model_usages),
            "check": (
                {**_STEP_DEFAULTS, "status": "SUCCEEDED", "type": "COMPLETION_CHECK"},
                [],
            ),
        }
        for tool in offered:
            out[tool["name"]] = (
                {
                    **_STEP_DEFAULTS,
                    "status": "SUCCEEDED",
                    "type": "TOOL_CALL",
                    "operation": tool["name"],
                    "tool_name": tool["name"],
                    "tools_json": json.dumps(
                        [{**tool, "decision": "ALLOW"}], separators=(",", ":")
                    ),
                },
                [
                    usage(
                        "tool", tool["name"], tool["version"], tool["digest"], tool["schema_digest"]
                    )
                ],
            )
        self._cache[which] = out
        return out


def _insert(engine: sa.Engine, rows: dict[str, list[dict[str, Any]]]) -> None:
    """One chunk in one transaction, parents first (every run's thread, attempts and steps are
    in the same chunk, so chunks can be written in any order)."""
    with engine.begin() as conn:
        for name, table in (
            ("threads", THREADS),
            ("runs", RUNS),
            ("attempts", ATTEMPTS),
            ("steps", STEPS),
            ("usages", USAGES),
        ):
            if rows[name]:
                conn.execute(table.insert(), rows[name])


def analyze(url: str) -> float:
    """Refresh the planner's statistics, as autovacuum (PostgreSQL) or an operator's
    ``ANALYZE`` (SQLite) would after a bulk load."""
    engine = sa.create_engine(normalise_url(url))
    started = time.perf_counter()
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()
    return time.perf_counter() - started


# -- measuring -------------------------------------------------------------------------------


async def measure(address: str, name: str, call: Any, calls: int) -> Result:
    for _ in range(5):
        await call()
    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        await call()
        latencies.append((time.perf_counter() - t) * 1000)
    return Result(name, calls, time.perf_counter() - started, latencies)


async def run_calls(address: str, gen: Generator, calls: int) -> list[tuple[Result, str]]:
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    ) as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)
        audit = audit_service_pb2_grpc.AuditServiceStub(channel)
        checks: list[tuple[str, Any]] = []
        sizes: dict[str, Any] = {}

        def probe(name: str, request: Any, method: Any, describe: Any) -> None:
            async def call() -> Any:
                return await method(request, timeout=30)

            checks.append((name, call))
            sizes[name] = describe

        probe(
            "empty call (Health/Check)",
            health_pb2.HealthCheckRequest(),
            health.Check,
            lambda r: "",
        )
        probe(
            f"GetProvenance(run) of a {LONG_STEPS}-step run",
            apb.GetProvenanceRequest(run_id=gen.long_runs[2]),
            audit.GetProvenance,
            lambda r: f"{len(r.records[0].steps)} steps, {r.ByteSize() / 1024:.0f} KiB",
        )
        probe(
            "GetProvenance(step) in that run",
            apb.GetProvenanceRequest(step_id=gen.step_ids[2]),
            audit.GetProvenance,
            lambda r: f"{len(r.records[0].steps)} steps, {r.ByteSize() / 1024:.0f} KiB",
        )
        probe(
            "FindUsages rare-skill@1.0.0 (1% of runs), first page",
            apb.FindUsagesRequest(component_ref="rare-skill@1.0.0"),
            audit.FindUsages,
            lambda r: f"{len(r.usages)} usages",
        )
        probe(
            "FindUsages model claude-sonnet-4 (any; every model call), first page",
            apb.FindUsagesRequest(model_id="claude-sonnet-4", model_match=amsg.MODEL_MATCH_ANY),
            audit.FindUsages,
            lambda r: f"{len(r.usages)} usages",
        )
        probe(
            "FindUsages read_file schema (every run), first page",
            apb.FindUsagesRequest(
                tool_schema_digest=gen.agents["common"]["tools"]["read_file"]["schema_digest"]
            ),
            audit.FindUsages,
            lambda r: f"{len(r.usages)} usages",
        )
        probe(
            "FindUsages agent digest (99% of runs), first page",
            apb.FindUsagesRequest(agent_digest=gen.agents["common"]["digest"]),
            audit.FindUsages,
            lambda r: f"{len(r.usages)} runs",
        )
        out: list[tuple[Result, str]] = []
        for name, call in checks:
            response = await call()
            result = await measure(address, name, call, calls)
            out.append((result, sizes[name](response)))
        return out


def run_engine(engine: str, runs: int, steps: int, calls: int) -> list[str]:
    lines = [f"| **{engine}** | | | | |"]
    with database(engine) as url:
        with server_process(url) as address:
            agents = publish(address)
        gen = Generator(agents, runs, steps)
        print(f"{engine}: generating {runs} runs x {steps} steps ...", file=sys.stderr)
        seconds = gen.write(url)
        stats = analyze(url)
        c = gen.counts
        rate = c["steps"] / seconds
        summary = (
            f"{engine}: wrote {c['runs']:,} runs, {c['attempts']:,} attempts, "
            f"{c['steps']:,} steps and {c['usages']:,} usage rows in {seconds:.0f} s "
            f"({rate:,.0f} steps/s, {(c['steps'] + c['usages']) / seconds:,.0f} rows/s); "
            f"ANALYZE {stats:.1f} s"
        )
        print(summary, file=sys.stderr)
        with server_process(url) as address:
            results = asyncio.run(run_calls(address, gen, calls))
    empty = results[0][0]
    for result, size in results:
        ratio = result.pct(0.5) / empty.pct(0.5)
        lines.append(
            f"| {result.name} | {result.pct(0.5):.2f} | {result.pct(0.99):.2f} | {ratio:.1f}x "
            f"| {size} |"
        )
    return [*lines, "", summary, ""]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    header = [
        "| engine / call | p50 ms | p99 ms | p50 vs empty | response |",
        "|---|---|---|---|---|",
    ]
    out: list[str] = []
    for engine in args.engines.split(","):
        out += run_engine(engine, args.runs, args.steps, args.calls)
    print("\n".join(header + [x for x in out if x.startswith("|")]))
    print()
    print("\n".join(x for x in out if x and not x.startswith("|")))


if __name__ == "__main__":
    main()
