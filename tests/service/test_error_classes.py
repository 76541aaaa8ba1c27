"""A fallback trigger a model policy names is one a worker can report (issue 17, item 6).

The registry's ErrorClass (what a policy's ``fallback_on`` names) and the runtime's (what a
worker reports) are a pair with the same names and different numbers; the runtime compares
them by name. ``CONTENT_FILTERED`` was once only in the registry's: a policy could name it
and no worker could report it.
"""

from __future__ import annotations

from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.runtime.v1 import enum_pb2 as E
from tests.runtime_support import Stubs
from tests.service.steps_support import FAILED, acquire, get_step, publish_variant


def test_a_content_filtered_model_call_falls_back_as_the_policy_says(stubs: Stubs) -> None:
    stubs.publish_agent()
    policy = rmsg.ComponentDraft(
        kind=renum.COMPONENT_KIND_MODEL_POLICY,
        name="filtered-policy",
        version="1",
        spec=rmsg.ComponentSpec(
            model_policy=rmsg.ModelPolicySpec(
                candidates=[
                    rmsg.ModelCandidate(
                        name="strict",
                        provider="p",
                        model_id="strict-1",
                        fallback_on=[renum.ERROR_CLASS_CONTENT_FILTERED],
                    ),
                    rmsg.ModelCandidate(name="lenient", provider="q", model_id="lenient-1"),
                ]
            )
        ),
    )
    publish_variant(stubs, "filtered_agent", model_policy=policy)
    stubs.run(stubs.thread().id, ref="filtered_agent@v1")
    w = acquire(stubs)

    first = w.model("m1").step
    assert first.versions.model.candidate_name == "strict"
    ended = w.end(first.id, FAILED, error_class=E.ERROR_CLASS_CONTENT_FILTERED)
    assert ended.error_class == E.ERROR_CLASS_CONTENT_FILTERED
    assert get_step(stubs, first.id).error_class == E.ERROR_CLASS_CONTENT_FILTERED

    retry = w.model(
        "m1",
        previous_error_class=E.ERROR_CLASS_CONTENT_FILTERED,
        previous_candidate="strict",
        retry_of_step_id=first.id,
    ).step
    model = retry.versions.model
    assert (model.candidate_name, model.reason) == (
        "lenient",
        E.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
    )
