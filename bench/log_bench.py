"""Registry log benchmark (issue 31, item 10): what the log costs a publish, and what a
checkpoint and an inclusion proof cost over a log of a million entries.

1. Publishing with the log against without it: two ``agentrt serve`` processes on fresh
   databases, one running this checkout, one the checkout at ``--baseline`` (a commit before
   the log; made a git worktree), measured in alternation: PublishAgentVersion of a new label
   (50 tools, 10 skills: the registry bench's definition) then SetTag, 16 in flight. The ratio
   is the medians' (target: at least 0.8).
2. A log of ``--entries`` entries (default 1,000,000) written straight into a fresh database
   (leaves, every complete subtree, the head: what the appends would have written), then a
   server on it answers GetCheckpoint and GetInclusionProof (a random index, the current size)
   one at a time, next to the empty call (target: under 20 ms each).

    .venv/bin/python bench/log_bench.py [--engines sqlite,postgres] [--baseline 8fd28d5]

Output: Markdown on stdout (recorded in bench/results/log.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from agentrt.registry.v1 import registry_service_pb2 as pb  # noqa: E402
from agentrt.registry.v1 import registry_service_pb2_grpc  # noqa: E402
from agentrt_base.db_engines import normalise_url  # noqa: E402
from agentrt_core import merkle  # noqa: E402
from agentrt_core.log_entries import tag_leaf  # noqa: E402
from bench.common import (  # noqa: E402
    ROOT,
    Result,
    closed_loop,
    database,
    fmt_row,
    median_result,
    server_process,
)
from bench.registry_bench import components, definition  # noqa: E402

ORIGIN = "bench.example/log"


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """The checkout of ``ref`` beside this one, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="agentrt-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
        )


async def _prepare(address: str) -> registry_service_pb2_grpc.RegistryServiceStub:
    channel = grpc.aio.insecure_channel(address)
    registry = registry_service_pb2_grpc.RegistryServiceStub(channel)
    for draft in components():
        await registry.PublishComponent(pb.PublishComponentRequest(component=draft))
    return registry


async def publish_ab(engine: str, baseline: Path, calls: int, repetitions: int) -> list[str]:
    with (
        database(engine) as url_new,
        database(engine) as url_old,
        server_process(url_new) as new_address,
        server_process(url_old, root=baseline) as old_address,
    ):
        servers = {"with the log": await _prepare(new_address)}
        servers["without (baseline)"] = await _prepare(old_address)
        results: dict[str, list[Result]] = {name: [] for name in servers}
        tags: dict[str, list[Result]] = {name: [] for name in servers}
        labels = iter(range(1, 10**9))
        for repetition in range(repetitions):
            order = list(servers) if repetition % 2 == 0 else list(reversed(servers))
            for name in order:
                registry = servers[name]
                published: list[str] = []

                async def publish(i: int, registry=registry, published=published) -> None:
                    response = await registry.PublishAgentVersion(
                        pb.PublishAgentVersionRequest(definition=definition(f"v{next(labels)}"))
                    )
                    published.append(response.agent_version.digest)

                results[name].append(
                    await closed_loop(f"PublishAgentVersion, {name}", publish, calls, 16)
                )

                async def move(i: int, registry=registry, published=published) -> None:
                    await registry.SetTag(
                        pb.SetTagRequest(
                            agent_id="bench_agent", tag=f"t{i % 16}", digest=published[i]
                        )
                    )

                tags[name].append(await closed_loop(f"SetTag, {name}", move, calls, 16))
        rows = [f"| **{engine}** | | | | | |"]
        for measured in (results, tags):
            base = median_result(measured["without (baseline)"])
            rows.append(fmt_row(base, base))
            rows.append(fmt_row(median_result(measured["with the log"]), base))
        return rows


