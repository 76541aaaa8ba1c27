"""The protos' promises, one test per sentence: every sentence of a comment in
protos/agentrt/*/v1/*.proto that states a default, lists errors ("Errors: ...") or says which
status a run takes has a test here, named with the proto file and the sentence (the
``@sentence`` decorator), on both engines. tests/unit/test_contract_index.py scans the protos
and fails when such a sentence has no test here, or when a sentence here is no longer in
the protos (a changed promise must change its test).

Where a clause needs a fault to happen (the step writer dying, a COMMIT whose outcome is
unknown, a budget changed between the read and the write of a BeginStep, a 64 MiB blob), the
test names the suite that causes it instead of causing it again."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import duration_pb2, timestamp_pb2

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.audit.v1 import message_pb2 as amsg
from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from runtime_service.runtime_settings import RuntimeSettings
from tests import registry_data
from tests.runtime_support import Stubs, in_seconds
from tests.service.steps_support import (
    T,
    Worker,
    acquire,
    chunk,
    digest_of,
    expect,
    get_run,
    get_step,
    header,
    list_steps,
    publish_variant,
    put,
    put_blob,
    start,
)
from tests.support import rpc_error

RT = "agentrt/runtime/v1/runtime_service.proto"
WK = "agentrt/runtime/v1/worker_service.proto"
MS = "agentrt/runtime/v1/message.proto"
EN = "agentrt/runtime/v1/enum.proto"
RG = "agentrt/registry/v1/registry_service.proto"
AU = "agentrt/audit/v1/audit_service.proto"
AM = "agentrt/audit/v1/message.proto"

#: Test name -> (proto file, sentence): what each test of this module checks.
INDEX: dict[str, tuple[str, str]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def sentence(file: str, text: str) -> Callable[[F], F]:
    """Mark a test as the check of ``text``, a sentence of ``file``'s comments, word for
    word (line breaks as spaces)."""

    def mark(test: F) -> F:
        assert test.__name__ not in INDEX, test.__name__
        INDEX[test.__name__] = (file, text)
        return test

    return mark


INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
ABORTED = grpc.StatusCode.ABORTED
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MISSING_BLOB = "sha256:" + "0" * 64


def audit(stubs: Stubs) -> Any:
    return audit_service_pb2_grpc.AuditServiceStub(stubs.channel)


def threads(stubs: Stubs, n: int) -> None:
    for i in range(n):
        stubs.runtime.CreateThread(pb.CreateThreadRequest(title=f"t{i}"), timeout=T)


def model_steps(w: Worker, n: int) -> None:
    for i in range(n):
        w.model(f"m{i}")


def blocked(w: Worker) -> message_pb2.Fence:
    """A fence of ``w``'s attempt that the server no longer honours (its run cancelled)."""
    w.stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id), timeout=T)
    w.finish(E.ATTEMPT_OUTCOME_CANCELLED)
    return w.fence


# -- RuntimeService ---------------------------------------------------------------------------


@sentence(
    RT,
    'Errors use canonical gRPC codes with google.rpc details; ErrorInfo.domain is "agentrt".',
)
def test_errors_carry_error_info_of_domain_agentrt(stubs: Stubs) -> None:
    details = expect(NOT_FOUND, stubs.runtime.GetRun, pb.GetRunRequest(run_id="run_x"), timeout=T)
    assert details["ErrorInfo"].domain == "agentrt"
    assert details["ResourceInfo"].resource_name == "run_x"


@sentence(
    RT,
    "List RPCs: page_size 0 means the server default (100); larger values are clamped to "
    "the server maximum (1000).",
)
def test_list_default_page_size_is_100(stubs: Stubs) -> None:
    threads(stubs, 101)
    first = stubs.runtime.ListThreads(pb.ListThreadsRequest(), timeout=T)
    assert len(first.threads) == 100 and first.next_page_token
    # ListSteps too (it answered 60 steps with no token where 50 were promised).
    w = start(stubs)
    model_steps(w, 101)
    page = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=w.run_id), timeout=T)
    assert len(page.steps) == 100 and page.next_page_token
    # Larger than the maximum: served (as 1000), not refused.
    whole = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=w.run_id, page_size=5000), timeout=T)
    assert len(whole.steps) == 101 and not whole.next_page_token


@sentence(RT, "Errors: INVALID_ARGUMENT.")
def test_create_thread_errors(stubs: Stubs) -> None:
    expect(INVALID, stubs.runtime.CreateThread, pb.CreateThreadRequest(namespace="Not A Label"))


@sentence(RT, "Errors: NOT_FOUND.")
def test_get_errors(stubs: Stubs) -> None:
    # The sentence ends the comments of GetThread, GetRun and GetStep.
    expect(NOT_FOUND, stubs.runtime.GetThread, pb.GetThreadRequest(thread_id="thr_nope"))
    expect(NOT_FOUND, stubs.runtime.GetRun, pb.GetRunRequest(run_id="run_nope"))
    expect(NOT_FOUND, stubs.runtime.GetStep, pb.GetStepRequest(step_id="stp_nope"))


@sentence(
    RT,
    "Errors: NOT_FOUND (thread); INVALID_ARGUMENT (role unspecified, content and data both "
    "empty, run_id of another thread); RESOURCE_EXHAUSTED with "
    'ErrorInfo(reason="INPUT_TOO_LARGE", metadata "limit") when content and data together '
    "exceed the server limit (256 KiB; put large content in a blob).",
)
def test_append_message_errors(stubs: Stubs) -> None:
    thread = stubs.thread()
    other = stubs.thread()
    stubs.publish_plain_agent()
    run = stubs.run(other.id, ref="plain_agent:prod")
    user = E.MESSAGE_ROLE_USER

    def append(**kw: Any) -> Any:
        return stubs.runtime.AppendMessage(pb.AppendMessageRequest(**kw), timeout=T)

    expect(NOT_FOUND, append, thread_id="thr_nope", role=user, content="x")
    expect(INVALID, append, thread_id=thread.id, content="x")
    expect(INVALID, append, thread_id=thread.id, role=user)
    expect(INVALID, append, thread_id=thread.id, role=user, content="x", run_id=run.id)
    details = expect(
        EXHAUSTED,
        append,
        thread_id=thread.id,
        role=user,
        content="x" * (256 * 1024 + 1),
        reason="INPUT_TOO_LARGE",
    )
    assert details["ErrorInfo"].metadata["limit"] == str(256 * 1024)


@sentence(RT, "Errors: NOT_FOUND (thread).")
def test_list_messages_errors(stubs: Stubs) -> None:
    expect(NOT_FOUND, stubs.runtime.ListMessages, pb.ListMessagesRequest(thread_id="thr_nope"))


