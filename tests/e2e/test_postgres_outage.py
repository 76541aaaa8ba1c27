"""PostgreSQL stopped and started under load, on a throwaway cluster of the test's own (never
the shared server): health goes NOT_SERVING then SERVING, calls during the outage answer
UNAVAILABLE (never INTERNAL or UNKNOWN), every acknowledged write is there afterwards, and the
same agentrt server carries on without a restart."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.settings import DatabaseSettings
from tests.faults import NOT_SERVING, SERVING, Client, server_with
from tests.support import free_port

pytestmark = pytest.mark.e2e


class Cluster:
    """A PostgreSQL cluster in a temporary directory, run as the postgres user."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            pytest.fail("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        self.bin = Path(found[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="agentrt-pg-", dir="/tmp"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_postgres(
            str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "--no-sync",
        )  # fmt: skip

    def _as_postgres(self, *args: str) -> None:
        prefix = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-w", "-l",
            str(self.dir / "log"), "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"
        )

    def remove(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            user="postgres" if os.geteuid() == 0 else None,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


def test_postgres_stopped_and_started_under_load(cluster: Cluster) -> None:
    settings = DatabaseSettings(probe_interval=0.2, connect_timeout=2, statement_timeout=5)
    with server_with(cluster.url, settings) as address:
        client = Client(address)
        acknowledged: list[str] = []
        codes: list[grpc.StatusCode] = []
        stop = threading.Event()

        def load(worker: int) -> None:
            n = 0
            while not stop.is_set():
                request = pb.CreateThreadRequest(
                    title=f"w{worker}-{n}", request_id=uuid.uuid4().hex
                )
                try:
                    thread = client.runtime.CreateThread(request, timeout=10).thread
                except grpc.RpcError as error:
                    codes.append(error.code())
                    time.sleep(0.05)
                    continue
                acknowledged.append(thread.id)
                n += 1

        workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        try:
            for worker in workers:
                worker.start()
            time.sleep(1)
            assert client.status() == SERVING
            before = len(acknowledged)
            cluster.stop()
            client.wait_status(NOT_SERVING, within=5)
            time.sleep(1)  # calls meet the outage
            during = len(codes)
            cluster.start()
            client.wait_status(SERVING, within=15)
            time.sleep(1)
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
        assert before > 0
        assert during > 0
        assert set(codes) == {grpc.StatusCode.UNAVAILABLE}
        # Writes go on after the restart, on the same server.
        last = client.create_thread("after-restart")
        for thread_id in [*acknowledged, last]:
            got = client.runtime.GetThread(pb.GetThreadRequest(thread_id=thread_id), timeout=10)
            assert got.thread.id == thread_id
        client.close()
