"""Two `agentrt serve` processes on one PostgreSQL database behave as one service: an event
written through one replica reaches a watcher on the other, and a run created on one wakes a
worker long-polling on the other (LISTEN/NOTIFY), promptly rather than after a poll interval;
publishes through both append one registry log."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrt.registry.v1 import registry_service_pb2 as registry_pb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_core import log_verify
from tests.conftest import _truncate
from tests.e2e.cli_support import AGENTRT, serve_env
from tests.log_support import current, proven, publish_agent, trusted, unique
from tests.runtime_support import PLAIN, Stubs
from tests.service.steps_support import Worker
from tests.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

PROMPT = 1.5  # seconds: far below any poll interval, far above a NOTIFY round trip


def _start(database_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    address = f"127.0.0.1:{free_port()}"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*AGENTRT, "serve", "--listen", address, "--database-url", database_url],
            cwd=log.parent,
            env=serve_env(),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    deadline = time.monotonic() + 30
    while "agentrt ready" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("replica never became ready:\n" + log.read_text())
        time.sleep(0.05)
    return process, address


@pytest.fixture(scope="module")
def replicas(
    postgres_session_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stubs, Stubs]]:
    """Two replicas for the module (starting processes is the slow part); the database is
    emptied afterwards like the ``database_url`` fixture does."""
    logs = tmp_path_factory.mktemp("replicas")
    # One after the other: the first migrates the database, the second finds it current.
    a, address_a = _start(postgres_session_url, logs / "a.log")
    try:
        b, address_b = _start(postgres_session_url, logs / "b.log")
        try:
            stubs_a, stubs_b = Stubs.open(address_a), Stubs.open(address_b)
            stubs_a.publish_plain_agent()
            yield stubs_a, stubs_b
            stubs_a.close()
            stubs_b.close()
        finally:
            _stop(b)
    finally:
        _stop(a)
        _truncate(postgres_session_url)


def _stop(replica: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and a clean exit within the shutdown bound (3 s of grace, then 30 s); killed
    whatever happens, so no replica outlives the module."""
    replica.terminate()
    try:
        assert replica.wait(40) == 0
    finally:
        if replica.poll() is None:
            replica.kill()
            replica.wait()


def test_a_watcher_on_one_replica_sees_events_written_through_the_other(
    replicas: tuple[Stubs, Stubs],
) -> None:
    a, b = replicas
    thread = a.thread(enum_pb2.CONCURRENCY_POLICY_ALLOW)
    run = a.run(thread.id, ref=PLAIN)
    run_stream = b.runtime.WatchRun(pb.WatchRunRequest(run_id=run.id), timeout=30)
    thread_stream = b.runtime.WatchThread(pb.WatchThreadRequest(thread_id=thread.id), timeout=30)
    assert next(run_stream).event.sequence == 1  # the replay, read from the shared database
    assert next(thread_stream).event.event_type == enum_pb2.EVENT_TYPE_THREAD_CREATED
    assert next(thread_stream).event.event_type == enum_pb2.EVENT_TYPE_RUN_CREATED
    time.sleep(0.3)  # both streams are tailing now

    for note in ("first", "second", "third"):
        written = time.monotonic()
        a.runtime.AmendRun(
            pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note=note)),
            timeout=10,
        )
        seen = next(run_stream).event
        latency = time.monotonic() - written
        assert seen.event_type == enum_pb2.EVENT_TYPE_RUN_AMENDED
        assert seen.run_amended_attributes.amendment.note == note
        assert latency < PROMPT, f"event reached the other replica after {latency:.2f}s"
        assert next(thread_stream).event == seen

    written = time.monotonic()
    a.runtime.AppendMessage(
        pb.AppendMessageRequest(
            thread_id=thread.id, role=enum_pb2.MESSAGE_ROLE_USER, content="hello from A"
        ),
        timeout=10,
    )
    seen = next(thread_stream).event
    assert seen.event_type == enum_pb2.EVENT_TYPE_THREAD_MESSAGE_APPENDED
    assert time.monotonic() - written < PROMPT

    # A step through A, written by A's step writer process (which notifies as A does).
    got = a.acquire()
    worker = Worker(a, got)
    worker.begin_turn()
    while next(run_stream).event.event_type != enum_pb2.EVENT_TYPE_TURN_STARTED:
        pass  # the acquisition's events, then the turn's
    written = time.monotonic()
    step = worker.model().step
    seen = next(run_stream).event
    assert seen.event_type == enum_pb2.EVENT_TYPE_STEP_STARTED
    assert seen.step_started_attributes.step_id == step.id
    assert time.monotonic() - written < PROMPT
    written = time.monotonic()
    worker.end(step.id)
    seen = next(run_stream).event
    assert seen.event_type == enum_pb2.EVENT_TYPE_STEP_ENDED
    assert time.monotonic() - written < PROMPT

    # The run ends through A: B's WatchRun delivers run.ended and finishes.
    a.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    rest = [r.event for r in run_stream]
    assert rest[-1].event_type == enum_pb2.EVENT_TYPE_RUN_ENDED
    assert [e.sequence for e in rest] == list(range(seen.sequence + 1, rest[-1].sequence + 1))
    thread_stream.cancel()


def test_a_worker_long_polling_on_one_replica_is_woken_by_a_run_created_on_the_other(
    replicas: tuple[Stubs, Stubs],
) -> None:
    a, b = replicas
    thread = a.thread(enum_pb2.CONCURRENCY_POLICY_ALLOW)
    for round_ in range(2):
        result: dict[str, Any] = {}

        def poll(result: dict[str, Any] = result) -> None:
            result["response"] = b.acquire("worker-on-b", wait=15)
            result["at"] = time.monotonic()

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)
        assert "response" not in result  # asleep on B
        created_at = time.monotonic()
        run = a.run(thread.id, ref=PLAIN)
        poller.join(20)
        got = result["response"]
        assert got.run.id == run.id, f"round {round_}"
        assert result["at"] - created_at < PROMPT, "B's worker was not woken by A's run"
        # The attempt is visible through A as well.
        listed = a.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run.id), timeout=10)
        assert [x.worker_id for x in listed.attempts] == ["worker-on-b"]
        b.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)


def test_replicas_append_one_registry_log(replicas: tuple[Stubs, Stubs]) -> None:
    """Publishes through both replicas at once take consecutive indexes of one log, which both
    sign with the one key (issue 31, item 2): the entries since make the signed root."""
    registries = [replicas[0].registry, replicas[1].registry]
    keys = trusted(registries[0])
    assert trusted(registries[1]) == keys
    before = current(registries[0], keys)
    results: list[Any] = []

    def publish(registry: Any, n: int) -> None:
        for i in range(5):
            results.append(publish_agent(registry, unique(f"replica{n}"), f"v{i}"))

    threads = [threading.Thread(target=publish, args=(registries[n % 2], n)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.log_inclusion.entry.index for r in results}) == 20
    for r in results:
        proven(r.log_inclusion, keys)
    after = current(registries[1], keys)
    response = registries[0].GetLogEntries(
        registry_pb.GetLogEntriesRequest(start=before.size), timeout=10
    )
    entries = log_verify.EntryRange(before.size, list(response.prefix_hashes))
    for entry in response.entries:
        entries.add(entry.index, entry.leaf)
    entries.check(after)