@sentence(
    RT,
    "Errors: NOT_FOUND (thread, parent or derived- from run, or an agent reference that "
    "resolves to nothing); INVALID_ARGUMENT (malformed reference, a range reference, empty "
    "objective, negative budget, deadline in the past, negative max_attempts); "
    'FAILED_PRECONDITION with ErrorInfo(reason="THREAD_BUSY", metadata "active_run_id") '
    "under REJECT.",
)
def test_create_run_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    thread = stubs.thread()

    def create(**kw: Any) -> Any:
        kw.setdefault("thread_id", thread.id)
        kw.setdefault("agent_ref", "coding_agent:prod")
        kw.setdefault("goal", message_pb2.Goal(objective="o"))
        return stubs.runtime.CreateRun(pb.CreateRunRequest(**kw), timeout=T)

    expect(NOT_FOUND, create, thread_id="thr_nope")
    expect(NOT_FOUND, create, parent_run_id="run_nope")
    expect(NOT_FOUND, create, derived_from_run_id="run_nope")
    expect(NOT_FOUND, create, agent_ref="coding_agent:nosuchtag")
    expect(INVALID, create, agent_ref="not a ref!")
    expect(INVALID, create, agent_ref="coding_agent@^1.0")
    expect(INVALID, create, goal=message_pb2.Goal(objective=""))
    expect(INVALID, create, budget=message_pb2.Budget(max_steps=-1))
    expect(INVALID, create, deadline_time=in_seconds(-3600))
    expect(INVALID, create, max_attempts=-1)
    busy = stubs.thread(E.CONCURRENCY_POLICY_REJECT)
    first = create(thread_id=busy.id).run
    details = expect(PRECONDITION, create, thread_id=busy.id, reason="THREAD_BUSY")
    assert details["ErrorInfo"].metadata["active_run_id"] == first.id


def _ended_run(stubs: Stubs) -> Any:
    w = start(stubs)
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    return w.run_id


@sentence(RT, "Errors: NOT_FOUND; FAILED_PRECONDITION (RUN_ENDED) for other terminal runs.")
def test_cancel_run_errors(stubs: Stubs) -> None:
    cancel = stubs.runtime.CancelRun
    expect(NOT_FOUND, cancel, pb.CancelRunRequest(run_id="run_nope"))
    expect(PRECONDITION, cancel, pb.CancelRunRequest(run_id=_ended_run(stubs)), reason="RUN_ENDED")


@sentence(
    RT,
    "Errors: NOT_FOUND; FAILED_PRECONDITION (RUN_ENDED; ILLEGAL_TRANSITION for a run "
    "WAITING_APPROVAL, or RUNNING with a cancel pending).",
)
def test_pause_run_errors(stubs: Stubs) -> None:
    pause = stubs.runtime.PauseRun
    expect(NOT_FOUND, pause, pb.PauseRunRequest(run_id="run_nope"))
    expect(PRECONDITION, pause, pb.PauseRunRequest(run_id=_ended_run(stubs)), reason="RUN_ENDED")
    waiting, _ = _waiting_for(stubs, 1)
    expect(
        PRECONDITION,
        pause,
        pb.PauseRunRequest(run_id=waiting.run_id),
        reason="ILLEGAL_TRANSITION",
    )
    w = start(stubs, publish=False)
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id), timeout=T)
    expect(PRECONDITION, pause, pb.PauseRunRequest(run_id=w.run_id), reason="ILLEGAL_TRANSITION")


@sentence(
    RT,
    "Errors: NOT_FOUND; FAILED_PRECONDITION (RUN_ENDED; ILLEGAL_TRANSITION for a run that "
    "is neither: QUEUED, WAITING_APPROVAL, or RUNNING without a pause pending).",
)
def test_resume_run_errors(stubs: Stubs) -> None:
    resume = stubs.runtime.ResumeRun
    expect(NOT_FOUND, resume, pb.ResumeRunRequest(run_id="run_nope"))
    expect(PRECONDITION, resume, pb.ResumeRunRequest(run_id=_ended_run(stubs)), reason="RUN_ENDED")
    waiting, _ = _waiting_for(stubs, 1)
    queued = stubs.run(stubs.thread().id)
    running = start(stubs, publish=False)
    for run_id in (queued.id, waiting.run_id, running.run_id):
        expect(
            PRECONDITION, resume, pb.ResumeRunRequest(run_id=run_id), reason="ILLEGAL_TRANSITION"
        )


@sentence(
    RT,
    "Errors: NOT_FOUND; INVALID_ARGUMENT (empty amendment); ABORTED with "
    'ErrorInfo(reason="REVISION_MISMATCH") when expected_input_revision is set and differs; '
    "FAILED_PRECONDITION (RUN_ENDED).",
)
def test_amend_run_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    note = message_pb2.Amendment(note="n")

    def amend(**kw: Any) -> Any:
        return stubs.runtime.AmendRun(pb.AmendRunRequest(**kw), timeout=T)

    expect(NOT_FOUND, amend, run_id="run_nope", amendment=note)
    expect(INVALID, amend, run_id=run.id, amendment=message_pb2.Amendment())
    expect(
        ABORTED,
        amend,
        run_id=run.id,
        amendment=note,
        expected_input_revision=run.input_revision + 5,
        reason="REVISION_MISMATCH",
    )
    ended = _ended_run(stubs)
    expect(PRECONDITION, amend, run_id=ended, amendment=note, reason="RUN_ENDED")


@sentence(
    RT,
    "Errors: NOT_FOUND; INVALID_ARGUMENT (kind unspecified; content and data both empty); "
    'RESOURCE_EXHAUSTED with ErrorInfo(reason="INPUT_TOO_LARGE", metadata "limit") when '
    "larger than the server limit (256 KiB); FAILED_PRECONDITION (RUN_ENDED).",
)
def test_send_input_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)

    def send(**kw: Any) -> Any:
        return stubs.runtime.SendInput(pb.SendInputRequest(**kw), timeout=T)

    steer = E.INPUT_KIND_STEER
    expect(NOT_FOUND, send, run_id="run_nope", kind=steer, content="x")
    expect(INVALID, send, run_id=run.id, content="x")
    expect(INVALID, send, run_id=run.id, kind=steer)
    details = expect(
        EXHAUSTED,
        send,
        run_id=run.id,
        kind=steer,
        content="x" * (256 * 1024 + 1),
        reason="INPUT_TOO_LARGE",
    )
    assert details["ErrorInfo"].metadata["limit"] == str(256 * 1024)
    expect(
        PRECONDITION, send, run_id=_ended_run(stubs), kind=steer, content="x", reason="RUN_ENDED"
    )


def _waiting_for(stubs: Stubs, approvals: int) -> tuple[Worker, list[Any]]:
    """A run of coding_agent WAITING_APPROVAL for ``approvals`` apply_patch calls."""
    w = start(stubs)
    steps = [w.tool("apply_patch", f"p{i}", patch=f"diff {i}").step for i in range(approvals)]
    assert {s.status for s in steps} == {E.STEP_STATUS_WAITING_APPROVAL}
    w.finish(E.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    return w, steps


def _resolve(
    stubs: Stubs, run_id: str, step_id: str, decision: Any = E.APPROVAL_DECISION_APPROVE, **kw: Any
) -> Any:
    kw.setdefault("approver", "alice")
    return stubs.runtime.ResolveApproval(
        pb.ResolveApprovalRequest(run_id=run_id, step_id=step_id, decision=decision, **kw),
        timeout=T,
    )


@sentence(
    RT,
    "APPROVE ends it SUCCEEDED, DENY ends it DENIED; either way the run leaves "
    "WAITING_APPROVAL once no approval is pending and is re-queued (next attempt reason "
    "RESUMED_AFTER_APPROVAL), unless it is PAUSED.",
)
@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_the_run_waits_until_every_approval_is_decided(stubs: Stubs) -> None:
    w, (first, second) = _waiting_for(stubs, 2)
    one = _resolve(stubs, w.run_id, first.id)
    assert one.step.status == E.STEP_STATUS_SUCCEEDED
    # One of two decided: still waiting (it was re-queued here).
    assert one.run.status == E.RUN_STATUS_WAITING_APPROVAL
    assert not stubs.acquire(wait=0.1).HasField("run")
    two = _resolve(stubs, w.run_id, second.id, E.APPROVAL_DECISION_DENY)
    assert two.step.status == E.STEP_STATUS_DENIED
    assert two.run.status == E.RUN_STATUS_QUEUED
    again = stubs.acquire()
    assert again.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL
    # A run paused with an approval still pending stays paused when it is decided.
    p = start(stubs, publish=False)
    only = p.tool("apply_patch", "p", patch="d").step
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=p.run_id), timeout=T)
    assert p.finish(E.ATTEMPT_OUTCOME_PAUSED).run.status == E.RUN_STATUS_PAUSED
    assert _resolve(stubs, p.run_id, only.id).run.status == E.RUN_STATUS_PAUSED


