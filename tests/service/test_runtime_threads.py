"""Threads, messages and the thread concurrency policies, through real gRPC on both engines."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import struct_pb2
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db import Database
from agentrt_base.db_engines import normalise_url
from runtime_service.notify import Notifier
from runtime_service.services.context import Runtime
from runtime_service.services.runs import RunsService
from runtime_service.store import threads
from runtime_service.store.tables import ThreadRow
from tests.runtime_support import PLAIN, Stubs, get_run
from tests.support import error_details, rpc_error

# The `stubs` fixture (tests/conftest.py) publishes plain_agent:prod first.
pytestmark = [
    pytest.mark.plain_agent,
    pytest.mark.fresh_server(
        reason="acquires whichever run is queued and lists every thread: on a shared server"
        " both may be an earlier test's"
    ),
]

E = enum_pb2
COMPLETE = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN


def new_run(stubs: Stubs, thread_id: str, **kwargs: Any) -> message_pb2.Run:
    return stubs.run(thread_id, ref=PLAIN, **kwargs)


def no_work(stubs: Stubs, wait: float = 0.3) -> bool:
    """True when no run can be acquired right now (waiting ``wait`` for one)."""
    return not stubs.acquire("probe", wait=wait).HasField("run")


# -- threads ---------------------------------------------------------------------------------


def test_thread_create_get_and_no_run_status(stubs: Stubs) -> None:
    created = stubs.runtime.CreateThread(
        pb.CreateThreadRequest(title="support #42", metadata={"tenant": "acme", "user": "u1"}),
        timeout=10,
    ).thread
    assert created.id.startswith("thr_")
    assert created.title == "support #42"
    assert dict(created.metadata) == {"tenant": "acme", "user": "u1"}
    # The server default policy is REJECT, never UNSPECIFIED on output.
    assert created.concurrency_policy == E.CONCURRENCY_POLICY_REJECT
    assert created.HasField("create_time")
    got = stubs.runtime.GetThread(pb.GetThreadRequest(thread_id=created.id), timeout=10).thread
    assert got == created

    # A thread carries no run status: the contract has no such field, and the thread reads
    # the same before, during and after a run of it.
    assert not {"status", "run_status", "state"} & set(message_pb2.Thread.DESCRIPTOR.fields_by_name)
    run = new_run(stubs, created.id)
    got = stubs.acquire()
    assert got.run.id == run.id
    mid = stubs.runtime.GetThread(pb.GetThreadRequest(thread_id=created.id), timeout=10).thread
    stubs.finish(got.fence, COMPLETE)
    after = stubs.runtime.GetThread(pb.GetThreadRequest(thread_id=created.id), timeout=10).thread
    assert mid == created and after == created


def test_create_thread_is_idempotent_by_request_id(stubs: Stubs) -> None:
    key = str(uuid.uuid4())
    first = stubs.thread(request_id=key)
    again = stubs.thread(request_id=key)
    assert again == first
    # Concurrent retries of one create make one thread.
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: stubs.thread(request_id="concurrent-" + key).id, range(8)))
    assert len(ids) == 1
    listed = stubs.runtime.ListThreads(pb.ListThreadsRequest(page_size=100), timeout=10).threads
    assert sorted(t.id for t in listed) == sorted([first.id, *ids])


def test_a_create_thread_that_loses_the_request_id_race_returns_the_winner(
    stubs: Stubs, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CreateThread whose look-up missed a thread with its request id that committed just
    after (the race the unique index settles) hears RequestIdTaken from the store, runs again,
    and answers the winner's thread; nothing of its own insert stays."""
    winner = stubs.thread(request_id="race")
    looked_up: list[ThreadRow | None] = []

    def late_by_request_id(session: Session, request_id: str) -> ThreadRow | None:
        # The first look-up is made to miss, as if it ran before the winner committed.
        found = real_by_request_id(session, request_id) if looked_up else None
        looked_up.append(found)
        return found

    real_by_request_id = threads.by_request_id
    monkeypatch.setattr(threads, "by_request_id", late_by_request_id)
    runtime = Runtime(Database(database_url), Notifier())
    try:
        answered = asyncio.run(
            RunsService(runtime).create_thread("default", "loser", {}, "", "race")
        )
    finally:
        runtime.database.dispose()
    assert [t.id if t else None for t in looked_up] == [None, winner.id]
    assert answered.id == winner.id and answered.title == winner.title
    listed = stubs.runtime.ListThreads(pb.ListThreadsRequest(page_size=100), timeout=10).threads
    assert [t.id for t in listed] == [winner.id]


