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

import pytest

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2 as E
from tests.runtime_support import Stubs
from tests.service.steps_support import FAILED, acquire, closure, events, list_steps, of_type, start
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