@sentence(
    RT,
    "Errors: NOT_FOUND (run or step); INVALID_ARGUMENT (decision unspecified, empty "
    "approver, step not an approval of this run); FAILED_PRECONDITION (APPROVAL_RESOLVED "
    "when already resolved with another decision, or RUN_ENDED).",
)
def test_resolve_approval_errors(stubs: Stubs) -> None:
    w, (step,) = _waiting_for(stubs, 1)
    ended, (pending,) = _waiting_for(stubs, 1)
    expect(NOT_FOUND, _resolve, stubs, "run_nope", step.id)
    expect(NOT_FOUND, _resolve, stubs, w.run_id, "stp_nope")
    expect(INVALID, _resolve, stubs, w.run_id, step.id, E.APPROVAL_DECISION_UNSPECIFIED)
    expect(INVALID, _resolve, stubs, w.run_id, step.id, approver="")
    [of_other_run] = list_steps(stubs, ended.run_id)
    expect(INVALID, _resolve, stubs, w.run_id, of_other_run.id)
    _resolve(stubs, w.run_id, step.id)
    expect(
        PRECONDITION,
        _resolve,
        stubs,
        w.run_id,
        step.id,
        E.APPROVAL_DECISION_DENY,
        reason="APPROVAL_RESOLVED",
    )
    stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=ended.run_id), timeout=T)
    expect(PRECONDITION, _resolve, stubs, ended.run_id, pending.id, reason="RUN_ENDED")


@sentence(RT, "Errors: NOT_FOUND (run).")
def test_list_attempts_and_steps_errors(stubs: Stubs) -> None:
    # The sentence ends the comments of ListAttempts and ListSteps.
    expect(NOT_FOUND, stubs.runtime.ListAttempts, pb.ListAttemptsRequest(run_id="run_nope"))
    expect(NOT_FOUND, stubs.runtime.ListSteps, pb.ListStepsRequest(run_id="run_nope"))


@sentence(
    RT,
    "Errors: INVALID_ARGUMENT (a status, digest or tag that is not one; a time range that "
    "ends before it starts).",
)
def test_list_runs_errors(stubs: Stubs) -> None:
    call = stubs.runtime.ListRuns
    expect(INVALID, call, pb.ListRunsRequest(statuses=[99]))
    expect(INVALID, call, pb.ListRunsRequest(agent_digest="sha256:nope"))
    expect(INVALID, call, pb.ListRunsRequest(agent_tag="no tag"))
    start = timestamp_pb2.Timestamp(seconds=2_000_000_000)
    expect(INVALID, call, pb.ListRunsRequest(create_time_start=start, create_time_end=start))


@sentence(
    RT,
    "Errors: INVALID_ARGUMENT (empty or over-long name; the query refused as ListRuns would "
    "refuse it).",
)
def test_save_view_errors(stubs: Stubs) -> None:
    def save(name: str, **query: Any) -> Any:
        view = message_pb2.SavedView(name=name, query=message_pb2.RunsQuery(**query))
        return stubs.runtime.SaveView(pb.SaveViewRequest(view=view), timeout=T)

    expect(INVALID, save, "")
    expect(INVALID, save, "x" * 101)
    expect(INVALID, save, "mine", statuses=[99])
    expect(INVALID, save, "mine", agent_digest="sha256:nope")


@sentence(
    RT,
    "Errors: NOT_FOUND (the caller has no view of that name); INVALID_ARGUMENT (empty name).",
)
def test_delete_view_errors(stubs: Stubs) -> None:
    call = stubs.runtime.DeleteView
    expect(NOT_FOUND, call, pb.DeleteViewRequest(name="no such view"))
    expect(INVALID, call, pb.DeleteViewRequest(name=""))


@sentence(RT, "Errors: INVALID_ARGUMENT (neither or both of run_id and thread_id); NOT_FOUND.")
def test_list_artifacts_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    thread = stubs.thread()
    run = stubs.run(thread.id)
    call = stubs.runtime.ListArtifacts
    expect(INVALID, call, pb.ListArtifactsRequest())
    expect(INVALID, call, pb.ListArtifactsRequest(run_id=run.id, thread_id=thread.id))
    expect(NOT_FOUND, call, pb.ListArtifactsRequest(run_id="run_nope"))
    expect(NOT_FOUND, call, pb.ListArtifactsRequest(thread_id="thr_nope"))


def _first(stream: Any) -> Any:
    for response in stream:
        return response
    return None


@sentence(RT, "Errors: NOT_FOUND; INVALID_ARGUMENT (negative after_sequence).")
def test_watch_run_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    watch = stubs.runtime.WatchRun
    expect(NOT_FOUND, lambda: _first(watch(pb.WatchRunRequest(run_id="run_nope"), timeout=T)))
    expect(
        INVALID,
        lambda: _first(watch(pb.WatchRunRequest(run_id=run.id, after_sequence=-1), timeout=T)),
    )


@sentence(RT, "Errors: NOT_FOUND; INVALID_ARGUMENT (malformed cursor).")
def test_watch_thread_errors(stubs: Stubs) -> None:
    thread = stubs.thread()
    watch = stubs.runtime.WatchThread
    expect(NOT_FOUND, lambda: _first(watch(pb.WatchThreadRequest(thread_id="thr_nope"), timeout=T)))
    expect(
        INVALID,
        lambda: _first(
            watch(pb.WatchThreadRequest(thread_id=thread.id, after_cursor="!!"), timeout=T)
        ),
    )


@sentence(
    RT,
    "Errors: INVALID_ARGUMENT (first message not a header, a second header, byte count "
    "differs from header.size, content does not match expected_digest); RESOURCE_EXHAUSTED "
    'with ErrorInfo(reason="BLOB_TOO_LARGE") when size exceeds the server limit (default 64 '
    'MiB), "BLOB_QUOTA_EXCEEDED" (all blobs) or "NAMESPACE_BLOB_QUOTA_EXCEEDED" (the '
    "namespace's, default 2 GiB).",
)
def test_put_blob_errors(stubs: Stubs) -> None:
    expect(INVALID, put, stubs, chunk(b"x"))
    expect(INVALID, put, stubs, header(1), header(1), chunk(b"x"))
    expect(INVALID, put, stubs, header(2), chunk(b"x"))
    expect(INVALID, put, stubs, header(1, expected=digest_of(b"y")), chunk(b"x"))
    details = expect(EXHAUSTED, put, stubs, header(64 * 1024 * 1024 + 1), reason="BLOB_TOO_LARGE")
    assert details["ErrorInfo"].metadata["limit"] == str(64 * 1024 * 1024)
    # The quotas' refusals, with small quotas: test_blob_limits.py; their defaults:
    settings = RuntimeSettings()
    assert settings.namespace_blob_quota_bytes == 2 * 1024 * 1024 * 1024