def test_list_threads_filters_by_metadata_and_pages_newest_first(stubs: Stubs) -> None:
    made = []
    for i in range(11):
        metadata = {"tenant": "acme" if i % 3 else "other", "n": str(i)}
        made.append(
            stubs.runtime.CreateThread(
                pb.CreateThreadRequest(title=f"t{i}", metadata=metadata), timeout=10
            ).thread
        )
    acme = [t.id for t in reversed(made) if t.metadata["tenant"] == "acme"]
    assert len(acme) == 7

    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stubs.runtime.ListThreads(
            pb.ListThreadsRequest(page_size=3, page_token=token, metadata={"tenant": "acme"}),
            timeout=10,
        )
        assert len(page.threads) <= 3
        seen += [t.id for t in page.threads]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == acme  # newest first, each once, only matches
    assert pages == 3

    both = stubs.runtime.ListThreads(
        pb.ListThreadsRequest(metadata={"tenant": "acme", "n": "4"}), timeout=10
    ).threads
    assert [t.title for t in both] == ["t4"]
    everything = stubs.runtime.ListThreads(pb.ListThreadsRequest(), timeout=10).threads
    assert [t.id for t in everything] == [t.id for t in reversed(made)]
    # A token is bound to its filters.
    first = stubs.runtime.ListThreads(
        pb.ListThreadsRequest(page_size=2, metadata={"tenant": "acme"}), timeout=10
    )
    error = rpc_error(
        stubs.runtime.ListThreads,
        pb.ListThreadsRequest(page_size=2, page_token=first.next_page_token),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_messages_append_and_page_in_both_orders_with_run_filter(stubs: Stubs) -> None:
    thread = stubs.thread()
    other = stubs.thread()
    run = new_run(stubs, thread.id)
    data = struct_pb2.Struct()
    data.update({"k": "v", "n": 2})
    appended = []
    for i in range(7):
        appended.append(
            stubs.runtime.AppendMessage(
                pb.AppendMessageRequest(
                    thread_id=thread.id,
                    role=E.MESSAGE_ROLE_USER if i % 2 == 0 else E.MESSAGE_ROLE_ASSISTANT,
                    content=f"m{i}",
                    data=data if i == 3 else None,
                    run_id=run.id if i in (1, 4, 5) else "",
                ),
                timeout=10,
            ).message
        )
    assert all(m.id.startswith("msg_") and m.thread_id == thread.id for m in appended)
    assert appended[3].data == data
    assert appended[1].run_id == run.id and appended[0].run_id == ""

    def page_all(**kwargs: Any) -> list[str]:
        out: list[str] = []
        token = ""
        while True:
            page = stubs.runtime.ListMessages(
                pb.ListMessagesRequest(thread_id=thread.id, page_token=token, **kwargs),
                timeout=10,
            )
            out += [m.content for m in page.messages]
            token = page.next_page_token
            if not token:
                return out

    oldest_first = [f"m{i}" for i in range(7)]
    assert page_all(page_size=3) == oldest_first
    assert page_all(page_size=2, newest_first=True) == oldest_first[::-1]
    assert page_all(page_size=2, run_id=run.id) == ["m1", "m4", "m5"]
    assert page_all(page_size=1, run_id=run.id, newest_first=True) == ["m5", "m4", "m1"]
    full = stubs.runtime.ListMessages(pb.ListMessagesRequest(thread_id=thread.id), timeout=10)
    assert list(full.messages) == appended and full.next_page_token == ""
    # Another thread's messages are its own.
    empty = stubs.runtime.ListMessages(pb.ListMessagesRequest(thread_id=other.id), timeout=10)
    assert list(empty.messages) == []

    # A message may not name a run of another thread; nothing is appended.
    foreign = new_run(stubs, other.id)
    error = rpc_error(
        stubs.runtime.AppendMessage,
        pb.AppendMessageRequest(
            thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content="x", run_id=foreign.id
        ),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error_details(error)["BadRequest"].field_violations] == ["run_id"]
    missing = rpc_error(
        stubs.runtime.AppendMessage,
        pb.AppendMessageRequest(
            thread_id=thread.id,
            role=E.MESSAGE_ROLE_USER,
            content="x",
            run_id="run_01NOSUCHRUN0000000000000000",
        ),
        timeout=10,
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert page_all() == oldest_first


def thread_ledger(database_url: str, thread_id: str) -> tuple[list[tuple[str, int]], list[str]]:
    """A thread's messages as (id, seq) in seq order, and its own events' types in order, read
    beside the server (``seq`` is not in the contract)."""
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            messages = conn.execute(
                sa.text("SELECT id, seq FROM runtime_messages WHERE thread_id = :t ORDER BY seq"),
                {"t": thread_id},
            ).all()
            events = conn.execute(
                sa.text(
                    "SELECT event_type FROM runtime_events"
                    " WHERE thread_id = :t AND run_id = '' ORDER BY sequence"
                ),
                {"t": thread_id},
            ).all()
            return [(m.id, int(m.seq)) for m in messages], [e.event_type for e in events]
    finally:
        engine.dispose()


def test_append_message_is_idempotent_by_request_id(stubs: Stubs, database_url: str) -> None:
    thread = stubs.thread()

    def append(
        request_id: str,
        content: str = "hello",
        role: int = E.MESSAGE_ROLE_USER,
        thread_id: str = thread.id,
    ) -> message_pb2.Message:
        return stubs.runtime.AppendMessage(
            pb.AppendMessageRequest(
                thread_id=thread_id, role=role, content=content, request_id=request_id
            ),
            timeout=10,
        ).message

    first = append("req-1")
    ledger = thread_ledger(database_url, thread.id)
    assert ledger == ([(first.id, 1)], ["thread.created", "thread.message_appended"])

    # A retry returns the first message (same id, same seq, same create_time) and writes
    # neither a message nor an event.
    assert append("req-1") == first
    assert thread_ledger(database_url, thread.id) == ledger
    # So does a retry that carries something else: like every request_id-idempotent create,
    # the first request wins and the retry's fields are not compared.
    assert append("req-1", "changed", role=E.MESSAGE_ROLE_ASSISTANT) == first
    assert thread_ledger(database_url, thread.id) == ledger

    # Another request id is another message.
    second = append("req-2")
    assert second.id != first.id
    messages, events = thread_ledger(database_url, thread.id)
    assert messages == [(first.id, 1), (second.id, 2)]
    assert events == ["thread.created", *["thread.message_appended"] * 2]

    # Concurrent retries of one append make one message (and no error).
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: append("req-3").id, range(8)))
    assert len(ids) == 1
    messages, events = thread_ledger(database_url, thread.id)
    assert [m for m, _ in messages] == [first.id, second.id, *ids]
    assert events == ["thread.created", *["thread.message_appended"] * 3]

    # The key is scoped to the thread: the same request id on another thread appends there.
    other = stubs.thread()
    elsewhere = append("req-1", thread_id=other.id)
    assert elsewhere.id != first.id and elsewhere.thread_id == other.id
    assert thread_ledger(database_url, other.id) == (
        [(elsewhere.id, 1)],
        ["thread.created", "thread.message_appended"],
    )
    assert len(thread_ledger(database_url, thread.id)[0]) == 3

    # Without a request id every append is a new message.
    assert append("").id != append("").id
    listed = stubs.runtime.ListMessages(pb.ListMessagesRequest(thread_id=thread.id), timeout=10)
    assert [m.content for m in listed.messages] == ["hello"] * 5


