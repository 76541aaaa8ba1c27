"""Facts the runtime reads from the ledger instead of taking the worker's word (issue 17,
items 2-4): which skills a model call was handed, what a model fallback follows, and whether
the completion policy's checks hold.

Each test runs on both engines, with the step writer process and without it (the server's
own step engine), through a real server and real stubs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2 as E
from tests.runtime_support import Stubs
from tests.service.steps_support import closure, list_steps, start
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
    assert E.STEP_TYPE_MODEL_CALL == named.type