@sentence(
    RT,
    "Errors: NOT_FOUND (also when only another namespace holds the content); "
    "INVALID_ARGUMENT (malformed digest).",
)
def test_get_blob_errors(stubs: Stubs) -> None:
    blob = put_blob(stubs, b"held by default").blob

    def get(**kw: Any) -> Any:
        return list(stubs.runtime.GetBlob(pb.GetBlobRequest(**kw), timeout=T))

    expect(NOT_FOUND, get, digest=digest_of(b"never uploaded"))
    expect(NOT_FOUND, get, digest=blob.digest, namespace="elsewhere")
    expect(INVALID, get, digest="sha256:xyz")


@sentence(RT, "Default policy for runs of this thread; UNSPECIFIED means REJECT.")
def test_a_thread_created_without_a_policy_rejects(stubs: Stubs) -> None:
    thread = stubs.runtime.CreateThread(pb.CreateThreadRequest(), timeout=T).thread
    assert thread.concurrency_policy == E.CONCURRENCY_POLICY_REJECT
    stubs.publish_agent()
    stubs.run(thread.id)
    expect(PRECONDITION, stubs.run, thread.id, reason="THREAD_BUSY")


@sentence(RT, "The namespace the thread lives in (a DNS label; `default` if empty).")
def test_a_thread_without_a_namespace_is_in_default(stubs: Stubs) -> None:
    thread = stubs.runtime.CreateThread(pb.CreateThreadRequest(), timeout=T).thread
    assert thread.namespace == "default"
    expect(INVALID, stubs.runtime.CreateThread, pb.CreateThreadRequest(namespace="Not_A_Label"))


@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
@sentence(RT, "Default 0; negative allowed.")
def test_priority_defaults_to_zero_and_may_be_negative(stubs: Stubs) -> None:
    stubs.publish_agent()
    low = stubs.run(stubs.thread(E.CONCURRENCY_POLICY_ALLOW).id, priority=-5)
    plain = stubs.run(stubs.thread(E.CONCURRENCY_POLICY_ALLOW).id)
    assert (plain.priority, low.priority) == (0, -5)
    assert stubs.acquire().run.id == plain.id  # higher first, though created later


@sentence(RT, "0 means the server default (3).")
def test_max_attempts_defaults_to_three(stubs: Stubs) -> None:
    stubs.publish_agent()
    assert stubs.run(stubs.thread().id).max_attempts == 3


@sentence(RT, "The namespace it was uploaded to (`default` if empty).")
def test_get_blob_without_a_namespace_reads_default(stubs: Stubs) -> None:
    uploaded = put_blob(stubs, b"in default").blob
    [first, *_] = list(stubs.runtime.GetBlob(pb.GetBlobRequest(digest=uploaded.digest), timeout=T))
    assert first.blob.digest == uploaded.digest


@sentence(RT, "A run without an active attempt becomes CANCELLED at once.")
def test_a_run_without_an_attempt_is_cancelled_at_once(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    cancelled = stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=T).run
    assert cancelled.status == E.RUN_STATUS_CANCELLED


@sentence(
    RT,
    "A QUEUED run becomes PAUSED at once; a RUNNING one gets pause_requested and becomes "
    "PAUSED when its worker checkpoints and acknowledges.",
)
def test_pause_at_once_or_when_acknowledged(stubs: Stubs) -> None:
    stubs.publish_agent()
    queued = stubs.run(stubs.thread().id)
    pause = stubs.runtime.PauseRun
    assert pause(pb.PauseRunRequest(run_id=queued.id), timeout=T).run.status == E.RUN_STATUS_PAUSED
    w = start(stubs, publish=False)
    asked = pause(pb.PauseRunRequest(run_id=w.run_id), timeout=T).run
    assert asked.status == E.RUN_STATUS_RUNNING and asked.pause_requested
    state = put_blob(stubs, b"state").blob.digest
    stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=w.fence, state_ref=state), timeout=T
    )
    assert w.finish(E.ATTEMPT_OUTCOME_PAUSED).run.status == E.RUN_STATUS_PAUSED


@sentence(
    RT,
    "Resumes a run: a PAUSED run is re-queued (its next attempt has reason "
    "RESUMED_AFTER_PAUSE and resumes from the latest checkpoint); a run whose pause was "
    "requested but not yet acknowledged has the request cleared.",
)
def test_resume_requeues_or_clears_the_request(stubs: Stubs) -> None:
    w = start(stubs)
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=w.run_id), timeout=T)
    state = put_blob(stubs, b"state").blob.digest
    checkpoint = stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=w.fence, state_ref=state), timeout=T
    ).checkpoint
    w.finish(E.ATTEMPT_OUTCOME_PAUSED)
    resumed = stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=w.run_id), timeout=T).run
    assert resumed.status == E.RUN_STATUS_QUEUED
    again = stubs.acquire()
    assert again.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_PAUSE
    assert again.resume_from.id == checkpoint.id
    stubs.runtime.PauseRun(pb.PauseRunRequest(run_id=w.run_id), timeout=T)
    cleared = stubs.runtime.ResumeRun(pb.ResumeRunRequest(run_id=w.run_id), timeout=T).run
    assert cleared.status == E.RUN_STATUS_RUNNING and not cleared.pause_requested


@sentence(RT, "Inputs still pending when the run ends become DISCARDED.")
def test_pending_inputs_are_discarded_when_the_run_ends(stubs: Stubs, database_url: str) -> None:
    w = start(stubs)
    sent = stubs.runtime.SendInput(
        pb.SendInputRequest(run_id=w.run_id, kind=E.INPUT_KIND_FOLLOW_UP, content="later"),
        timeout=T,
    ).input
    assert sent.status == E.INPUT_STATUS_PENDING
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    # No RPC lists a run's inputs: read the ledger.
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            status = conn.execute(
                sa.text("SELECT status FROM runtime_inputs WHERE id = :id"), {"id": sent.id}
            ).scalar_one()
    finally:
        engine.dispose()
    assert status == "DISCARDED"


# -- WorkerService ----------------------------------------------------------------------------


def _duration(seconds: float) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))


@sentence(WK, "Errors: INVALID_ARGUMENT (empty worker_id, negative durations).")
def test_acquire_run_errors(stubs: Stubs) -> None:
    acquire_run = stubs.worker.AcquireRun
    expect(INVALID, acquire_run, wpb.AcquireRunRequest(), timeout=T)
    expect(INVALID, acquire_run, wpb.AcquireRunRequest(worker_id="w", wait=_duration(-1)))
    expect(INVALID, acquire_run, wpb.AcquireRunRequest(worker_id="w", lease_ttl=_duration(-1)))


