"""Many workers, many runs: every run is acquired exactly once and none is lost.

16 worker threads, each with its own channel, long-poll the server for 500 runs of one thread
(ALLOW): 400 are queued before the workers start, two producers create the last 100 while the
workers drain the queue, so acquisitions, finishes and creations of one thread interleave (and
idle workers are woken by new runs). Runs on both engines.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Any

from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from tests.runtime_support import Stubs
from tests.support import running_server

WORKERS = 16
PRODUCERS = 2
RUNS = 500
PRECREATED = 400
BUDGET_SECONDS = 55


def test_workers_acquire_every_run_exactly_once(database_url: str) -> None:
    with running_server(database_url) as address:
        admin = Stubs.open(address)
        admin.publish_plain_agent()
        thread = admin.thread(enum_pb2.CONCURRENCY_POLICY_ALLOW)

        lock = threading.Lock()
        acquired: list[tuple[str, str, str]] = []  # (run id, attempt id, worker)
        finished: list[str] = []
        created: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()
        all_done = threading.Event()

        def worker(name: str) -> None:
            stubs = Stubs.open(address)
            try:
                while not stop.is_set():
                    got = stubs.acquire(name, wait=1.0)
                    if not got.HasField("run"):
                        continue
                    with lock:
                        acquired.append((got.run.id, got.attempt.id, name))
                    done = stubs.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
                    assert done.run.status == enum_pb2.RUN_STATUS_COMPLETED
                    with lock:
                        finished.append(got.run.id)
                        if len(finished) == RUNS:
                            all_done.set()
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                all_done.set()
            finally:
                stubs.close()

        def producer(count: int) -> None:
            stubs = Stubs.open(address)
            try:
                for _ in range(count):
                    if stop.is_set():
                        return
                    run = stubs.run(thread.id, ref="plain_agent:prod")
                    with lock:
                        created.append(run.id)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                all_done.set()
            finally:
                stubs.close()

        for _ in range(PRECREATED):
            created.append(admin.run(thread.id, ref="plain_agent:prod").id)
        started = time.monotonic()
        workers = [
            threading.Thread(target=worker, args=(f"worker-{i}",), daemon=True)
            for i in range(WORKERS)
        ]
        producers = [
            threading.Thread(target=producer, args=((RUNS - PRECREATED) // PRODUCERS,), daemon=True)
            for _ in range(PRODUCERS)
        ]
        for t in workers + producers:
            t.start()
        all_done.wait(BUDGET_SECONDS)
        stop.set()
        for t in workers + producers:
            t.join(15)
        elapsed = time.monotonic() - started

        assert not errors, f"{len(errors)} worker/producer errors, first: {errors[0]!r}"
        assert len(created) == RUNS
        assert len(finished) == RUNS, f"only {len(finished)} of {RUNS} finished in {elapsed:.1f}s"
        per_run = Counter(run_id for run_id, _, _ in acquired)
        assert set(per_run) == set(created)
        assert max(per_run.values()) == 1, "a run was handed to two workers"
        assert len({attempt for _, attempt, _ in acquired}) == RUNS
        # More than one worker really took part.
        assert len({name for _, _, name in acquired}) > 1

        runs: list[Any] = []
        token = ""
        while True:
            page = admin.runtime.ListRuns(
                pb.ListRunsRequest(thread_id=thread.id, page_size=1000, page_token=token),
                timeout=30,
            )
            runs += page.runs
            token = page.next_page_token
            if not token:
                break
        assert len(runs) == RUNS
        assert all(r.status == enum_pb2.RUN_STATUS_COMPLETED for r in runs)
        assert all(r.attempt_count == 1 for r in runs)
        assert all(r.current_attempt_id == "" for r in runs)
        admin.close()


def test_enqueued_runs_run_one_at_a_time_in_order_while_being_created(database_url: str) -> None:
    """ENQUEUE under concurrency: runs created while workers acquire and finish others of the
    same thread are handed out strictly in creation order, never two at once, and creating
    them (which locks the thread's active runs) never deadlocks with the workers."""
    count = 40
    with running_server(database_url) as address:
        admin = Stubs.open(address)
        admin.publish_plain_agent()
        thread = admin.thread(enum_pb2.CONCURRENCY_POLICY_ENQUEUE)
        lock = threading.Lock()
        order: list[str] = []
        created: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def worker(name: str) -> None:
            stubs = Stubs.open(address)
            try:
                while not stop.is_set():
                    got = stubs.acquire(name, wait=0.5)
                    if got.HasField("run"):
                        with lock:
                            order.append(got.run.id)
                        stubs.finish(got.fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
            finally:
                stubs.close()

        workers = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
        for t in workers:
            t.start()
        try:
            for _ in range(count):
                created.append(admin.run(thread.id, ref="plain_agent:prod").id)
            deadline = time.monotonic() + 30
            while len(order) < count and not errors and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for t in workers:
                t.join(10)
        assert not errors, repr(errors[0])
        assert order == created
        runs = admin.runtime.ListRuns(
            pb.ListRunsRequest(thread_id=thread.id, page_size=100), timeout=10
        ).runs
        assert all(r.status == enum_pb2.RUN_STATUS_COMPLETED for r in runs)
        by_id = {r.id: r for r in runs}
        for earlier, later in itertools.pairwise(created):
            # Each run started only after the one before it had ended.
            assert by_id[later].start_time.ToDatetime() >= by_id[earlier].end_time.ToDatetime()
        admin.close()
