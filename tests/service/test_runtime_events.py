"""Events through real gRPC on both engines: gap-free hash-chained logs, WatchRun and
WatchThread replay-then-tail with exact resumption, and watchers that cost nothing while idle."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from sqlalchemy import event as sa_event

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2, runtime_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core.event_chain import event_hash, format_time
from runtime_service.runtime_settings import RuntimeSettings
from tests.runtime_support import PLAIN, Stubs, get_run
from tests.support import ServerThread

# The `stubs` fixture (tests/conftest.py) publishes plain_agent:prod first.
pytestmark = pytest.mark.plain_agent

E = enum_pb2
COMPLETE = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN
HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def dotted(event_type: int) -> str:
    name = E.EventType.Name(event_type).removeprefix("EVENT_TYPE_").lower()
    head, _, tail = name.partition("_")
    return f"{head}.{tail}"


def recomputed(event: event_pb2.Event) -> str:
    """The event's hash, recomputed from what the wire carries (docs: the canonical form)."""
    attributes = getattr(event, str(event.WhichOneof("attributes")))
    return event_hash(
        event_id=event.id,
        thread_id=event.thread_id,
        run_id=event.run_id,
        sequence=event.sequence,
        event_type=dotted(event.event_type),
        event_time=format_time(event.event_time.ToDatetime(tzinfo=dt.UTC)),
        attributes=json_format.MessageToDict(attributes, preserving_proto_field_name=True),
        prev_hash=event.prev_hash,
    )


def assert_chain(events: list[event_pb2.Event]) -> None:
    """One log: sequences 1..n without gaps, each hash chained to the previous and correct."""
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    previous = ""
    for e in events:
        assert e.prev_hash == previous
        assert HASH.match(e.hash)
        assert e.hash == recomputed(e), f"hash of event {e.sequence} does not verify"
        assert e.WhichOneof("attributes") == dotted(e.event_type).replace(".", "_") + "_attributes"
        previous = e.hash
    assert len({e.id for e in events}) == len(events)


def watch_all(stubs: Stubs, run_id: str, after: int = 0) -> list[event_pb2.Event]:
    """WatchRun from ``after`` until the stream ends (it does after run.ended)."""
    return [
        r.event
        for r in stubs.runtime.WatchRun(
            pb.WatchRunRequest(run_id=run_id, after_sequence=after), timeout=10
        )
    ]


def take(stream: Any, count: int) -> list[Any]:
    out = []
    for response in stream:
        out.append(response)
        if len(out) == count:
            break
    stream.cancel()
    return out


def test_every_change_appends_a_gap_free_hash_chained_event(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    run = stubs.run(thread.id, ref=PLAIN, max_attempts=3)
    stubs.runtime.AmendRun(
        pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note="n")), timeout=10
    )
    first = stubs.acquire("w1")
    stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=first.fence), timeout=10)  # no event
    stubs.finish(
        first.fence,
        E.ATTEMPT_OUTCOME_FAILED_RETRYABLE,
        error=message_pb2.AttemptError(message="flaky"),
    )
    second = stubs.acquire("w2")
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id), timeout=10)
    stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id), timeout=10)
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id, reason="enough"), timeout=10)
    stubs.finish(second.fence, E.ATTEMPT_OUTCOME_CANCELLED)

    events = watch_all(stubs, run.id)
    assert_chain(events)
    assert [e.event_type for e in events] == [
        E.EVENT_TYPE_RUN_CREATED,
        E.EVENT_TYPE_RUN_AMENDED,
        E.EVENT_TYPE_RUN_STATUS_CHANGED,  # QUEUED -> RUNNING
        E.EVENT_TYPE_ATTEMPT_STARTED,
        E.EVENT_TYPE_ATTEMPT_ENDED,  # FAILED
        E.EVENT_TYPE_RUN_STATUS_CHANGED,  # RUNNING -> QUEUED
        E.EVENT_TYPE_RUN_STATUS_CHANGED,  # QUEUED -> RUNNING
        E.EVENT_TYPE_ATTEMPT_STARTED,
        E.EVENT_TYPE_RUN_PAUSE_REQUESTED,
        E.EVENT_TYPE_RUN_RESUME_REQUESTED,
        E.EVENT_TYPE_RUN_CANCEL_REQUESTED,
        E.EVENT_TYPE_ATTEMPT_ENDED,  # CANCELLED
        E.EVENT_TYPE_RUN_ENDED,
    ]
    assert all(e.run_id == run.id and e.thread_id == thread.id for e in events)
    times = [e.event_time.ToDatetime() for e in events]
    assert times == sorted(times)
    ended = events[-1].run_ended_attributes
    assert ended.status == E.RUN_STATUS_CANCELLED
    assert ended.terminal_reason == E.TERMINAL_REASON_CANCELLED_BY_USER
    assert events[4].attempt_ended_attributes.error.message == "flaky"
    assert events[7].attempt_started_attributes.reason == E.ATTEMPT_REASON_RETRY_AFTER_ERROR
    assert events[7].attempt_started_attributes.worker_id == "w2"
    assert get_run(stubs, run.id).last_event_sequence == len(events)

    # The thread's own log is a chain of its own.
    for text in ("a", "b"):
        stubs.runtime.AppendMessage(
            pb.AppendMessageRequest(thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content=text),
            timeout=10,
        )
    total = 1 + 2 + len(events)
    everything = [
        r.event
        for r in take(
            stubs.runtime.WatchThread(pb.WatchThreadRequest(thread_id=thread.id), timeout=10),
            total,
        )
    ]
    own = [e for e in everything if not e.run_id]
    assert [e.event_type for e in own] == [
        E.EVENT_TYPE_THREAD_CREATED,
        E.EVENT_TYPE_THREAD_MESSAGE_APPENDED,
        E.EVENT_TYPE_THREAD_MESSAGE_APPENDED,
    ]
    assert_chain(own)
    assert [e for e in everything if e.run_id] == events