def test_append_message_refuses_a_request_id_over_128_characters(
    stubs: Stubs, database_url: str
) -> None:
    thread = stubs.thread()
    error = rpc_error(
        stubs.runtime.AppendMessage,
        pb.AppendMessageRequest(
            thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content="x", request_id="r" * 129
        ),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error_details(error)["BadRequest"].field_violations] == ["request_id"]
    assert thread_ledger(database_url, thread.id) == ([], ["thread.created"])
    longest = stubs.runtime.AppendMessage(
        pb.AppendMessageRequest(
            thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content="x", request_id="r" * 128
        ),
        timeout=10,
    ).message
    assert thread_ledger(database_url, thread.id)[0] == [(longest.id, 1)]


def test_a_message_over_the_limit_is_resource_exhausted_and_changes_nothing(
    stubs: Stubs, database_url: str
) -> None:
    # runtime_service.proto, AppendMessage: "RESOURCE_EXHAUSTED with
    # ErrorInfo(reason="INPUT_TOO_LARGE", metadata "limit")" (it answered INVALID_ARGUMENT).
    thread = stubs.thread()
    error = rpc_error(
        stubs.runtime.AppendMessage,
        pb.AppendMessageRequest(
            thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content="x" * (256 * 1024 + 1)
        ),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_details(error)["ErrorInfo"]
    assert (info.reason, info.metadata["limit"]) == ("INPUT_TOO_LARGE", str(256 * 1024))
    assert thread_ledger(database_url, thread.id) == ([], ["thread.created"])
    # At the limit, it is appended.
    stubs.runtime.AppendMessage(
        pb.AppendMessageRequest(
            thread_id=thread.id, role=E.MESSAGE_ROLE_USER, content="x" * (256 * 1024)
        ),
        timeout=10,
    )


# -- concurrency policies --------------------------------------------------------------------


def test_reject_refuses_a_second_active_run_with_thread_busy(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_UNSPECIFIED)  # the default is REJECT
    assert thread.concurrency_policy == E.CONCURRENCY_POLICY_REJECT
    first = new_run(stubs, thread.id)
    error = rpc_error(new_run, stubs, thread.id)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_details(error)["ErrorInfo"]
    assert info.reason == "THREAD_BUSY"
    assert info.metadata["active_run_id"] == first.id
    runs = stubs.runtime.ListRuns(pb.ListRunsRequest(thread_id=thread.id), timeout=10).runs
    assert [r.id for r in runs] == [first.id]

    # While it runs it is still busy; once it ended a new run is accepted.
    got = stubs.acquire()
    assert rpc_error(new_run, stubs, thread.id).code() == grpc.StatusCode.FAILED_PRECONDITION
    stubs.finish(got.fence, COMPLETE)
    second = new_run(stubs, thread.id)
    assert second.status == E.RUN_STATUS_QUEUED
    assert second.concurrency_policy == E.CONCURRENCY_POLICY_REJECT


def test_enqueue_hands_out_the_next_run_only_after_the_active_one_ends(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ENQUEUE)
    first = new_run(stubs, thread.id)
    second = new_run(stubs, thread.id)
    assert second.status == E.RUN_STATUS_QUEUED
    assert second.concurrency_policy == E.CONCURRENCY_POLICY_ENQUEUE
    got = stubs.acquire()
    assert got.run.id == first.id
    assert no_work(stubs)  # the second waits behind the first

    # A worker already long-polling is woken when the first run ends.
    result: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        result["response"] = stubs.acquire("w2", wait=8)
        result["elapsed"] = time.monotonic() - started

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.4)
    assert "response" not in result
    stubs.finish(got.fence, COMPLETE)
    poller.join(10)
    assert result["response"].run.id == second.id
    assert result["elapsed"] < 4


