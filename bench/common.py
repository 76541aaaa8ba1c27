"""Shared pieces of the benchmarks: a server process, closed-loop load, latency summaries.

The server runs as its own process (``agentrt serve``), so the load generator does not share
its GIL; every figure is reported next to an empty call (``grpc.health.v1.Health/Check``)
measured against the same server in the same run, because this machine is shared and noisy
and only ratios measured together mean anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
POSTGRES_ADMIN = os.environ.get(
    "AGENTRT_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@dataclass
class Result:
    name: str
    calls: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rps(self) -> float:
        return self.calls / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def closed_loop(
    name: str, call: Callable[[int], Awaitable[object]], total: int, concurrency: int
) -> Result:
    """Run ``total`` calls with ``concurrency`` in flight; each call's latency is recorded."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(name, total, time.perf_counter() - started, latencies)


def median_result(results: list[Result]) -> Result:
    """The repetition with the median throughput (latencies kept from that same repetition)."""
    ordered = sorted(results, key=lambda r: r.rps)
    return ordered[len(ordered) // 2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def database(engine: str) -> Iterator[str]:
    """A fresh database URL for one benchmark run."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    name = f"agentrt_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(POSTGRES_ADMIN).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _forward_problems(lines: Iterable[str]) -> None:
    for line in lines:
        if any(word in line for word in ("ERROR", "WARNING", "Traceback", "Error")):
            print(f"  [server] {line.rstrip()}", file=sys.stderr, flush=True)


def server_env(root: Path = ROOT, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server that runs the code of the checkout at ``root`` (with
    ``extra``: ``OTEL_*`` for a traced server, say).

    The virtualenv's editable install points at one checkout; ``PYTHONPATH`` comes before it
    on ``sys.path``, so the server imports ``root``'s packages and generated stubs instead.
    """
    path = os.pathsep.join([str(root), str(root / "generated")])
    # A server on PostgreSQL must be given its signing key (a SQLite file's makes its own);
    # one key for the run, as replicas would share (code before the registry log ignores it).
    keys = {} if os.environ.get("AGENTRT_SIGNING_KEYS") else {"AGENTRT_SIGNING_KEYS": bench_key()}
    return {**os.environ, **keys, **(extra or {}), "PYTHONPATH": path}


_KEY: list[str] = []


def bench_key() -> str:
    """A signing key file for this benchmark run's servers."""
    if not _KEY:
        from agentrt_base.signing_keys import generate_key_file

        path = Path(tempfile.mkdtemp(prefix="agentrt-bench-key-")) / "signing-key.pem"
        generate_key_file(path)
        _KEY.append(str(path))
    return _KEY[0]


@contextlib.contextmanager
def server_process(
    database_url: str,
    root: Path = ROOT,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """``agentrt serve`` in its own process, running the code of the checkout at ``root``
    with ``extra_args`` (``--metrics-listen …``) and ``extra_env`` (``OTEL_*``); yields its
    address once it is ready."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime_service.cli.main",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--database-url",
            database_url,
            *extra_args,
        ],
        env=server_env(root, extra_env),
        # ``-m`` puts the working directory first on sys.path, ahead of PYTHONPATH: it must
        # be ``root`` too, or another checkout there would shadow it.
        cwd=root,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        if "agentrt ready" in line:
            break
    else:
        raise RuntimeError("server did not start")
    # Keep reading the server's log so a chatty server never blocks on a full pipe, and pass
    # on what is not routine: a figure measured while the server logged errors is suspect.
    threading.Thread(target=_forward_problems, args=(process.stderr,), daemon=True).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def fmt_row(r: Result, baseline: Result | None = None) -> str:
    ratio = ""
    if baseline is not None:
        ratio = f" | {r.rps / baseline.rps:.2f}x | {r.pct(0.5) / baseline.pct(0.5):.2f}x"
    return f"| {r.name} | {r.rps:,.0f} | {r.pct(0.5):.2f} | {r.pct(0.99):.2f}{ratio} |"


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}"