def test_watch_run_replays_then_tails_live_and_ends_after_run_ended(stubs: Stubs) -> None:
    run = stubs.run(stubs.thread().id, ref=PLAIN)
    seen: list[event_pb2.Event] = []
    finished = threading.Event()

    def watch() -> None:
        for response in stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run.id), timeout=20):
            seen.append(response.event)
        finished.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e.event_type for e in seen] == [E.EVENT_TYPE_RUN_CREATED]  # the replay
    got = stubs.acquire()
    stubs.runtime.AmendRun(
        pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note="live")),
        timeout=10,
    )
    deadline = time.monotonic() + 5
    while len(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen[-1].event_type == E.EVENT_TYPE_RUN_AMENDED  # tailed live, promptly
    assert not finished.is_set()
    stubs.finish(got.fence, COMPLETE)
    assert finished.wait(5), "WatchRun did not end after run.ended"
    watcher.join(5)
    assert seen == watch_all(stubs, run.id)
    assert seen[-1].event_type == E.EVENT_TYPE_RUN_ENDED
    # Watching an ended run from its last sequence ends at once with nothing.
    last = get_run(stubs, run.id).last_event_sequence
    assert watch_all(stubs, run.id, after=last) == []
    only_end = list(
        stubs.runtime.WatchRun(
            pb.WatchRunRequest(run_id=run.id, event_types=[E.EVENT_TYPE_RUN_ENDED]), timeout=10
        )
    )
    assert [r.event.sequence for r in only_end] == [last]


def test_reconnecting_with_the_last_sequence_loses_and_repeats_nothing(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    run = stubs.run(thread.id, ref=PLAIN, max_attempts=5)
    received: list[event_pb2.Event] = []
    changes = [
        lambda: None,
        lambda: stubs.finish(
            stubs.acquire().fence,
            E.ATTEMPT_OUTCOME_FAILED_RETRYABLE,
            error=message_pb2.AttemptError(message="x"),
        ),
        lambda: stubs.runtime.AmendRun(
            pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note="a")),
            timeout=10,
        ),
        lambda: stubs.finish(stubs.acquire().fence, COMPLETE),
    ]
    for change in changes:
        change()
        # Connect from the last sequence seen, read what is there, drop the stream.
        after = received[-1].sequence if received else 0
        target = get_run(stubs, run.id).last_event_sequence
        if target == after:
            continue
        stream = stubs.runtime.WatchRun(
            pb.WatchRunRequest(run_id=run.id, after_sequence=after), timeout=10
        )
        received += [r.event for r in take(stream, target - after)]
    full = watch_all(stubs, run.id)
    assert received == full
    assert full[-1].event_type == E.EVENT_TYPE_RUN_ENDED
    assert_chain(received)


def test_a_dropped_stream_never_affects_the_run(stubs: Stubs, server_address: str) -> None:
    run = stubs.run(stubs.thread().id, ref=PLAIN)
    got = stubs.acquire()
    before = get_run(stubs, run.id)
    # A client on its own connection watches, then vanishes mid-stream.
    channel = grpc.insecure_channel(server_address)
    stream = runtime_service_pb2_grpc.RuntimeServiceStub(channel).WatchRun(
        pb.WatchRunRequest(run_id=run.id), timeout=30
    )
    first = next(stream)
    assert first.event.sequence == 1
    channel.close()  # abrupt: no cancel, the connection just goes away
    time.sleep(0.3)
    assert get_run(stubs, run.id) == before
    stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=got.fence), timeout=10)
    done = stubs.finish(got.fence, COMPLETE)
    assert done.run.status == E.RUN_STATUS_COMPLETED
    assert_chain(watch_all(stubs, run.id))