@sentence(
    WK,
    "If the caller disconnects after the server acquired, the lease simply expires and the "
    "attempt becomes LOST.",
)
@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_an_acquired_attempt_nobody_works_on_becomes_lost(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id)
    got = stubs.acquire(ttl=1)  # (its worker never calls again)
    deadline = time.monotonic() + 30
    while get_run(stubs, run.id).status != E.RUN_STATUS_QUEUED:
        assert time.monotonic() < deadline, "the lease was not reaped"
        time.sleep(0.1)
    attempts = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run.id), timeout=T)
    assert [(a.id, a.status) for a in attempts.attempts] == [
        (got.attempt.id, E.ATTEMPT_STATUS_LOST)
    ]


@sentence(WK, "Errors: ABORTED (LEASE_LOST), also when the lease already expired.")
def test_heartbeat_errors(stubs: Stubs) -> None:
    stubs.publish_agent()
    stubs.run(stubs.thread().id)
    got = stubs.acquire(ttl=1)
    time.sleep(1.2)  # past the lease, reaped or not
    expect(
        ABORTED,
        stubs.worker.Heartbeat,
        wpb.HeartbeatRequest(fence=got.fence),
        timeout=T,
        reason="LEASE_LOST",
    )


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); FAILED_PRECONDITION (TURN_OPEN) when another turn of the "
    "attempt is open.",
)
def test_begin_turn_errors(stubs: Stubs) -> None:
    w = start(stubs)  # a turn is open
    expect(PRECONDITION, w.begin_turn, reason="TURN_OPEN")
    expect(
        ABORTED,
        stubs.worker.BeginTurn,
        wpb.BeginTurnRequest(fence=blocked(w)),
        timeout=T,
        reason="LEASE_LOST",
    )


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); NOT_FOUND (turn); FAILED_PRECONDITION (TURN_NOT_OPEN: a "
    "turn of another attempt; STEPS_OPEN: a step of the turn still STARTED).",
)
def test_end_turn_errors(stubs: Stubs) -> None:
    w = start(stubs)
    expect(NOT_FOUND, w.end_turn, "trn_nope")
    other = start(stubs, publish=False)
    expect(NOT_FOUND, w.end_turn, other.turn_id)  # another run's turn
    w.model("open")
    expect(PRECONDITION, w.end_turn, reason="STEPS_OPEN")
    # The run's next attempt, given the turn of the first.
    earlier = w.turn_id
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    other.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    later = acquire(stubs)
    assert later.run_id == w.run_id
    expect(PRECONDITION, later.end_turn, earlier, reason="TURN_NOT_OPEN")
    expect(
        ABORTED,
        stubs.worker.EndTurn,
        wpb.EndTurnRequest(fence=blocked(later), turn_id=later.turn_id),
        timeout=T,
        reason="LEASE_LOST",
    )


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); INVALID_ARGUMENT (type APPROVAL_REQUEST or CHECKPOINT, "
    "details not matching type, a check not in the completion policy or one the runtime "
    "evaluates itself: BoundAgent.runtime_checks); FAILED_PRECONDITION "
    '("TURN_NOT_OPEN": the turn is not the open turn of this attempt; "NO_MODEL_CANDIDATE" '
    'when the model policy has no fallback left, "BLOB_MISSING"); RESOURCE_EXHAUSTED with '
    'ErrorInfo(reason="BUDGET_EXCEEDED", metadata "budget") when the step would exceed the '
    "run's budget; the run then ends FAILED (BUDGET_EXCEEDED), committed before the error is "
    'returned; ABORTED ("BUDGET_CHANGED") when the run\'s budget changed meanwhile: begin it '
    'again; RESOURCE_EXHAUSTED with ErrorInfo(reason="FAILED_STEP_LIMIT", metadata '
    '"failed_in_a_row", "limit") when the attempt\'s last 20 steps all FAILED: the runtime has '
    "ended the attempt FAILED (retryable), committed before the error is returned, and the run "
    "is retried if it has attempts left; UNAVAILABLE (STEP_WRITER_STOPPED, or "
    "COMMIT_OUTCOME_UNKNOWN when the database "
    "connection broke during the commit) when the server could not finish the call and does "
    "not know whether the step was recorded: retry with the same idempotency_key.",
)
@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_begin_step_errors(stubs: Stubs) -> None:
    w = start(stubs)
    spec = message_pb2.ModelCallSpec()
    expect(INVALID, w.begin, type=E.STEP_TYPE_APPROVAL_REQUEST, model_call=spec)
    expect(INVALID, w.begin, type=E.STEP_TYPE_CHECKPOINT, model_call=spec)
    expect(
        INVALID,
        w.begin,
        type=E.STEP_TYPE_TOOL_CALL,
        model_call=spec,
    )
    expect(
        INVALID,
        w.begin,
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="not-a-check"),
    )
    # A check the runtime evaluates itself cannot be attested by a worker.
    checked = rmsg.ComponentDraft(
        kind=renum.COMPONENT_KIND_COMPLETION_POLICY,
        name="runtime-checked",
        version="1",
        spec=rmsg.ComponentSpec(
            completion_policy=rmsg.CompletionPolicySpec(
                checks=[
                    rmsg.CompletionCheck(
                        name="nothing-open",
                        condition=renum.COMPLETION_CONDITION_NO_OPEN_STEPS,
                    )
                ]
            )
        ),
    )
    publish_variant(stubs, "checked_agent", completion_policy=checked)
    stubs.run(stubs.thread().id, ref="checked_agent@v1")
    c = acquire(stubs)
    assert list(c.acquired.agent.runtime_checks) == ["nothing-open"]
    expect(
        INVALID,
        c.begin,
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="nothing-open"),
    )
    expect(
        PRECONDITION,
        w.begin,
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=spec,
        turn_id="trn_x",
        reason="TURN_NOT_OPEN",
    )
    # No candidate left: the last candidate of a policy rate-limited, its context over the
    # primary's limit.
    tight = rmsg.ComponentDraft(
        kind=renum.COMPONENT_KIND_MODEL_POLICY,
        name="tight",
        version="1",
        spec=rmsg.ComponentSpec(
            model_policy=rmsg.ModelPolicySpec(
                candidates=[
                    rmsg.ModelCandidate(
                        name="only", provider="p", model_id="o-1", max_context_tokens=10
                    )
                ]
            )
        ),
    )
    publish_variant(stubs, "tight_agent", model_policy=tight)
    stubs.run(stubs.thread().id, ref="tight_agent@v1")
    t = acquire(stubs)
    assert t.acquired.run.agent.agent_id == "tight_agent"
    expect(PRECONDITION, t.model, estimated_input_tokens=11, reason="NO_MODEL_CANDIDATE")
    expect(
        PRECONDITION,
        w.begin,
        type=E.STEP_TYPE_MODEL_CALL,
        input_ref=MISSING_BLOB,
        model_call=spec,
        reason="BLOB_MISSING",
    )
    budget = start(stubs, publish=False, budget=message_pb2.Budget(max_steps=1))
    budget.model("one")
    details = expect(EXHAUSTED, budget.model, "two", reason="BUDGET_EXCEEDED")
    assert details["ErrorInfo"].metadata["budget"] == "max_steps"
    assert get_run(stubs, budget.run_id).status == E.RUN_STATUS_FAILED
    expect(
        ABORTED,
        w.begin,
        fence=blocked(w),
        type=E.STEP_TYPE_MODEL_CALL,
        model_call=spec,
        reason="LEASE_LOST",
    )
    # FAILED_STEP_LIMIT: test_failed_step_limit.py (the attempt ended, the run re-queued or
    # exhausted, the fence gone).
    # BUDGET_CHANGED needs a budget amended between the read and the write of the call;
    # UNAVAILABLE: test_step_process.py and test_step_process_supervision.py (the step
    # writer dies mid-call), test_database_faults.py (a COMMIT whose outcome is unknown).


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); NOT_FOUND (step); FAILED_PRECONDITION (STEP_ENDED: the "
    "step already ended with another outcome, or is not a step a worker ends, such as an "
    "approval; STEP_OF_OTHER_ATTEMPT: not of this attempt); UNAVAILABLE (STEP_WRITER_STOPPED, "
    "COMMIT_OUTCOME_UNKNOWN): the outcome may or may not be recorded, repeat the call.",
)
def test_end_step_errors(stubs: Stubs) -> None:
    w = start(stubs)
    expect(NOT_FOUND, w.end, "stp_nope")
    step = w.model("m").step
    w.end(step.id)
    expect(PRECONDITION, w.end, step.id, E.STEP_STATUS_FAILED, reason="STEP_ENDED")
    approval = w.tool("apply_patch", "p", patch="d").step
    expect(PRECONDITION, w.end, approval.id, reason="STEP_ENDED")
    # A step the run's earlier attempt began, ended by the next one.
    left = w.model("left open").step
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    later = acquire(stubs)
    assert later.run_id == w.run_id
    expect(PRECONDITION, later.end, left.id, reason="STEP_ENDED")  # (ended CANCELLED)
    mine = later.model("mine").step
    expect(ABORTED, w.end, mine.id, fence=w.fence, reason="LEASE_LOST")
    # STEP_OF_OTHER_ATTEMPT cannot be reached through the API today: an attempt that ends,
    # however it ends (here its lease runs out), ends its STARTED steps CANCELLED, so a step
    # of another attempt of the run has always ended (STEP_ENDED). The rule itself is held
    # by tests/unit/test_step_rules.py::test_end_refusals_and_repeats.
    stubs.run(stubs.thread().id)
    gone = acquire(stubs, ttl=1)
    open_step = gone.model("open").step
    deadline = time.monotonic() + 30
    while get_run(stubs, gone.run_id).status != E.RUN_STATUS_QUEUED:
        assert time.monotonic() < deadline, "the lease was not reaped"
        time.sleep(0.1)
    successor = acquire(stubs)
    assert successor.run_id == gone.run_id
    expect(PRECONDITION, successor.end, open_step.id, reason="STEP_ENDED")
    # UNAVAILABLE: test_step_process.py, test_step_process_supervision.py.


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); INVALID_ARGUMENT (after_sequence beyond the run's last "
    "step); FAILED_PRECONDITION (BLOB_MISSING).",
)
def test_write_checkpoint_errors(stubs: Stubs) -> None:
    w = start(stubs)
    state = put_blob(stubs, b"state").blob.digest

    def checkpoint(**kw: Any) -> Any:
        kw.setdefault("fence", w.fence)
        kw.setdefault("state_ref", state)
        return stubs.worker.WriteCheckpoint(wpb.WriteCheckpointRequest(**kw), timeout=T)

    expect(INVALID, checkpoint, after_sequence=5)
    expect(PRECONDITION, checkpoint, state_ref=MISSING_BLOB, reason="BLOB_MISSING")
    expect(ABORTED, checkpoint, fence=blocked(w), reason="LEASE_LOST")


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST); NOT_FOUND (step); INVALID_ARGUMENT (empty name, step of "
    "another attempt); FAILED_PRECONDITION (BLOB_MISSING).",
)
def test_create_artifact_errors(stubs: Stubs) -> None:
    w = start(stubs)
    blob = put_blob(stubs, b"patch").blob.digest
    step = w.model("m").step

    def artifact(**kw: Any) -> Any:
        kw.setdefault("fence", w.fence)
        kw.setdefault("step_id", step.id)
        kw.setdefault("name", "patch")
        kw.setdefault("blob_digest", blob)
        return stubs.worker.CreateArtifact(wpb.CreateArtifactRequest(**kw), timeout=T)

    expect(NOT_FOUND, artifact, step_id="stp_nope")
    expect(INVALID, artifact, name="")
    expect(PRECONDITION, artifact, blob_digest=MISSING_BLOB, reason="BLOB_MISSING")
    other = start(stubs, publish=False)
    expect(NOT_FOUND, artifact, step_id=other.model("theirs").step.id)  # another run's
    other.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    w.end(step.id)
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    later = acquire(stubs)
    assert later.run_id == w.run_id
    expect(INVALID, artifact, fence=later.fence, step_id=step.id)  # an earlier attempt's
    expect(ABORTED, artifact, fence=blocked(later), step_id=step.id, reason="LEASE_LOST")


