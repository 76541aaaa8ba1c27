"""Blob fairness benchmark: step writes with and without two concurrent 64 MiB uploads.

Issue 14, defect 7: two clients streaming 64 MiB blobs while four workers record steps cut
SQLite step pairs/s from 967 to 34 and raised the step p99 from 6.9 to 615 ms. Target: with
the two uploads running, step pairs/s >= 0.5x and the step p99 <= 3x the same figures
without uploads, measured in the same run.

For each engine the script starts ``agentrt serve`` in its own process on a fresh database
(the same setup as ``bench/steps_bench.py``: a small agent, one acquired run with an open turn
per worker) and then, in ``--rounds`` interleaved rounds:

* **quiet**: 4 workers (asyncio tasks in this process, one run each) loop
  ``BeginStep(MODEL_CALL)`` + ``EndStep(SUCCEEDED)`` for ``--seconds``;
* **uploading**: the same 4 workers for the same time while two uploader *processes* (so
  their protobuf encoding does not share this process's GIL with the workers) each stream
  64 MiB blobs back to back in 1 MiB chunks, every blob with distinct content (a counter in
  its first bytes), so every upload is stored rather than deduplicated.

Reported per round: pairs/s, the p50 and p99 of the step RPCs (Begin and End together), the
uploads completed and their MiB/s (so a "fair" result cannot come from uploads that stall),
and the ratios uploading / quiet of that round. The summary line gives the range of the
ratios over the rounds and the round with the median pairs ratio.

    .venv/bin/python bench/blob_fairness.py [--engines sqlite,postgres] [--rounds 3] [--seconds 8]

Output: Markdown tables on stdout (recorded in bench/results/blob_fairness.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402

from agentrt.runtime.v1 import message_pb2, runtime_service_pb2_grpc  # noqa: E402
from agentrt.runtime.v1 import runtime_service_pb2 as pb  # noqa: E402
from bench.common import database, server_process  # noqa: E402
from bench.steps_bench import Worker, setup_workers  # noqa: E402

WORKERS = 4
UPLOADERS = 2
MIB = 1024 * 1024
BLOB_BYTES = 64 * MIB
CHANNELS = 4


# --------------------------------------------------------------------------- uploader process


def uploader(address: str, seconds: float, tag: str) -> None:
    """Upload distinct 64 MiB blobs back to back for ``seconds`` (the last one may end after
    it); print the count, the bytes and the seconds the uploads took."""
    body = os.urandom(MIB)
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 8 * MIB)])
    stub = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
    started = time.monotonic()
    deadline = started + seconds
    count = 0

    def messages(n: int):  # type: ignore[no-untyped-def]
        yield pb.PutBlobRequest(header=message_pb2.BlobHeader(size=BLOB_BYTES))
        for i in range(BLOB_BYTES // MIB):
            # The first chunk names the upload, so no two blobs share a digest.
            prefix = f"{tag}-{n}-{i}-".encode()
            yield pb.PutBlobRequest(chunk=prefix + body[len(prefix) :])

    while time.monotonic() < deadline:
        response = stub.PutBlob(messages(count), timeout=300)
        if not response.created:
            raise RuntimeError("an upload was deduplicated; the bench needs distinct content")
        count += 1
    channel.close()
    print(count, count * BLOB_BYTES, time.monotonic() - started, flush=True)


# --------------------------------------------------------------------------- steps


@dataclass
class Phase:
    name: str
    pairs: int
    seconds: float
    latencies_ms: list[float]
    uploads: int = 0
    upload_bytes: int = 0
    upload_seconds: float = 0.0

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def upload_mib_s(self) -> float:
        return self.upload_bytes / MIB / self.upload_seconds if self.upload_seconds else 0.0


async def drive(workers: list[Worker], seconds: float) -> tuple[int, float, list[float]]:
    """Every worker loops Begin+End pairs until ``seconds`` have passed."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    done = 0

    async def loop(w: Worker) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            begin: list[float] = []
            end: list[float] = []
            await w.pairs(1, begin, end)
            latencies.extend(begin + end)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in workers))
    return done, time.perf_counter() - started, latencies