def test_watch_thread_interleaves_every_log_and_resumes_by_cursor(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    rt = stubs.runtime

    def message(text: str, run_id: str = "") -> None:
        rt.AppendMessage(
            pb.AppendMessageRequest(
                thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content=text, run_id=run_id
            ),
            timeout=10,
        )

    message("hello")
    one = stubs.run(thread.id, ref=PLAIN)
    two = stubs.run(thread.id, ref=PLAIN)
    got = stubs.acquire()
    message("working", one.id)
    rt.CancelRun(pb.CancelRunRequest(run_id=two.id), timeout=10)
    stubs.finish(got.fence, COMPLETE)
    total = (
        2  # thread.created and the first message
        + 1  # the second message
        + get_run(stubs, one.id).last_event_sequence
        + get_run(stubs, two.id).last_event_sequence
    )
    responses = take(rt.WatchThread(pb.WatchThreadRequest(thread_id=thread.id), timeout=10), total)
    events = [r.event for r in responses]
    assert len(events) == total
    assert all(e.thread_id == thread.id for e in events)
    cursors = [int(r.cursor) for r in responses]
    assert cursors == sorted(set(cursors))  # strictly increasing: commit order
    for run_id in ("", one.id, two.id):
        log = [e for e in events if e.run_id == run_id]
        assert_chain(log)
    assert [e for e in events if e.run_id == one.id] == watch_all(stubs, one.id)
    # Commit order across logs: the message about run one comes after its acquisition.
    kinds = [(e.run_id, e.event_type) for e in events]
    assert kinds.index((one.id, E.EVENT_TYPE_ATTEMPT_STARTED)) < kinds.index(
        ("", E.EVENT_TYPE_THREAD_MESSAGE_APPENDED), 2
    )

    # Resume from any cursor: exactly the rest, then live.
    middle = 5
    resumed = rt.WatchThread(
        pb.WatchThreadRequest(thread_id=thread.id, after_cursor=responses[middle - 1].cursor),
        timeout=10,
    )
    rest = take(resumed, total - middle)
    assert [r.event for r in rest] == events[middle:]
    live = rt.WatchThread(
        pb.WatchThreadRequest(thread_id=thread.id, after_cursor=responses[-1].cursor), timeout=10
    )
    only_new = rt.WatchThread(
        pb.WatchThreadRequest(thread_id=thread.id, live_only=True), timeout=10
    )
    time.sleep(0.3)  # let both streams start tailing
    message("later")
    [tail] = take(live, 1)
    [fresh] = take(only_new, 1)
    assert tail.event.event_type == E.EVENT_TYPE_THREAD_MESSAGE_APPENDED
    assert (
        tail.event.sequence == 4
        and tail.event.prev_hash == [e for e in events if not e.run_id][-1].hash
    )
    assert fresh.event == tail.event and fresh.cursor == tail.cursor
    filtered = take(
        rt.WatchThread(
            pb.WatchThreadRequest(thread_id=thread.id, event_types=[E.EVENT_TYPE_RUN_ENDED]),
            timeout=10,
        ),
        2,
    )
    assert {r.event.run_id for r in filtered} == {one.id, two.id}


def test_an_idle_watcher_does_no_database_queries(database_url: str) -> None:
    # No reaper pass during the test: the only queries would be the watchers'.
    server = ServerThread(database_url, RuntimeSettings(reaper_interval=3600))
    address = server.start()
    try:
        stubs = Stubs.open(address)
        stubs.publish_plain_agent()
        thread = stubs.thread()
        run = stubs.run(thread.id, ref=PLAIN, labels={"pool": "nobody"})
        run_stream = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run.id), timeout=30)
        thread_stream = stubs.runtime.WatchThread(
            pb.WatchThreadRequest(thread_id=thread.id), timeout=30
        )
        assert next(run_stream).event.sequence == 1
        assert next(thread_stream).event.event_type == E.EVENT_TYPE_THREAD_CREATED
        assert next(thread_stream).event.run_id == run.id
        # A worker long-polling for work it will never get (the label does not match).
        poll: dict[str, Any] = {}
        poller = threading.Thread(
            target=lambda: poll.setdefault(
                "r",
                stubs.acquire(
                    "idle", wait=3, filter=message_pb2.AcquireFilter(labels={"pool": "other"})
                ),
            )
        )
        poller.start()
        time.sleep(0.5)  # everyone is asleep now

        database = server.server.database
        assert database is not None
        statements: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        engines = {id(e): e for e in (database.write_engine, database.read_engine)}.values()
        for engine in engines:
            sa_event.listen(engine, "before_cursor_execute", count)
        try:
            time.sleep(1.0)
            idle = list(statements)
            # Still alive: a change reaches both watchers at once.
            stubs.runtime.AmendRun(
                pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note="wake")),
                timeout=10,
            )
            assert next(run_stream).event.event_type == E.EVENT_TYPE_RUN_AMENDED
            assert next(thread_stream).event.event_type == E.EVENT_TYPE_RUN_AMENDED
        finally:
            for engine in engines:
                sa_event.remove(engine, "before_cursor_execute", count)
        assert idle == [], f"{len(idle)} queries while idle, e.g. {idle[:3]}"
        assert statements, "the listener saw nothing at all: it is not measuring"
        run_stream.cancel()
        thread_stream.cancel()
        poller.join(10)
        assert not poll["r"].HasField("run")
        stubs.close()
    finally:
        server.stop()