def test_enqueue_waits_for_every_earlier_run_not_only_the_latest(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ENQUEUE)
    a = new_run(stubs, thread.id)
    b = new_run(stubs, thread.id)
    c = new_run(stubs, thread.id)
    got_a = stubs.acquire()
    assert got_a.run.id == a.id
    # B is cancelled while still queued: C must keep waiting for A, which is still running.
    cancelled = stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=b.id), timeout=10).run
    assert cancelled.status == E.RUN_STATUS_CANCELLED
    assert no_work(stubs), "C was handed out while A is still running"
    stubs.finish(got_a.fence, COMPLETE)
    got_c = stubs.acquire(wait=2)
    assert got_c.run.id == c.id

    # Runs that ran side by side (ALLOW) are all earlier runs too.
    d = new_run(stubs, thread.id, concurrency_policy=E.CONCURRENCY_POLICY_ALLOW)
    e = new_run(stubs, thread.id, concurrency_policy=E.CONCURRENCY_POLICY_ALLOW)
    got_d, got_e = stubs.acquire(), stubs.acquire()
    assert {got_d.run.id, got_e.run.id} == {d.id, e.id}
    f = new_run(stubs, thread.id)  # ENQUEUE (the thread's policy): behind C, D and E
    # C is still running (acquired above) and so are D and E.
    for got in (got_d, got_e):
        assert no_work(stubs)
        stubs.finish(got.fence, COMPLETE)
    assert no_work(stubs), "F was handed out while C is still running"
    stubs.finish(got_c.fence, COMPLETE)  # (its worker's fence: the token is not public)
    assert stubs.acquire(wait=2).run.id == f.id