@sentence(
    WK,
    "Errors: ABORTED (LEASE_LOST, also for a different outcome after the attempt ended); "
    'FAILED_PRECONDITION with ErrorInfo reason "STEPS_OPEN" or "INPUTS_PENDING" for '
    "SUCCEEDED_COMPLETE_RUN while steps are STARTED or inputs undelivered; reason "
    '"COMPLETION_CHECKS_MISSING" (metadata "missing_checks", comma separated, plus a '
    "PreconditionFailure violation per check) for SUCCEEDED_COMPLETE_RUN while a "
    "worker-attested check of the bound completion policy is not attested (no "
    "COMPLETION_CHECK step of it ended, or its latest failed retryable) and none has failed "
    'for good; reason "NO_STOP_REQUESTED" for CANCELLED / PAUSED without a request, '
    '"NO_APPROVAL_PENDING" for WAITING_APPROVAL without an approval step in this attempt.',
)
def test_finish_attempt_errors(stubs: Stubs) -> None:
    w = start(stubs)
    complete = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN
    step = w.model("m").step
    expect(PRECONDITION, w.finish, complete, reason="STEPS_OPEN")
    w.end(step.id)
    details = expect(PRECONDITION, w.finish, complete, reason="COMPLETION_CHECKS_MISSING")
    missing = details["ErrorInfo"].metadata["missing_checks"].split(",")
    assert sorted(missing) == ["diff-reviewed", "tests-pass"]
    assert [v.subject for v in details["PreconditionFailure"].violations] == missing
    # A check whose latest step failed retryable is still only missing.
    begun = w.begin(
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="tests-pass"),
    ).step
    w.end(begun.id, E.STEP_STATUS_FAILED, retryable=True)
    details = expect(PRECONDITION, w.finish, complete, reason="COMPLETION_CHECKS_MISSING")
    assert sorted(details["ErrorInfo"].metadata["missing_checks"].split(",")) == missing
    stubs.runtime.SendInput(
        pb.SendInputRequest(run_id=w.run_id, kind=E.INPUT_KIND_FOLLOW_UP, content="more"),
        timeout=T,
    )
    expect(PRECONDITION, w.finish, complete, reason="INPUTS_PENDING")
    expect(PRECONDITION, w.finish, E.ATTEMPT_OUTCOME_CANCELLED, reason="NO_STOP_REQUESTED")
    expect(PRECONDITION, w.finish, E.ATTEMPT_OUTCOME_PAUSED, reason="NO_STOP_REQUESTED")
    expect(PRECONDITION, w.finish, E.ATTEMPT_OUTCOME_WAITING_APPROVAL, reason="NO_APPROVAL_PENDING")
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    expect(ABORTED, w.finish, E.ATTEMPT_OUTCOME_FAILED_RETRYABLE, reason="LEASE_LOST")


