"""Runs through real gRPC on both engines: binding to a digest, idempotent creates, amendments,
illegal transitions and bad input (each refused call must change nothing)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import duration_pb2
from sqlalchemy.orm import Session

from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db import Database
from agentrt_base.db_engines import normalise_url
from runtime_service.store.runs import run_for_update
from runtime_service.store.tables import RunRow
from tests import registry_data
from tests.runtime_support import PLAIN, Stubs, get_run, in_seconds
from tests.support import error_details, rpc_error

# The `stubs` fixture (tests/conftest.py) publishes plain_agent:prod first.
pytestmark = pytest.mark.plain_agent

E = enum_pb2
COMPLETE = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN
TABLES = (
    "runtime_threads",
    "runtime_messages",
    "runtime_runs",
    "runtime_attempts",
    "runtime_events",
)


def reason(error: grpc.RpcError) -> str:
    return str(error_details(error)["ErrorInfo"].reason)


def db_counts(database_url: str) -> dict[str, int]:
    """Rows per runtime table, read beside the server: a refused call must add none."""
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            return {
                t: int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {t}").scalar_one())
                for t in TABLES
            }
    finally:
        engine.dispose()


def run_events(stubs: Stubs, run_id: str) -> list[Any]:
    """Every event of the run so far (read with WatchRun up to its last sequence)."""
    last = get_run(stubs, run_id).last_event_sequence
    out: list[Any] = []
    if last == 0:
        return out
    stream = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run_id), timeout=10)
    for response in stream:
        out.append(response.event)
        if response.event.sequence >= last:
            break
    stream.cancel()
    return out


# -- binding ---------------------------------------------------------------------------------


def test_run_binds_the_digest_a_tag_resolved_to_and_never_moves(stubs: Stubs) -> None:
    v7 = stubs.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref="coding_agent@agent_v7"), timeout=10
    ).agent_version.digest
    thread = stubs.thread()
    run = stubs.run(thread.id, ref="coding_agent:prod")
    binding = run.agent
    assert binding.requested_ref == "coding_agent:prod"
    assert binding.agent_digest == v7
    assert binding.agent_id == "coding_agent"
    assert binding.version_label == "agent_v7"
    assert binding.resolved_via_tag == "prod"
    assert binding.HasField("resolve_time")
    created = run_events(stubs, run.id)[0]
    assert created.event_type == E.EVENT_TYPE_RUN_CREATED
    assert created.run_created_attributes.agent == binding

    # Publish agent_v8 and move the tag: the existing run keeps its digest; a new run follows.
    registry_data.publish_all(stubs.registry, registry_data.coding_components("3"))
    v8 = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(
            definition=registry_data.coding_definition("agent_v8", apply_patch="apply_patch@3")
        ),
        timeout=10,
    ).agent_version.digest
    assert v8 != v7
    stubs.registry.SetTag(
        rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8, expected_digest=v7)
    )
    assert get_run(stubs, run.id).agent == binding
    later = stubs.run(stubs.thread().id, ref="coding_agent:prod")
    assert later.agent.agent_digest == v8 and later.agent.version_label == "agent_v8"
    # The worker is handed the bound definition, not what the tag points at now.
    got = stubs.acquire(filter=message_pb2.AcquireFilter(agent_ids=["coding_agent"]))
    assert got.run.id == run.id
    assert got.agent.agent_digest == v7 and got.agent.version_label == "agent_v7"
    assert got.run.agent == binding


def test_run_binds_labels_and_digests_without_a_tag(stubs: Stubs) -> None:
    digest = stubs.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref="coding_agent:prod"), timeout=10
    ).agent_version.digest
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    for ref in ("coding_agent@agent_v7", f"coding_agent@{digest}", digest):
        run = stubs.run(thread.id, ref=ref)
        assert run.agent.requested_ref == ref
        assert run.agent.agent_digest == digest
        assert run.agent.agent_id == "coding_agent"
        assert run.agent.version_label == "agent_v7"
        assert run.agent.resolved_via_tag == ""


def test_list_runs_filters_by_digest_tag_and_creation_time(stubs: Stubs) -> None:
    """ListRuns narrows to runs bound to one digest, created through one tag, or created in a
    time range (half-open: the start included, the end not); a page token is bound to them."""
    digest = stubs.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref="coding_agent:prod"), timeout=10
    ).agent_version.digest
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    tagged = stubs.run(thread.id, ref="coding_agent:prod")
    pinned = stubs.run(thread.id, ref="coding_agent@agent_v7")
    plain = stubs.run(thread.id, ref=PLAIN)

    def listed(**filters: Any) -> list[str]:
        request = pb.ListRunsRequest(thread_id=thread.id, **filters)
        return [r.id for r in stubs.runtime.ListRuns(request, timeout=10).runs]

    assert listed(agent_digest=digest) == [pinned.id, tagged.id]
    assert listed(agent_digest=plain.agent.agent_digest) == [plain.id]
    # The pinned run followed no tag; the plain agent's run followed its own prod.
    assert listed(agent_tag="prod") == [plain.id, tagged.id]
    assert listed(agent_tag="prod", agent_id="coding_agent") == [tagged.id]
    assert listed(agent_tag="prod", agent_id=plain.agent.agent_id) == [plain.id]
    assert listed(agent_tag="canary") == []
    # Across every thread: only runs bound to the digest.
    everywhere = stubs.runtime.ListRuns(
        pb.ListRunsRequest(agent_digest=digest, page_size=1000), timeout=10
    ).runs
    assert {tagged.id, pinned.id} <= {r.id for r in everywhere}
    assert {r.agent.agent_digest for r in everywhere} == {digest}

    assert listed(create_time_start=pinned.create_time) == [plain.id, pinned.id]
    assert listed(create_time_end=pinned.create_time) == [tagged.id]
    assert listed(create_time_start=pinned.create_time, create_time_end=plain.create_time) == [
        pinned.id
    ]

    # A page token is for the filters it was issued with.
    first = stubs.runtime.ListRuns(
        pb.ListRunsRequest(thread_id=thread.id, agent_digest=digest, page_size=1), timeout=10
    )
    assert [r.id for r in first.runs] == [pinned.id] and first.next_page_token
    second = stubs.runtime.ListRuns(
        pb.ListRunsRequest(
            thread_id=thread.id, agent_digest=digest, page_size=1, page_token=first.next_page_token
        ),
        timeout=10,
    )
    assert [r.id for r in second.runs] == [tagged.id]
    moved = rpc_error(
        lambda: stubs.runtime.ListRuns(
            pb.ListRunsRequest(
                thread_id=thread.id, agent_tag="prod", page_token=first.next_page_token
            ),
            timeout=10,
        )
    )
    assert moved.code() == grpc.StatusCode.INVALID_ARGUMENT and fields(moved) == {"page_token"}


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"agent_digest": "sha256:abc"}, "agent_digest"),
        ({"agent_digest": "SHA256:" + "a" * 64}, "agent_digest"),
        ({"agent_tag": "no spaces"}, "agent_tag"),
        ({"agent_tag": "x" * 129}, "agent_tag"),
    ],
)
def test_list_runs_refuses_a_filter_that_cannot_match_naming_it(
    stubs: Stubs, filters: dict[str, str], field: str
) -> None:
    error = rpc_error(lambda: stubs.runtime.ListRuns(pb.ListRunsRequest(**filters), timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fields(error) == {field}


def test_list_runs_refuses_a_time_range_that_ends_before_it_starts(stubs: Stubs) -> None:
    run = stubs.run(stubs.thread(E.CONCURRENCY_POLICY_ALLOW).id, ref=PLAIN)
    for end in (run.create_time, in_seconds(-60)):
        error = rpc_error(
            lambda end=end: stubs.runtime.ListRuns(
                pb.ListRunsRequest(create_time_start=run.create_time, create_time_end=end),
                timeout=10,
            )
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fields(error) == {"create_time_end"}


def test_create_run_is_idempotent_by_request_id(stubs: Stubs, database_url: str) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    first = stubs.run(thread.id, ref=PLAIN, request_id="req-1")
    before = db_counts(database_url)
    again = stubs.run(thread.id, ref=PLAIN, request_id="req-1")
    assert again == first
    assert db_counts(database_url) == before
    # Concurrent retries of one create make one run (and no error).
    with ThreadPoolExecutor(8) as pool:
        ids = set(
            pool.map(lambda _: stubs.run(thread.id, ref=PLAIN, request_id="req-2").id, range(8))
        )
    assert len(ids) == 1
    runs = stubs.runtime.ListRuns(pb.ListRunsRequest(thread_id=thread.id), timeout=10).runs
    assert sorted(r.id for r in runs) == sorted([first.id, *ids])


def test_locking_a_run_refreshes_what_the_session_already_loaded(
    stubs: Stubs, database_url: str
) -> None:
    """run_for_update hands back the run as it is under the lock, even when the session
    loaded it earlier and it changed meanwhile (a plain query would return the stale object)."""
    run_id = stubs.run(stubs.thread(enum_pb2.CONCURRENCY_POLICY_ALLOW).id, ref=PLAIN).id
    database = Database(database_url)

    class Undo(Exception):
        pass

    def job(session: Session) -> None:
        loaded = session.get(RunRow, run_id)
        assert loaded is not None
        before = loaded.priority
        session.execute(
            sa.update(RunRow)
            .where(RunRow.id == run_id)
            .values(priority=before + 7)
            .execution_options(synchronize_session=False)
        )
        assert loaded.priority == before  # the identity map still holds the old value
        locked = run_for_update(session, run_id)
        assert locked is loaded and locked.priority == before + 7
        raise Undo  # roll back: the run stays as it was

    try:
        with pytest.raises(Undo):
            database.write_sync(job)
    finally:
        database.dispose()
    assert get_run(stubs, run_id).priority == 0


# -- amendments ------------------------------------------------------------------------------


@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_amend_run_adds_a_revision_keeps_the_goal_and_writes_an_event(
    stubs: Stubs, database_url: str
) -> None:
    run = stubs.run(stubs.thread().id, ref=PLAIN)
    goal = run.goal
    assert run.input_revision == 1
    amended = stubs.runtime.AmendRun(
        pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(
                added_constraints=["do not touch db/"],
                added_acceptance_criteria=["lint is clean"],
                note="from review",
                input_revision=99,  # output only: ignored
                actor="mallory",  # output only: ignored
            ),
            actor="alice",
        ),
        timeout=10,
    ).run
    assert amended.input_revision == 2
    assert amended.goal == goal
    assert len(amended.amendments) == 1
    amendment = amended.amendments[0]
    assert list(amendment.added_constraints) == ["do not touch db/"]
    assert list(amendment.added_acceptance_criteria) == ["lint is clean"]
    assert amendment.note == "from review"
    assert amendment.input_revision == 2
    assert amendment.actor == "alice"
    assert amendment.HasField("create_time")
    event = run_events(stubs, run.id)[-1]
    assert event.event_type == E.EVENT_TYPE_RUN_AMENDED
    assert event.run_amended_attributes.amendment == amendment

    # Compare-and-swap on the revision.
    third = stubs.runtime.AmendRun(
        pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(note="again"),
            expected_input_revision=2,
        ),
        timeout=10,
    ).run
    assert third.input_revision == 3 and third.goal == goal
    before, counts = get_run(stubs, run.id), db_counts(database_url)
    error = rpc_error(
        stubs.runtime.AmendRun,
        pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(note="stale"),
            expected_input_revision=2,
        ),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.ABORTED
    assert reason(error) == "REVISION_MISMATCH"
    empty = rpc_error(
        stubs.runtime.AmendRun,
        pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment()),
        timeout=10,
    )
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert get_run(stubs, run.id) == before
    assert db_counts(database_url) == counts

    # A running worker sees the new revision on its next heartbeat.
    got = stubs.acquire()
    beat = stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=got.fence), timeout=10)
    assert beat.input_revision == 3

    # An ended run cannot be amended.
    stubs.finish(got.fence, COMPLETE)
    ended, counts = get_run(stubs, run.id), db_counts(database_url)
    error = rpc_error(
        stubs.runtime.AmendRun,
        pb.AmendRunRequest(run_id=run.id, amendment=message_pb2.Amendment(note="late")),
        timeout=10,
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(error) == "RUN_ENDED"
    assert get_run(stubs, run.id) == ended
    assert db_counts(database_url) == counts


def test_amend_run_is_idempotent_by_request_id(stubs: Stubs, database_url: str) -> None:
    run = stubs.run(stubs.thread().id, ref=PLAIN)
    request = pb.AmendRunRequest(
        run_id=run.id,
        amendment=message_pb2.Amendment(added_constraints=["once"]),
        expected_input_revision=1,
        request_id="amend-1",
    )
    first = stubs.runtime.AmendRun(request, timeout=10).run
    assert first.input_revision == 2
    counts = db_counts(database_url)
    # The retry returns the first result, even though its compare-and-swap would now fail.
    again = stubs.runtime.AmendRun(request, timeout=10).run
    assert again == first
    assert len(again.amendments) == 1
    assert db_counts(database_url) == counts
    other = stubs.runtime.AmendRun(
        pb.AmendRunRequest(
            run_id=run.id, amendment=message_pb2.Amendment(note="n"), request_id="amend-2"
        ),
        timeout=10,
    ).run
    assert other.input_revision == 3


# -- illegal transitions ---------------------------------------------------------------------


def assert_refused_unchanged(
    stubs: Stubs,
    database_url: str,
    run_id: str,
    call: Callable[[], Any],
    *,
    status_name: str,
    code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION,
    expected_reason: str | None = None,
) -> None:
    before, counts = get_run(stubs, run_id), db_counts(database_url)
    error = rpc_error(call)
    assert error.code() == code, error.details()
    info = error_details(error)["ErrorInfo"]
    if expected_reason:
        assert info.reason == expected_reason
    if code == grpc.StatusCode.FAILED_PRECONDITION and info.reason in (
        "ILLEGAL_TRANSITION",
        "RUN_ENDED",
    ):
        assert info.metadata["current_status"] == status_name
        assert status_name in error.details()
    assert get_run(stubs, run_id) == before
    assert db_counts(database_url) == counts


@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_illegal_transitions_are_refused_naming_the_state_and_change_nothing(
    stubs: Stubs, database_url: str
) -> None:
    rt = stubs.runtime
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)

    queued = stubs.run(thread.id, ref=PLAIN)
    assert_refused_unchanged(
        stubs,
        database_url,
        queued.id,
        lambda: rt.ResumeRun(pb.ResumeRunRequest(run_id=queued.id), timeout=10),
        status_name="QUEUED",
    )

    got = stubs.acquire()
    assert got.run.id == queued.id
    running = queued
    assert_refused_unchanged(
        stubs,
        database_url,
        running.id,
        lambda: rt.ResumeRun(pb.ResumeRunRequest(run_id=running.id), timeout=10),
        status_name="RUNNING",
    )
    # The worker may not acknowledge a stop nobody asked for, nor wait for a missing approval.
    for outcome in (
        E.ATTEMPT_OUTCOME_CANCELLED,
        E.ATTEMPT_OUTCOME_PAUSED,
        E.ATTEMPT_OUTCOME_WAITING_APPROVAL,
    ):
        assert_refused_unchanged(
            stubs,
            database_url,
            running.id,
            lambda outcome=outcome: stubs.finish(got.fence, outcome),
            status_name="RUNNING",
        )
    assert get_run(stubs, running.id).current_attempt_id == got.attempt.id
    # Being cancelled, it cannot be paused.
    rt.CancelRun(pb.CancelRunRequest(run_id=running.id), timeout=10)
    assert_refused_unchanged(
        stubs,
        database_url,
        running.id,
        lambda: rt.PauseRun(pb.PauseRunRequest(run_id=running.id), timeout=10),
        status_name="RUNNING",
    )
    stubs.finish(got.fence, E.ATTEMPT_OUTCOME_CANCELLED)

    done = stubs.run(thread.id, ref=PLAIN)
    stubs.finish(stubs.acquire().fence, COMPLETE)
    assert get_run(stubs, done.id).status == E.RUN_STATUS_COMPLETED
    for call in (
        lambda: rt.CancelRun(pb.CancelRunRequest(run_id=done.id), timeout=10),
        lambda: rt.PauseRun(pb.PauseRunRequest(run_id=done.id), timeout=10),
        lambda: rt.ResumeRun(pb.ResumeRunRequest(run_id=done.id), timeout=10),
    ):
        assert_refused_unchanged(
            stubs,
            database_url,
            done.id,
            call,
            status_name="COMPLETED",
            expected_reason="RUN_ENDED",
        )

    failed = stubs.run(thread.id, ref=PLAIN)
    stubs.finish(stubs.acquire().fence, E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    assert_refused_unchanged(
        stubs,
        database_url,
        failed.id,
        lambda: rt.CancelRun(pb.CancelRunRequest(run_id=failed.id), timeout=10),
        status_name="FAILED",
        expected_reason="RUN_ENDED",
    )


def test_repeated_stop_requests_return_the_run_unchanged(stubs: Stubs, database_url: str) -> None:
    rt = stubs.runtime
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    # Cancelling a CANCELLED run returns it unchanged (contract), and writes nothing.
    run = stubs.run(thread.id, ref=PLAIN)
    cancelled = rt.CancelRun(pb.CancelRunRequest(run_id=run.id, reason="no"), timeout=10).run
    assert cancelled.status == E.RUN_STATUS_CANCELLED
    counts = db_counts(database_url)
    again = rt.CancelRun(pb.CancelRunRequest(run_id=run.id, reason="again"), timeout=10).run
    assert again == cancelled
    assert db_counts(database_url) == counts

    # Pausing a paused run, and cancelling a run whose cancel is pending, change nothing.
    paused_run = stubs.run(thread.id, ref=PLAIN)
    paused = rt.PauseRun(pb.PauseRunRequest(run_id=paused_run.id), timeout=10).run
    assert paused.status == E.RUN_STATUS_PAUSED
    counts = db_counts(database_url)
    assert rt.PauseRun(pb.PauseRunRequest(run_id=paused_run.id), timeout=10).run == paused
    assert db_counts(database_url) == counts

    busy = stubs.run(thread.id, ref=PLAIN, priority=5)
    got = stubs.acquire()
    assert got.run.id == busy.id
    first = rt.CancelRun(pb.CancelRunRequest(run_id=busy.id), timeout=10).run
    assert first.cancel_requested and first.status == E.RUN_STATUS_RUNNING
    counts = db_counts(database_url)
    assert rt.CancelRun(pb.CancelRunRequest(run_id=busy.id), timeout=10).run == first
    assert db_counts(database_url) == counts


# -- bad input -------------------------------------------------------------------------------


def fields(error: grpc.RpcError) -> set[str]:
    return {v.field for v in error_details(error)["BadRequest"].field_violations}


def test_unknown_ids_are_not_found(stubs: Stubs, database_url: str) -> None:
    rt, wk = stubs.runtime, stubs.worker
    thread = stubs.thread()
    counts = db_counts(database_url)
    missing_run, missing_thread = (
        "run_01NOSUCHRUN0000000000000000",
        "thr_01NOSUCHTHREAD00000000000000",
    )
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("thread", lambda: rt.GetThread(pb.GetThreadRequest(thread_id=missing_thread), timeout=10)),
        ("run", lambda: rt.GetRun(pb.GetRunRequest(run_id=missing_run), timeout=10)),
        ("run", lambda: rt.CancelRun(pb.CancelRunRequest(run_id=missing_run), timeout=10)),
        ("run", lambda: rt.PauseRun(pb.PauseRunRequest(run_id=missing_run), timeout=10)),
        ("run", lambda: rt.ResumeRun(pb.ResumeRunRequest(run_id=missing_run), timeout=10)),
        (
            "run",
            lambda: rt.AmendRun(
                pb.AmendRunRequest(run_id=missing_run, amendment=message_pb2.Amendment(note="n")),
                timeout=10,
            ),
        ),
        ("run", lambda: rt.ListAttempts(pb.ListAttemptsRequest(run_id=missing_run), timeout=10)),
        (
            "run",
            lambda: list(rt.WatchRun(pb.WatchRunRequest(run_id=missing_run), timeout=10)),
        ),
        (
            "thread",
            lambda: list(
                rt.WatchThread(pb.WatchThreadRequest(thread_id=missing_thread), timeout=10)
            ),
        ),
        (
            "thread",
            lambda: rt.ListMessages(pb.ListMessagesRequest(thread_id=missing_thread), timeout=10),
        ),
        (
            "thread",
            lambda: rt.AppendMessage(
                pb.AppendMessageRequest(
                    thread_id=missing_thread, role=E.MESSAGE_ROLE_USER, content="hi"
                ),
                timeout=10,
            ),
        ),
        ("thread", lambda: stubs.run(missing_thread, ref=PLAIN)),
        ("run", lambda: stubs.run(thread.id, ref=PLAIN, parent_run_id=missing_run)),
        ("run", lambda: stubs.run(thread.id, ref=PLAIN, derived_from_run_id=missing_run)),
    ]
    for kind, call in calls:
        error = rpc_error(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND, (kind, error.details())
        resource = error_details(error)["ResourceInfo"]
        assert resource.resource_type == kind
        assert resource.resource_name in (missing_run, missing_thread)
    # A fence naming an unknown attempt is a lost lease, not a crash.
    fence = message_pb2.Fence(attempt_id="att_01NOSUCHATTEMPT000000000000", lease_epoch=1)
    error = rpc_error(wk.Heartbeat, wpb.HeartbeatRequest(fence=fence), timeout=10)
    assert error.code() == grpc.StatusCode.ABORTED and reason(error) == "LEASE_LOST"
    assert db_counts(database_url) == counts


def test_an_agent_reference_that_does_not_resolve_is_not_found_naming_it(
    stubs: Stubs, database_url: str
) -> None:
    thread = stubs.thread()
    counts = db_counts(database_url)
    for ref in (
        "coding_agent:nosuchtag",
        "coding_agent@agent_v99",
        "no_such_agent:prod",
        "sha256:" + "0" * 64,
        "coding_agent@sha256:" + "1" * 64,
    ):
        error = rpc_error(stubs.run, thread.id, ref=ref)
        assert error.code() == grpc.StatusCode.NOT_FOUND, ref
        assert ref in error.details()
        assert error_details(error)["ResourceInfo"].resource_name == ref
    assert db_counts(database_url) == counts


def test_bad_create_run_input_is_invalid_argument_naming_every_field(
    stubs: Stubs, database_url: str
) -> None:
    thread = stubs.thread()
    counts = db_counts(database_url)

    def create(**kwargs: Any) -> grpc.RpcError:
        request = pb.CreateRunRequest(
            thread_id=thread.id,
            agent_ref=PLAIN,
            goal=message_pb2.Goal(objective="fix it"),
        )
        for name, value in kwargs.items():
            if name == "goal":
                request.goal.CopyFrom(value)
            elif name == "budget":
                request.budget.CopyFrom(value)
            elif name == "deadline_time":
                request.deadline_time.CopyFrom(value)
            else:
                setattr(request, name, value)
        error = rpc_error(stubs.runtime.CreateRun, request, timeout=10)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        return error

    error = create(budget=message_pb2.Budget(max_steps=-1, max_model_tokens=-5, max_cost_usd=-0.5))
    assert fields(error) == {"budget.max_steps", "budget.max_model_tokens", "budget.max_cost_usd"}
    assert fields(create(deadline_time=in_seconds(-60))) == {"deadline_time"}
    assert fields(create(concurrency_policy=99)) == {"concurrency_policy"}
    assert fields(create(permission_ceiling=42)) == {"permission_ceiling"}
    assert fields(create(max_attempts=-1)) == {"max_attempts"}
    big = message_pb2.Goal(objective="x" * (64 * 1024 + 1))
    assert "goal" in fields(create(goal=big))
    assert fields(create(goal=message_pb2.Goal(objective=""))) == {"goal.objective"}
    assert "agent_ref" in fields(create(agent_ref="coding_agent@^1.0"))
    assert "agent_ref" in fields(create(agent_ref=""))
    # Several problems at once are all named.
    many = create(
        budget=message_pb2.Budget(max_steps=-1),
        deadline_time=in_seconds(-1),
        goal=message_pb2.Goal(objective=""),
    )
    assert fields(many) == {"budget.max_steps", "deadline_time", "goal.objective"}
    assert db_counts(database_url) == counts
    # The edge: a goal just under the limit is accepted.
    ok = stubs.run(thread.id, ref=PLAIN, request_id="fits")
    assert ok.status == E.RUN_STATUS_QUEUED


@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_other_bad_input_is_invalid_argument_and_changes_nothing(
    stubs: Stubs, database_url: str
) -> None:
    rt, wk = stubs.runtime, stubs.worker
    thread = stubs.thread(E.CONCURRENCY_POLICY_ALLOW)
    run = stubs.run(thread.id, ref=PLAIN)
    got = stubs.acquire()
    counts, before = db_counts(database_url), get_run(stubs, run.id)

    def invalid(call: Callable[[], Any]) -> set[str]:
        error = rpc_error(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        return fields(error)

    assert invalid(
        lambda: rt.CreateThread(pb.CreateThreadRequest(concurrency_policy=17), timeout=10)
    ) == {"concurrency_policy"}
    for role in (0, 9):
        assert invalid(
            lambda role=role: rt.AppendMessage(
                pb.AppendMessageRequest(thread_id=thread.id, role=role, content="x"), timeout=10
            )
        ) == {"role"}
    assert invalid(
        lambda: rt.AppendMessage(
            pb.AppendMessageRequest(thread_id=thread.id, role=E.MESSAGE_ROLE_USER), timeout=10
        )
    ) == {"content"}
    assert invalid(lambda: rt.ListRuns(pb.ListRunsRequest(statuses=[42]), timeout=10)) == {
        "statuses[0]"
    }
    assert invalid(lambda: rt.ListThreads(pb.ListThreadsRequest(page_size=-1), timeout=10)) == {
        "page_size"
    }
    assert invalid(
        lambda: list(rt.WatchRun(pb.WatchRunRequest(run_id=run.id, after_sequence=-1), timeout=10))
    ) == {"after_sequence"}
    assert invalid(
        lambda: list(rt.WatchRun(pb.WatchRunRequest(run_id=run.id, event_types=[99]), timeout=10))
    ) == {"event_types[0]"}
    assert invalid(
        lambda: list(
            rt.WatchThread(
                pb.WatchThreadRequest(thread_id=thread.id, after_cursor="garbage"), timeout=10
            )
        )
    ) == {"after_cursor"}
    assert invalid(lambda: stubs.finish(got.fence, 99)) == {"outcome"}
    assert invalid(lambda: stubs.finish(got.fence, E.ATTEMPT_OUTCOME_UNSPECIFIED)) == {"outcome"}
    assert invalid(
        lambda: stubs.finish(
            got.fence,
            E.ATTEMPT_OUTCOME_FAILED_RETRYABLE,
            error=message_pb2.AttemptError(error_class=77),
        )
    ) == {"error.error_class"}
    assert invalid(lambda: wk.Heartbeat(wpb.HeartbeatRequest(), timeout=10)) == {"fence"}
    assert invalid(lambda: wk.AcquireRun(wpb.AcquireRunRequest(worker_id=""), timeout=10)) == {
        "worker_id"
    }
    assert invalid(
        lambda: wk.AcquireRun(
            wpb.AcquireRunRequest(worker_id="w", wait=duration_pb2.Duration(seconds=-1)),
            timeout=10,
        )
    ) == {"wait"}
    assert invalid(
        lambda: wk.AcquireRun(
            wpb.AcquireRunRequest(worker_id="w", lease_ttl=duration_pb2.Duration(seconds=-3)),
            timeout=10,
        )
    ) == {"lease_ttl"}
    assert db_counts(database_url) == counts
    after = get_run(stubs, run.id)
    assert after == before
    assert after.current_attempt_id == got.attempt.id  # the refused finishes left it active