async def quiet(workers: list[Worker], seconds: float) -> Phase:
    pairs, took, latencies = await drive(workers, seconds)
    return Phase("quiet", pairs, took, latencies)


async def uploading(address: str, workers: list[Worker], seconds: float, round_no: int) -> Phase:
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, __file__, "--uploader", address),
            *("--seconds", str(seconds), "--tag", f"r{round_no}u{i}"),
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(UPLOADERS)
    ]
    # Let both streams get going before the steps are timed.
    await asyncio.sleep(0.5)
    pairs, took, latencies = await drive(workers, seconds - 1.0)
    uploads = upload_bytes = 0
    upload_seconds = 0.0
    for proc in procs:
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"uploader failed ({proc.returncode})")
        count, size, took_s = out.split()
        uploads += int(count)
        upload_bytes += int(size)
        upload_seconds = max(upload_seconds, float(took_s))
    return Phase("uploading", pairs, took, latencies, uploads, upload_bytes, upload_seconds)


async def run_engine(engine: str, rounds: int, seconds: float) -> list[tuple[Phase, Phase]]:
    results: list[tuple[Phase, Phase]] = []
    with database(engine) as url, server_process(url) as address:
        options = [("grpc.max_send_message_length", 8 * MIB)]
        channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(CHANNELS)]
        workers = await setup_workers(channels, WORKERS)
        await drive(workers, 1.0)  # warm-up
        for r in range(rounds):
            a = await quiet(workers, seconds)
            b = await uploading(address, workers, seconds + 1.0, r)
            results.append((a, b))
            print(row(engine, r + 1, a, b), flush=True)
        for channel in channels:
            await channel.close()
    return results


def row(engine: str, round_no: int, a: Phase, b: Phase) -> str:
    return (
        f"| {engine} | {round_no} | {a.pairs_per_s:,.0f} | {a.pct(0.5):.1f} | {a.pct(0.99):.1f}"
        f" | {b.pairs_per_s:,.0f} | {b.pct(0.5):.1f} | {b.pct(0.99):.1f}"
        f" | {b.uploads} ({b.upload_mib_s:,.0f} MiB/s)"
        f" | {b.pairs_per_s / a.pairs_per_s:.2f}x | {b.pct(0.99) / a.pct(0.99):.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--uploader", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="u", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.uploader:
        uploader(args.uploader, args.seconds, args.tag)
        return

    print(
        f"{WORKERS} step workers (Begin+End pairs); uploads: {UPLOADERS} concurrent streams of "
        f"{BLOB_BYTES // MIB} MiB blobs in 1 MiB chunks; {args.seconds:g} s per phase\n"
    )
    print(
        "| engine | round | quiet pairs/s | p50 ms | p99 ms | uploading pairs/s | p50 ms "
        "| p99 ms | uploads (rate) | pairs/s ratio | p99 ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summaries = []
    for engine in args.engines.split(","):
        results = asyncio.run(run_engine(engine, args.rounds, args.seconds))
        ratios = [(b.pairs_per_s / a.pairs_per_s, b.pct(0.99) / a.pct(0.99)) for a, b in results]
        pairs_r = sorted(r[0] for r in ratios)
        p99_r = sorted(r[1] for r in ratios)
        summaries.append(
            f"- {engine}: pairs/s ratio {pairs_r[0]:.2f}-{pairs_r[-1]:.2f}x "
            f"(median {pairs_r[len(pairs_r) // 2]:.2f}x, target >= 0.5x); p99 ratio "
            f"{p99_r[0]:.2f}-{p99_r[-1]:.2f}x (median {p99_r[len(p99_r) // 2]:.2f}x, "
            "target <= 3x)"
        )
    print()
    print("\n".join(summaries))


if __name__ == "__main__":
    main()
