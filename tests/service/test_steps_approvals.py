"""Approvals (REQUIRE_APPROVAL → wait → ResolveApproval → resume at the step) and the
completion policy's checks at FinishAttempt(SUCCEEDED_COMPLETE_RUN)."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    FAILED,
    OK,
    T,
    Worker,
    acquire,
    events,
    expect,
    get_run,
    get_step,
    list_steps,
    of_type,
    send,
    start,
    violations,
)

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
COMPLETE = E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN


def resolve(stubs: Stubs, run_id: str, step_id: str, decision: Any, **kw: str) -> Any:
    return stubs.runtime.ResolveApproval(
        pb.ResolveApprovalRequest(run_id=run_id, step_id=step_id, decision=decision, **kw),
        timeout=T,
    )


def wait_for_approval(stubs: Stubs) -> tuple[Worker, str]:
    """A run whose first attempt asked to apply a patch and ended waiting for approval."""
    w = start(stubs)
    # No approval pending yet: FinishAttempt(WAITING_APPROVAL) is refused, attempt stays.
    expect(
        PRECONDITION,
        w.finish,
        E.ATTEMPT_OUTCOME_WAITING_APPROVAL,
        reason="NO_APPROVAL_PENDING",
    )
    asked = w.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n")
    step = asked.step
    assert (step.type, step.status) == (
        E.STEP_TYPE_APPROVAL_REQUEST,
        E.STEP_STATUS_WAITING_APPROVAL,
    )
    assert step.tool_name == "apply_patch" and not step.HasField("end_time")
    assert step.versions.tools[0].decision == E.PERMISSION_DECISION_REQUIRE_APPROVAL
    assert not step.HasField("approval")
    # An approval is not a step the worker ends.
    expect(PRECONDITION, w.end, step.id)
    # Asking again with the key while waiting: the same approval step.
    again = w.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n")
    assert again.existing and again.step.id == step.id
    done = w.finish(E.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    assert done.run.status == E.RUN_STATUS_WAITING_APPROVAL
    assert done.attempt.status == E.ATTEMPT_STATUS_ENDED_FOR_APPROVAL
    requested = of_type(events(stubs, w.run_id), E.EVENT_TYPE_APPROVAL_REQUESTED)
    assert [e.approval_requested_attributes.step_id for e in requested] == [step.id]
    # Nothing to acquire while the run waits.
    assert not stubs.acquire().HasField("run")
    return w, step.id


def test_an_approved_call_resumes_as_the_tool_call(stubs: Stubs) -> None:
    w, approval_id = wait_for_approval(stubs)
    resolved = resolve(
        stubs, w.run_id, approval_id, E.APPROVAL_DECISION_APPROVE, approver="alice", comment="lgtm"
    )
    assert resolved.run.status == E.RUN_STATUS_QUEUED
    approval = resolved.step.approval
    assert (approval.decision, approval.approver, approval.comment) == (
        E.APPROVAL_DECISION_APPROVE,
        "alice",
        "lgtm",
    )
    assert approval.HasField("resolve_time") and resolved.step.status == OK
    assert get_step(stubs, approval_id) == resolved.step
    # The same decision again returns the same result; another one is refused.
    again = resolve(stubs, w.run_id, approval_id, E.APPROVAL_DECISION_APPROVE, approver="alice")
    assert again.step == resolved.step and again.run.status == E.RUN_STATUS_QUEUED
    expect(
        PRECONDITION,
        resolve,
        stubs,
        w.run_id,
        approval_id,
        E.APPROVAL_DECISION_DENY,
        approver="bob",
        reason="APPROVAL_RESOLVED",
    )
    [event] = of_type(events(stubs, w.run_id), E.EVENT_TYPE_APPROVAL_RESOLVED)
    attributes = event.approval_resolved_attributes
    assert (attributes.step_id, attributes.approver, attributes.comment) == (
        approval_id,
        "alice",
        "lgtm",
    )

    w2 = acquire(stubs)
    assert w2.acquired.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL
    call = w2.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n")
    step = call.step
    assert (step.type, step.status) == (E.STEP_TYPE_TOOL_CALL, E.STEP_STATUS_STARTED)
    assert step.approval_step_id == approval_id and step.attempt_id == w2.attempt_id
    assert step.side_effect  # apply_patch has side effects
    assert json_format.MessageToDict(step.tool_arguments) == {"patch": "--- a\n+++ b\n"}
    assert call.resolved.tools[0].name == "apply_patch"
    assert call.resolved.tools[0].decision == E.PERMISSION_DECISION_REQUIRE_APPROVAL
    # Repeating the call: the same tool call, not another one.
    assert w2.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n").step.id == step.id
    w2.end(step.id)
    assert w2.complete().run.status == E.RUN_STATUS_COMPLETED


def test_a_denied_call_is_the_tools_result_and_the_run_can_complete(stubs: Stubs) -> None:
    w, approval_id = wait_for_approval(stubs)
    for bad, field in (
        ({"decision": E.APPROVAL_DECISION_DENY}, "approver"),
        ({"decision": E.APPROVAL_DECISION_UNSPECIFIED, "approver": "x"}, "decision"),
        ({"decision": 99, "approver": "x"}, "decision"),
    ):
        details = expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            stubs.runtime.ResolveApproval,
            pb.ResolveApprovalRequest(run_id=w.run_id, step_id=approval_id, **bad),
            timeout=T,
        )
        assert field in violations(details)
    denied = resolve(
        stubs, w.run_id, approval_id, E.APPROVAL_DECISION_DENY, approver="bob", comment="too big"
    )
    assert denied.step.status == E.STEP_STATUS_DENIED
    assert denied.step.approval.decision == E.APPROVAL_DECISION_DENY
    assert denied.run.status == E.RUN_STATUS_QUEUED

    w2 = acquire(stubs)
    assert w2.acquired.attempt.reason == E.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL
    # The resumed call gets the denial as its result (no error: the run goes on).
    call = w2.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n")
    step = call.step
    assert (step.type, step.status) == (E.STEP_TYPE_TOOL_CALL, E.STEP_STATUS_DENIED)
    assert step.approval_step_id == approval_id
    assert step.error_class == E.ERROR_CLASS_PERMISSION_DENIED
    assert "bob" in step.error_message and "too big" in step.error_message
    assert not step.side_effect
    assert w2.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n").step.id == step.id
    done = w2.complete()
    assert done.run.status == E.RUN_STATUS_COMPLETED
    assert done.run.terminal_reason == E.TERMINAL_REASON_COMPLETED_BY_WORKER


def test_resolve_approval_errors(stubs: Stubs) -> None:
    w, approval_id = wait_for_approval(stubs)
    assert [s.id for s in list_steps(stubs, w.run_id)] == [approval_id]
    other = start(stubs, publish=False)
    not_an_approval = other.model().step.id
    approve = E.APPROVAL_DECISION_APPROVE
    expect(
        grpc.StatusCode.NOT_FOUND, resolve, stubs, "run_nope", approval_id, approve, approver="a"
    )
    expect(grpc.StatusCode.NOT_FOUND, resolve, stubs, w.run_id, "stp_nope", approve, approver="a")
    for run_id, step_id in ((w.run_id, not_an_approval), (other.run_id, approval_id)):
        details = expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            resolve,
            stubs,
            run_id,
            step_id,
            approve,
            approver="a",
        )
        assert violations(details) == ["step_id"]

    # A run that ended while waiting takes no decision, and nothing is appended after run.ended.
    cancelled = stubs.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id), timeout=T).run
    assert cancelled.status == E.RUN_STATUS_CANCELLED
    mark = get_run(stubs, w.run_id).last_event_sequence
    expect(
        PRECONDITION,
        resolve,
        stubs,
        w.run_id,
        approval_id,
        approve,
        approver="a",
        reason="RUN_ENDED",
    )
    assert get_step(stubs, approval_id).status == E.STEP_STATUS_WAITING_APPROVAL
    found = events(stubs, w.run_id)
    assert len(found) == mark and found[-1].event_type == E.EVENT_TYPE_RUN_ENDED


def test_completion_requires_every_check_of_the_bound_policy(stubs: Stubs) -> None:
    w = start(stubs)
    w.end(w.model().step.id)

    def refused(missing: list[str]) -> None:
        details = expect(PRECONDITION, w.finish, COMPLETE, reason="COMPLETION_CHECKS_MISSING")
        named = details["ErrorInfo"].metadata["missing_checks"].split(",")
        assert sorted(named) == sorted(missing)
        found = details["PreconditionFailure"].violations
        assert sorted((v.type, v.subject) for v in found) == sorted(
            ("COMPLETION_CHECK", c) for c in missing
        )
        # The refused FinishAttempt changed nothing: the attempt is still active.
        run = get_run(stubs, w.run_id)
        assert run.status == E.RUN_STATUS_RUNNING and run.current_attempt_id == w.attempt_id
        stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=w.fence), timeout=T)

    refused(["tests-pass", "diff-reviewed"])
    # A check failed retryably is not passed (one failed not retryable fails the run:
    # test_ledger_facts.py).
    failed = w.begin(
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="tests-pass"),
    ).step
    w.end(failed.id, FAILED, retryable=True)
    refused(["tests-pass", "diff-reviewed"])
    passed = w.check("tests-pass")
    assert passed.completion_check == "tests-pass"
    assert passed.type == E.STEP_TYPE_COMPLETION_CHECK
    refused(["diff-reviewed"])

    # A step still open blocks completion too.
    open_step = w.model().step
    expect(PRECONDITION, w.finish, COMPLETE, reason="STEPS_OPEN")
    w.end(open_step.id)

    # Checks passed by an earlier attempt count for the run.
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs)
    w2.check("diff-reviewed")
    # An input nobody has read yet blocks completion.
    follow = send(stubs, w2.run_id, E.INPUT_KIND_FOLLOW_UP, "one more thing")
    expect(PRECONDITION, w2.finish, COMPLETE, reason="INPUTS_PENDING")
    ended = w2.end_turn()
    assert [i.id for i in ended.delivered_inputs] == [follow.id]
    w2.end_turn()
    done = w2.finish(COMPLETE, result_summary="fixed")
    assert done.run.status == E.RUN_STATUS_COMPLETED and done.run.result_summary == "fixed"
    assert done.attempt.status == E.ATTEMPT_STATUS_SUCCEEDED