@sentence(WK, "Unset: the server default (30 s); clamped to the server's bounds.")
def test_lease_ttl_defaults_to_30_seconds_and_is_clamped(stubs: Stubs) -> None:
    stubs.publish_agent()
    for _ in range(2):
        stubs.run(stubs.thread(E.CONCURRENCY_POLICY_ALLOW).id)

    def ttl(got: Any) -> float:
        attempt = got.attempt
        return (
            float(attempt.lease_expire_time.ToNanoseconds() - attempt.start_time.ToNanoseconds())
            / 1e9
        )

    plain = stubs.worker.AcquireRun(wpb.AcquireRunRequest(worker_id="w"), timeout=T)
    assert ttl(plain) == pytest.approx(30, abs=0.5)
    long = stubs.acquire(ttl=3600)
    assert ttl(long) == pytest.approx(600, abs=0.5)  # the server's bound: 10 minutes


@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
@sentence(WK, "Unset: the server default (30 s); clamped to the server maximum.")
def test_wait_defaults_to_30_seconds_and_is_clamped(stubs: Stubs) -> None:
    settings = RuntimeSettings()
    assert (settings.default_wait, settings.max_wait) == (
        dt.timedelta(seconds=30),
        dt.timedelta(seconds=60),
    )
    # Unset is not "no wait": with no work the call is still waiting after 1 s.
    error = rpc_error(stubs.worker.AcquireRun, wpb.AcquireRunRequest(worker_id="w"), timeout=1)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


@sentence(
    WK,
    "Short label; by default the tool's name for a TOOL_CALL (and its approval request), "
    "the check's for a COMPLETION_CHECK, and empty for a MODEL_CALL.",
)
def test_operation_defaults_to_the_tool_or_check_name(stubs: Stubs) -> None:
    w = start(stubs)
    assert get_step(stubs, w.tool("read_file", "r", path="a").step.id).operation == "read_file"
    approval = w.tool("apply_patch", "p", patch="d").step
    assert get_step(stubs, approval.id).operation == "apply_patch"
    check = w.begin(
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="tests-pass"),
    ).step
    assert get_step(stubs, check.id).operation == "tests-pass"
    assert get_step(stubs, w.model("m").step.id).operation == ""
    labelled = w.model("n", operation="plan").step
    assert get_step(stubs, labelled.id).operation == "plan"


@sentence(WK, "Defaults to the blob's media type.")
def test_an_artifact_takes_its_blobs_media_type(stubs: Stubs) -> None:
    w = start(stubs)
    blob = put_blob(stubs, b"--- a\n+++ b\n", media_type="text/x-diff").blob
    step = w.model("m").step
    artifact = stubs.worker.CreateArtifact(
        wpb.CreateArtifactRequest(
            fence=w.fence, step_id=step.id, name="p", blob_digest=blob.digest
        ),
        timeout=T,
    ).artifact
    assert artifact.media_type == "text/x-diff"


# -- runtime messages and enums ---------------------------------------------------------------


@sentence(EN, "On a thread: the server default, REJECT.")
def test_an_unspecified_thread_policy_is_reject(stubs: Stubs) -> None:
    thread = stubs.thread(E.CONCURRENCY_POLICY_UNSPECIFIED)
    assert thread.concurrency_policy == E.CONCURRENCY_POLICY_REJECT


@sentence(
    MS,
    "Default policy for a new run while another run of the thread is not yet terminal.",
)
@pytest.mark.fresh_server(
    reason="acquires whichever run is queued, which on a shared server may be an earlier test's"
)
def test_the_threads_policy_applies_to_a_new_run(stubs: Stubs) -> None:
    stubs.publish_agent()
    thread = stubs.thread(E.CONCURRENCY_POLICY_ENQUEUE)
    first = stubs.run(thread.id)
    stubs.run(thread.id)  # queued behind the first (ENQUEUE): not offered while it runs
    assert stubs.acquire().run.id == first.id
    assert not stubs.acquire(wait=0.1).HasField("run")
    # The request may override it.
    third = stubs.run(thread.id, concurrency_policy=E.CONCURRENCY_POLICY_ALLOW)
    assert stubs.acquire().run.id == third.id


@pytest.mark.fresh_server(reason="lists every thread the database holds")
@sentence(MS, "Never UNSPECIFIED on output (the server default is REJECT).")
def test_a_threads_policy_is_never_unspecified(stubs: Stubs) -> None:
    stubs.runtime.CreateThread(pb.CreateThreadRequest(), timeout=T)
    listed = stubs.runtime.ListThreads(pb.ListThreadsRequest(), timeout=T).threads
    assert listed and {t.concurrency_policy for t in listed} == {E.CONCURRENCY_POLICY_REJECT}


@sentence(
    MS,
    "Where the thread, its runs, messages and artifacts live for access control "
    "(docs/security.md): a DNS label, `default` when the creator gave none.",
)
def test_thread_and_run_namespace_default(stubs: Stubs) -> None:
    thread = stubs.runtime.CreateThread(pb.CreateThreadRequest(), timeout=T).thread
    stubs.publish_agent()
    run = stubs.run(thread.id)
    assert (thread.namespace, run.namespace) == ("default", "default")


@sentence(MS, "Defaults to `application/octet-stream`.")
def test_a_blob_without_a_media_type_is_octet_stream(stubs: Stubs) -> None:
    blob = put_blob(stubs, b"bytes", media_type="").blob
    assert blob.media_type == "application/octet-stream"


@sentence(
    MS,
    "The namespace the blob is stored for (`default` if empty): GetBlob finds it only in "
    "the namespaces it was uploaded to, and it counts against each one's blob quota.",
)
def test_a_blob_is_held_by_the_namespaces_it_was_uploaded_to(stubs: Stubs) -> None:
    data = b"shared content"
    first = put(
        stubs, pb.PutBlobRequest(header=message_pb2.BlobHeader(size=len(data))), chunk(data)
    )
    assert first.created
    get = stubs.runtime.GetBlob
    assert list(get(pb.GetBlobRequest(digest=first.blob.digest, namespace="default"), timeout=T))
    expect(
        NOT_FOUND,
        lambda: list(
            get(pb.GetBlobRequest(digest=first.blob.digest, namespace="team-b"), timeout=T)
        ),
    )
    # Uploaded to another namespace too: held (and charged) there as well.
    again = put(
        stubs,
        pb.PutBlobRequest(header=message_pb2.BlobHeader(size=len(data), namespace="team-b")),
        chunk(data),
    )
    assert again.created
    assert list(get(pb.GetBlobRequest(digest=first.blob.digest, namespace="team-b"), timeout=T))


# -- RegistryService --------------------------------------------------------------------------