def test_interrupt_cancels_a_queued_run_at_once(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_INTERRUPT)
    old = new_run(stubs, thread.id)
    new = new_run(stubs, thread.id)
    ended = get_run(stubs, old.id)
    assert ended.status == E.RUN_STATUS_CANCELLED
    assert ended.terminal_reason == E.TERMINAL_REASON_INTERRUPTED_BY_NEW_RUN
    assert ended.HasField("end_time")
    assert stubs.acquire().run.id == new.id


def test_interrupt_asks_a_running_run_to_stop_and_the_new_run_waits(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    old = new_run(stubs, thread.id)
    got = stubs.acquire()
    assert got.run.id == old.id
    new = new_run(stubs, thread.id, concurrency_policy=E.CONCURRENCY_POLICY_INTERRUPT)
    assert new.concurrency_policy == E.CONCURRENCY_POLICY_INTERRUPT
    running = get_run(stubs, old.id)
    assert running.status == E.RUN_STATUS_RUNNING and running.cancel_requested
    beat = stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=got.fence), timeout=10)
    assert beat.cancel_requested
    assert no_work(stubs)  # the new run waits until the old one has ended

    done = stubs.finish(got.fence, E.ATTEMPT_OUTCOME_CANCELLED)
    assert done.run.status == E.RUN_STATUS_CANCELLED
    assert done.run.terminal_reason == E.TERMINAL_REASON_INTERRUPTED_BY_NEW_RUN
    assert done.attempt.status == E.ATTEMPT_STATUS_CANCELLED
    assert stubs.acquire(wait=2).run.id == new.id


def test_allow_runs_side_by_side(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    runs = [new_run(stubs, thread.id) for _ in range(3)]
    got = [stubs.acquire(f"w{i}") for i in range(3)]
    assert sorted(g.run.id for g in got) == sorted(r.id for r in runs)
    assert all(get_run(stubs, r.id).status == E.RUN_STATUS_RUNNING for r in runs)
    # A request may override the thread's policy.
    refused = rpc_error(new_run, stubs, thread.id, concurrency_policy=E.CONCURRENCY_POLICY_REJECT)
    assert error_details(refused)["ErrorInfo"].reason == "THREAD_BUSY"