def build_log(url: str, entries: int) -> None:
    """Write a log of ``entries`` tag entries into a migrated database, as the appends would
    have: each leaf, every complete subtree, the head."""
    engine = sa.create_engine(normalise_url(url))
    batch_entries: list[dict[str, object]] = []
    batch_nodes: list[dict[str, object]] = []
    now = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    frontier = merkle.CompactRange(0, [])
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM registry_log_head")

        def flush() -> None:
            if batch_entries:
                conn.execute(
                    sa.text(
                        "INSERT INTO registry_log_entries (position, type, subject_digest, leaf) "
                        "VALUES (:position, :type, NULL, :leaf)"
                    ),
                    batch_entries,
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO registry_log_nodes (level, position, hash) "
                        "VALUES (:level, :position, :hash)"
                    ),
                    batch_nodes,
                )
            batch_entries.clear()
            batch_nodes.clear()

        for index in range(entries):
            leaf = tag_leaf(
                event="SET",
                agent_id="bench_agent",
                tag=f"t{index % 100}",
                sequence=index + 1,
                from_digest="",
                to_digest="sha256:" + f"{index:064x}",
                principal="bench",
                time=now,
            )
            value = merkle.leaf_hash(leaf.data)
            # An append reads only the frontier (the head's subtrees), as the server's does.
            known = dict(zip(merkle.prefix_nodes(index), frontier.hashes, strict=True))
            for level, position, h in merkle.completed_nodes(
                index, value, merkle.from_mapping(known)
            ):
                batch_nodes.append({"level": level, "position": position, "hash": h})
            frontier.append(value)
            batch_entries.append({"position": index, "type": "tag", "leaf": leaf.data})
            if len(batch_entries) >= 20_000:
                flush()
        flush()
        conn.execute(
            sa.text(
                "INSERT INTO registry_log_head (singleton, origin, size, frontier) "
                "VALUES (1, :origin, :size, :frontier)"
            ),
            {"origin": ORIGIN, "size": entries, "frontier": b"".join(frontier.hashes)},
        )
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE registry_log_nodes")
            conn.exec_driver_sql("ANALYZE registry_log_entries")
    engine.dispose()


async def proofs_at_scale(engine: str, entries: int, calls: int) -> list[str]:
    with database(engine) as url:
        # A server first, so the database is migrated and the log created; then the log is
        # replaced by one of `entries` entries, and a second server serves it.
        with server_process(url, extra_args=["--log-origin", ORIGIN]):
            pass
        build_log(url, entries)
        with server_process(url, extra_args=["--log-origin", ORIGIN]) as address:
            async with grpc.aio.insecure_channel(address) as channel:
                registry = registry_service_pb2_grpc.RegistryServiceStub(channel)
                health = health_pb2_grpc.HealthStub(channel)
                size = (
                    await registry.GetCheckpoint(pb.GetCheckpointRequest())
                ).checkpoint.tree_size
                assert size == entries, size
                rng = random.Random(7)
                empty, checkpoint, inclusion = [], [], []
                for _ in range(3):
                    empty.append(
                        await closed_loop(
                            "empty call, 1 in flight",
                            lambda i: health.Check(health_pb2.HealthCheckRequest()),
                            calls,
                            1,
                        )
                    )
                    checkpoint.append(
                        await closed_loop(
                            f"GetCheckpoint ({entries:,} entries), 1 in flight",
                            lambda i: registry.GetCheckpoint(pb.GetCheckpointRequest()),
                            calls,
                            1,
                        )
                    )
                    inclusion.append(
                        await closed_loop(
                            f"GetInclusionProof (random index of {entries:,}), 1 in flight",
                            lambda i: registry.GetInclusionProof(
                                pb.GetInclusionProofRequest(index=rng.randrange(entries))
                            ),
                            calls,
                            1,
                        )
                    )
                base = median_result(empty)
                return [
                    f"| **{engine}** | | | | | |",
                    fmt_row(base, base),
                    fmt_row(median_result(checkpoint), base),
                    fmt_row(median_result(inclusion), base),
                ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--baseline", default="8fd28d5", help="a commit before the log")
    parser.add_argument("--calls", type=int, default=200, help="publishes per repetition")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--proof-calls", type=int, default=500)
    parser.add_argument("--parts", default="publish,scale", help="which measurements to run")
    args = parser.parse_args()
    parts = args.parts.split(",")
    engines = args.engines.split(",")
    header = (
        "| engine / call | calls/s | p50 ms | p99 ms | rate vs first | p50 vs first |\n"
        "|---|---|---|---|---|---|"
    )
    if "publish" in parts:
        print(f"## Publishing with the log, against {args.baseline} without it\n")
        print(header)
        with worktree(args.baseline) as baseline:
            for engine in engines:
                for row in asyncio.run(publish_ab(engine, baseline, args.calls, args.repetitions)):
                    print(row, flush=True)
    if "scale" in parts:
        print(f"\n## Checkpoint and inclusion proof over {args.entries:,} entries\n")
        print(header)
        for engine in engines:
            for row in asyncio.run(proofs_at_scale(engine, args.entries, args.proof_calls)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
