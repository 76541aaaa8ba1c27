"""Facts the runtime reads from the ledger instead of taking the worker's word (issue 17,
items 2-4): which skills a model call was handed, what a model fallback follows, and whether
the completion policy's checks hold.

Each test runs on both engines, with the step writer process and without it (the server's
own step engine), through a real server and real stubs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    FAILED,
    Worker,
    acquire,
    closure,
    events,
    expect,
    list_steps,
    of_type,
    publish_variant,
    put_blob,
    start,
)
from tests.support import ServerThread


@pytest.fixture(params=[True, False], ids=["step-process", "in-process"])
def both(database_url: str, request: pytest.FixtureRequest) -> Iterator[Stubs]:
    """Stubs to a server that runs steps in the step writer process, or itself."""
    thread = ServerThread(database_url, step_process=bool(request.param))
    stubs = Stubs.open(thread.start())
    try:
        yield stubs
    finally:
        with contextlib.suppress(Exception):
            stubs.close()
        thread.stop()


def _usages(stubs: Stubs, ref: str) -> list[str]:
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    found = audit.FindUsages(apb.FindUsagesRequest(component_ref=ref), timeout=10).usages
    return [u.step_id for u in found]


# -- item 4: the skills a model call is handed ------------------------------------------------


def test_a_model_call_listing_no_skills_is_handed_and_recorded_with_the_definitions(
    both: Stubs,
) -> None:
    w = start(both)
    skill = closure(both, "coding_agent:prod").closure.skills[0]
    begun = w.model("m1", estimated_input_tokens=100)  # lists no skills
    [recorded] = begun.step.versions.skills
    assert (recorded.name, recorded.version, recorded.digest) == (
        "repo-debug",
        "2.1.0",
        skill.digest,
    )
    # What was recorded is what was handed out: the skill's content came with the answer.
    assert [s.name for s in begun.resolved.skills] == ["repo-debug"]
    assert begun.resolved.skills[0].instructions
    w.end(begun.step.id)
    assert _usages(both, "repo-debug@2.1.0") == [begun.step.id]
    # A spec naming skills gets exactly those (here the only one, named twice).
    named = w.model("m2", skills=["repo-debug", "repo-debug"]).step
    assert [s.name for s in named.versions.skills] == ["repo-debug"]
    assert [s.id for s in list_steps(both, w.run_id)] == [begun.step.id, named.id]
    assert set(_usages(both, "repo-debug@2.1.0")) == {begun.step.id, named.id}


# -- item 2: what a model fallback follows ----------------------------------------------------


def _model(step: Any) -> tuple[str, int, str]:
    m = step.versions.model
    return (m.candidate_name, m.reason, m.fallback_from_step_id)


PRIMARY = ("primary", E.CANDIDATE_REASON_PRIMARY, "")


def test_a_claimed_error_with_no_failed_step_gets_no_fallback(both: Stubs) -> None:
    w = start(both)
    claimed = w.model(
        estimated_input_tokens=100,
        previous_error_class=E.ERROR_CLASS_RATE_LIMITED,
        previous_candidate="primary",
    ).step
    assert _model(claimed) == PRIMARY
    w.end(claimed.id)
    # A model call that succeeded is no failure to follow either, whatever is claimed.
    again = w.model(previous_error_class=E.ERROR_CLASS_RATE_LIMITED).step
    assert _model(again) == PRIMARY


def test_a_fallback_follows_the_attempts_failed_model_call_as_recorded(both: Stubs) -> None:
    w = start(both)
    first = w.model(estimated_input_tokens=100).step
    w.end(first.id, FAILED, error_class=E.ERROR_CLASS_RATE_LIMITED, retryable=True)
    # No claim at all (and no idempotency key, no retry link): the ledger's failure decides.
    fallback = w.model(estimated_input_tokens=100)
    assert _model(fallback.step) == (
        "fallback",
        E.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
        first.id,
    )
    assert fallback.resolved.model.model_id == "gpt-4.1"
    w.end(fallback.step.id, FAILED, error_class=E.ERROR_CLASS_PROVIDER_ERROR)
    # A claim that disagrees with the ledger is ignored: the fallback failed PROVIDER_ERROR,
    # which it does not fall back on, so the same candidate again, following that step.
    disagreeing = w.model(
        previous_error_class=E.ERROR_CLASS_RATE_LIMITED, previous_candidate="primary"
    ).step
    assert _model(disagreeing) == (
        "fallback",
        E.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
        fallback.step.id,
    )
    w.end(disagreeing.id)
    assert _model(w.model().step) == PRIMARY  # the last model call succeeded
    # Recorded on the step and in its step.started event.
    stored = {s.id: s for s in list_steps(both, w.run_id)}
    assert stored[fallback.step.id].versions.model.fallback_from_step_id == first.id
    started = of_type(events(both, w.run_id), E.EVENT_TYPE_STEP_STARTED)
    assert [e.step_started_attributes.versions.model.fallback_from_step_id for e in started] == [
        "",
        first.id,
        fallback.step.id,
        "",
    ]


def test_a_failure_in_an_earlier_attempt_is_not_followed(both: Stubs) -> None:
    w = start(both)
    failed = w.model().step
    w.end(failed.id, FAILED, error_class=E.ERROR_CLASS_RATE_LIMITED, retryable=True)
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    second = acquire(both)
    assert second.run_id == w.run_id
    claimed = second.model(
        previous_error_class=E.ERROR_CLASS_RATE_LIMITED, previous_candidate="primary"
    ).step
    assert _model(claimed) == PRIMARY


# -- item 3: completion checks the runtime evaluates ------------------------------------------


def _ledger_policy() -> rmsg.ComponentDraft:
    C = rmsg.CompletionCheck
    return rmsg.ComponentDraft(
        kind=renum.COMPONENT_KIND_COMPLETION_POLICY,
        name="ledger-checks",
        version="1",
        spec=rmsg.ComponentSpec(
            completion_policy=rmsg.CompletionPolicySpec(
                checks=[
                    C(
                        name="diff-produced",
                        condition=renum.COMPLETION_CONDITION_ARTIFACT_EXISTS,
                        artifact_kind="diff",
                    ),
                    C(
                        name="tests-after-changes",
                        condition=renum.COMPLETION_CONDITION_TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS,
                        tool="run_tests",
                    ),
                    C(name="nothing-open", condition=renum.COMPLETION_CONDITION_NO_OPEN_STEPS),
                    C(name="reviewed", description="a human read the diff"),
                ]
            )
        ),
    )


def _start_ledger_agent(stubs: Stubs) -> Worker:
    stubs.publish_agent()
    publish_variant(
        stubs,
        "ledger_agent",
        permission_rules={
            "apply_patch": renum.PERMISSION_DECISION_ALLOW,
            "run_tests": renum.PERMISSION_DECISION_ALLOW,
        },
        completion_policy=_ledger_policy(),
    )
    stubs.run(stubs.thread().id, ref="ledger_agent@v1")
    return acquire(stubs)


def _run_ended(stubs: Stubs, run_id: str) -> Any:
    [ended] = of_type(events(stubs, run_id), E.EVENT_TYPE_RUN_ENDED)
    return ended.run_ended_attributes


def _artifact(w: Worker, step_id: str, kind: str) -> str:
    blob = put_blob(w.stubs, f"a {kind}".encode()).blob.digest
    return str(
        w.stubs.worker.CreateArtifact(
            wpb.CreateArtifactRequest(
                fence=w.fence,
                step_id=step_id,
                name="change",
                blob_digest=blob,
                labels={"kind": kind},
            ),
            timeout=10,
        ).artifact.id
    )


def test_runtime_checks_pass_on_the_ledgers_evidence(both: Stubs) -> None:
    w = _start_ledger_agent(both)
    assert list(w.acquired.agent.runtime_checks) == [  # (the policy's checks, by name)
        "diff-produced",
        "nothing-open",
        "tests-after-changes",
    ]
    # What the runtime evaluates, no worker may attest.
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        w.begin,
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="diff-produced"),
    )
    patch = w.tool("apply_patch", patch="--- a\n+++ b\n").step
    assert patch.side_effect
    w.end(patch.id)
    diff = _artifact(w, patch.id, "diff")
    tests = w.tool("run_tests").step
    w.end(tests.id)
    reviewed = w.check("reviewed")
    done = w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    assert done.run.status == E.RUN_STATUS_COMPLETED
    results = {r.name: r for r in _run_ended(both, w.run_id).completion_checks}
    assert all(r.passed for r in results.values())
    assert list(results["diff-produced"].artifact_ids) == [diff]
    assert results["diff-produced"].condition == "ARTIFACT_EXISTS"
    assert list(results["tests-after-changes"].step_ids) == [tests.id, patch.id]
    assert list(results["nothing-open"].step_ids) == []
    attested = results["reviewed"]
    assert (attested.condition, list(attested.step_ids)) == ("ATTESTED", [reviewed.id])
    assert attested.attested_by == done.attempt.worker_principal == "anonymous"
    assert not results["diff-produced"].attested_by


def test_a_claim_the_ledger_refutes_fails_the_run_for_good(both: Stubs) -> None:
    w = _start_ledger_agent(both)
    tests = w.tool("run_tests").step
    w.end(tests.id)
    patch = w.tool("apply_patch", patch="--- a\n+++ b\n").step  # changes after the tests
    w.end(patch.id)
    w.check("reviewed")
    done = w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)  # no diff artifact either
    assert done.run.status == E.RUN_STATUS_FAILED
    assert done.run.terminal_reason == E.TERMINAL_REASON_COMPLETION_CHECKS_FAILED
    assert "diff-produced" in done.run.terminal_message
    assert "tests-after-changes" in done.run.terminal_message
    assert done.attempt.status == E.ATTEMPT_STATUS_FAILED
    assert not done.run.output_ref and not done.run.result_summary
    ended = _run_ended(both, w.run_id)
    assert ended.terminal_reason == E.TERMINAL_REASON_COMPLETION_CHECKS_FAILED
    results = {r.name: r for r in ended.completion_checks}
    assert [n for n, r in results.items() if not r.passed] == [
        "diff-produced",
        "tests-after-changes",
    ]
    assert list(results["tests-after-changes"].step_ids) == [tests.id, patch.id]
    assert results["reviewed"].passed
    # The same claim again (a lost response): the same answer, nothing more written.
    again = w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    assert again.run == done.run and again.attempt == done.attempt
    assert len(of_type(events(both, w.run_id), E.EVENT_TYPE_RUN_ENDED)) == 1


def test_an_attested_check_failed_not_retryable_fails_the_run(both: Stubs) -> None:
    w = start(both)  # coding_agent: test-and-diff@3, both checks attested
    w.check("diff-reviewed")
    w.check("tests-pass", FAILED)  # EndStep's retryable defaults to false
    done = w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)
    assert done.run.status == E.RUN_STATUS_FAILED
    assert done.run.terminal_reason == E.TERMINAL_REASON_COMPLETION_CHECKS_FAILED
    results = {r.name: r for r in _run_ended(both, w.run_id).completion_checks}
    assert not results["tests-pass"].passed and results["diff-reviewed"].passed


def test_an_attested_check_failed_retryable_is_only_missing(both: Stubs) -> None:
    w = start(both)
    w.check("diff-reviewed")
    begun = w.begin(
        type=E.STEP_TYPE_COMPLETION_CHECK,
        completion_check=message_pb2.CompletionCheckSpec(check="tests-pass"),
    ).step
    w.end(begun.id, FAILED, retryable=True)
    details = expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        w.finish,
        E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN,
        reason="COMPLETION_CHECKS_MISSING",
    )
    assert details["ErrorInfo"].metadata["missing_checks"] == "tests-pass"
    w.check("tests-pass")  # attested now: the worker's latest word is a pass
    assert w.finish(E.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN).run.status == E.RUN_STATUS_COMPLETED