def _publish_tools(stubs: Stubs, n: int) -> None:
    for i in range(n):
        stubs.registry.PublishComponent(
            rpb.PublishComponentRequest(component=registry_data.tool(f"tool-{i:03}", "1")),
            timeout=T,
        )


_REGISTRY_PAGE = (
    "Maximum results per page; 0 means the server default (100), values above 1000 are "
    "treated as 1000."
)


@sentence(RG, _REGISTRY_PAGE)
def test_registry_lists_default_to_100_per_page(stubs: Stubs) -> None:
    # The sentence is the page_size comment of ListComponents, ListAgentVersions, ListTags
    # and ListTagHistory: each list is driven past 100.
    _publish_tools(stubs, 101)
    components = stubs.registry.ListComponents(rpb.ListComponentsRequest(), timeout=T)
    assert len(components.components) == 100 and components.next_page_token
    digest = stubs.publish_agent()
    definition = registry_data.coding_definition()
    for i in range(100):
        definition.version_label = f"v{i}"
        definition.description = f"version {i}"
        stubs.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=definition), timeout=T
        )
    versions = stubs.registry.ListAgentVersions(
        rpb.ListAgentVersionsRequest(agent_id="coding_agent"), timeout=T
    )
    assert len(versions.agent_versions) == 100 and versions.next_page_token
    for i in range(101):
        stubs.registry.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag=f"t{i}", digest=digest), timeout=T
        )
    tags = stubs.registry.ListTags(rpb.ListTagsRequest(agent_id="coding_agent"), timeout=T)
    assert len(tags.tags) == 100 and tags.next_page_token
    history = stubs.registry.ListTagHistory(
        rpb.ListTagHistoryRequest(agent_id="coding_agent"), timeout=T
    )
    assert len(history.events) == 100 and history.next_page_token
    everything = stubs.registry.ListTags(
        rpb.ListTagsRequest(agent_id="coding_agent", page_size=5000), timeout=T
    )
    assert len(everything.tags) == 102 and not everything.next_page_token  # (and prod)


@sentence(RG, "Errors as for the corresponding publish, except ALREADY_EXISTS.")
def test_compute_digest_errors_as_publish_but_never_already_exists(stubs: Stubs) -> None:
    stubs.publish_agent()
    # Different content under a taken label: a publish would fail ALREADY_EXISTS; this
    # answers the digest and names the existing one.
    changed = registry_data.tool("read_file", "1", {"type": "object"})
    computed = stubs.registry.ComputeDigest(rpb.ComputeDigestRequest(component=changed), timeout=T)
    assert computed.existing_digest and computed.existing_digest != computed.digest
    expect(
        grpc.StatusCode.ALREADY_EXISTS,
        stubs.registry.PublishComponent,
        rpb.PublishComponentRequest(component=changed),
        timeout=T,
        reason="VERSION_CONFLICT",
    )
    # A reference that resolves to nothing: NOT_FOUND, as for PublishAgentVersion.
    dangling = registry_data.coding_definition()
    dangling.skills.append("no-such-skill@1.0.0")
    for call, request in (
        (stubs.registry.ComputeDigest, rpb.ComputeDigestRequest(agent_definition=dangling)),
        (
            stubs.registry.PublishAgentVersion,
            rpb.PublishAgentVersionRequest(definition=dangling),
        ),
    ):
        expect(NOT_FOUND, call, request, timeout=T)
    # Malformed input: INVALID_ARGUMENT for both.
    bad = registry_data.tool("read_file", "not a version!")
    expect(INVALID, stubs.registry.ComputeDigest, rpb.ComputeDigestRequest(component=bad))
    expect(INVALID, stubs.registry.PublishComponent, rpb.PublishComponentRequest(component=bad))


# -- AuditService -----------------------------------------------------------------------------


@sentence(AU, "Most steps to include per record; 0 means the server default (1000).")
def test_provenance_includes_1000_steps_by_default(stubs: Stubs) -> None:
    w = start(stubs)
    model_steps(w, 1001)
    [record] = (
        audit(stubs).GetProvenance(apb.GetProvenanceRequest(run_id=w.run_id), timeout=60).records
    )
    assert len(record.steps) == 1000 and record.steps_truncated
    [few] = (
        audit(stubs)
        .GetProvenance(apb.GetProvenanceRequest(run_id=w.run_id, max_steps=3), timeout=T)
        .records
    )
    assert len(few.steps) == 3


def _usages(stubs: Stubs, **kw: Any) -> Any:
    return audit(stubs).FindUsages(apb.FindUsagesRequest(**kw), timeout=T)


@pytest.mark.fresh_server(reason="counts usages over everything the database holds")
@sentence(AU, "For model_id queries; defaults to MODEL_MATCH_ANY.")
def test_model_queries_match_any_by_default(stubs: Stubs) -> None:
    w = start(stubs)
    step = w.model("m").step
    w.end(step.id, reported_model_id="claude-sonnet-4-20250514")
    for model_id in ("claude-sonnet-4", "claude-sonnet-4-20250514"):
        assert [u.step_id for u in _usages(stubs, model_id=model_id).usages] == [step.id]
    requested_only = _usages(
        stubs, model_id="claude-sonnet-4-20250514", model_match=amsg.MODEL_MATCH_REQUESTED
    )
    assert list(requested_only.usages) == []


@pytest.mark.fresh_server(reason="counts usages over everything the database holds")
@sentence(AU, "0 means the default (100); at most 1000.")
def test_find_usages_pages_100_by_default(stubs: Stubs) -> None:
    w = start(stubs)
    model_steps(w, 101)
    page = _usages(stubs, model_id="claude-sonnet-4")
    assert len(page.usages) == 100 and page.next_page_token
    whole = _usages(stubs, model_id="claude-sonnet-4", page_size=5000)
    assert len(whole.usages) == 101 and not whole.next_page_token


def _bundle_info(stubs: Stubs, run_id: str, **kw: Any) -> Any:
    for response in audit(stubs).ExportBundle(
        apb.ExportBundleRequest(run_id=run_id, **kw), timeout=T
    ):
        return response.info
    return None


@sentence(AU, "One JSON document (the default).")
def test_bundle_format_json_is_one_document(stubs: Stubs) -> None:
    w = start(stubs)
    info = _bundle_info(stubs, w.run_id, format=apb.BUNDLE_FORMAT_JSON)
    assert info.media_type == "application/json"


@sentence(AU, "Defaults to BUNDLE_FORMAT_JSON.")
def test_bundle_format_defaults_to_json(stubs: Stubs) -> None:
    w = start(stubs)
    info = _bundle_info(stubs, w.run_id)
    assert (info.format, info.media_type) == (apb.BUNDLE_FORMAT_JSON, "application/json")


@sentence(
    AM,
    "Either the model the runtime told the worker to request or the one the provider "
    "reported (the default).",
)
@pytest.mark.fresh_server(reason="counts usages over everything the database holds")
def test_model_match_any_is_requested_or_reported(stubs: Stubs) -> None:
    w = start(stubs)
    step = w.model("m").step
    w.end(step.id, reported_model_id="claude-sonnet-4-20250514")
    for model_id in ("claude-sonnet-4", "claude-sonnet-4-20250514"):
        found = _usages(stubs, model_id=model_id, model_match=amsg.MODEL_MATCH_ANY)
        assert [u.step_id for u in found.usages] == [step.id]
