"""Version resolution at BeginStep: model candidates, refusals recorded before they are
answered, argument schemas, the run's permission ceiling, and pinning to the bound definition."""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2 as E
from tests import registry_data
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    FAILED,
    T,
    acquire,
    closure,
    events,
    expect,
    get_step,
    list_steps,
    of_type,
    publish_variant,
    start,
    violations,
)

DENIED = grpc.StatusCode.PERMISSION_DENIED
RATE_LIMITED = E.ERROR_CLASS_RATE_LIMITED


def test_a_rate_limited_model_call_is_retried_on_the_fallback_candidate(stubs: Stubs) -> None:
    w = start(stubs)
    primary = w.model("m1", estimated_input_tokens=1000).step
    assert primary.versions.model.candidate_name == "primary"
    w.end(primary.id, FAILED, error_class=RATE_LIMITED, retryable=True)

    retry = w.model("m1", estimated_input_tokens=1000)
    model = retry.step.versions.model
    assert (model.candidate_name, model.reason, model.fallback_from_step_id) == (
        "fallback",
        E.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
        primary.id,
    )
    assert (model.provider, model.requested_model_id) == ("openai", "gpt-4.1")
    assert json_format.MessageToDict(model.parameters) == {"temperature": 0.2}
    assert retry.resolved.model.model_id == "gpt-4.1"
    assert retry.step.retry_of_step_id == primary.id
    w.end(retry.step.id, reported_model_id="gpt-4.1-2025-04-14")

    first, second = list_steps(stubs, w.run_id)
    assert first.status == FAILED and first.error_class == RATE_LIMITED
    assert first.versions.model.requested_model_id == "claude-sonnet-4"
    assert second.versions.model.requested_model_id == "gpt-4.1"
    assert second.versions.model.reported_model_id == "gpt-4.1-2025-04-14"

    # An error the primary does not fall back on retries the primary itself.
    again = w.model("m2").step
    assert again.versions.model.candidate_name == "primary"
    w.end(again.id, FAILED, error_class=E.ERROR_CLASS_PROVIDER_ERROR)
    other = w.model("m2").step
    assert other.versions.model.candidate_name == "primary"
    assert other.versions.model.reason == E.CANDIDATE_REASON_PRIMARY


def test_context_size_routes_to_a_candidate_that_fits_or_refuses(stubs: Stubs) -> None:
    w = start(stubs)
    fits = w.model(estimated_input_tokens=200_000).step.versions.model
    assert (fits.candidate_name, fits.reason) == ("primary", E.CANDIDATE_REASON_PRIMARY)
    routed = w.model(estimated_input_tokens=200_001).step.versions.model
    assert (routed.candidate_name, routed.reason) == (
        "fallback",
        E.CANDIDATE_REASON_CONTEXT_LENGTH_ROUTE,
    )
    assert routed.requested_model_id == "gpt-4.1"

    # A policy whose candidates all have limits: nothing fits a big context.
    tight = rmsg.ComponentDraft(
        kind=renum.COMPONENT_KIND_MODEL_POLICY,
        name="tight",
        version="1",
        spec=rmsg.ComponentSpec(
            model_policy=rmsg.ModelPolicySpec(
                candidates=[
                    rmsg.ModelCandidate(
                        name="small",
                        provider="p",
                        model_id="s-1",
                        max_context_tokens=1000,
                        fallback_on=[renum.ERROR_CLASS_RATE_LIMITED],
                    ),
                    rmsg.ModelCandidate(
                        name="medium", provider="p", model_id="m-1", max_context_tokens=2000
                    ),
                ]
            )
        ),
    )
    publish_variant(stubs, "tight_agent", model_policy=tight)
    stubs.run(stubs.thread().id, ref="tight_agent@v1")
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    t = acquire(stubs)
    assert t.acquired.run.agent.agent_id == "tight_agent"
    details = expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        t.model,
        estimated_input_tokens=5000,
        reason="NO_MODEL_CANDIDATE",
    )
    assert details["ErrorInfo"].metadata["estimated_input_tokens"] == "5000"
    assert list_steps(stubs, t.run_id) == []  # a refused resolution records nothing
    routed = t.model(estimated_input_tokens=1500).step.versions.model
    assert (routed.candidate_name, routed.reason) == (
        "medium",
        E.CANDIDATE_REASON_CONTEXT_LENGTH_ROUTE,
    )
    small = t.model(estimated_input_tokens=900).step
    assert small.versions.model.candidate_name == "small"
    t.end(small.id, FAILED, error_class=RATE_LIMITED)
    # After a rate limit on "small", the only candidate left must still fit the context.
    details = expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        t.model,
        estimated_input_tokens=3000,
        reason="NO_MODEL_CANDIDATE",
    )
    assert details["ErrorInfo"].metadata["failed_step_id"] == small.id
    fallback = t.model(estimated_input_tokens=900).step.versions.model
    assert (fallback.candidate_name, fallback.reason) == (
        "medium",
        E.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
    )


def test_skills_and_tools_outside_the_definition_are_denied_and_recorded(stubs: Stubs) -> None:
    w = start(stubs)
    cases = [
        (lambda: w.model("a", skills=["repo-debug", "root-kit"]), "skill root-kit"),
        (lambda: w.model("b", tools=["read_file", "rm_rf"]), "tool rm_rf"),
        (lambda: w.tool("rm_rf", "c", path="/"), "rm_rf"),
    ]
    for call, named in cases:
        details = expect(DENIED, call, reason="NOT_IN_DEFINITION")
        info = details["ErrorInfo"]
        assert named in (info.metadata.get("denied", "") + info.metadata.get("tool", ""))
        step = get_step(stubs, info.metadata["step_id"])
        assert step.status == E.STEP_STATUS_DENIED
        assert step.error_class == E.ERROR_CLASS_PERMISSION_DENIED
        assert "not in the bound definition" in step.error_message
        assert step.HasField("end_time")
    steps = list_steps(stubs, w.run_id)
    assert [s.sequence for s in steps] == [1, 2, 3]
    assert steps[2].tool_name == "rm_rf" and steps[2].type == E.STEP_TYPE_TOOL_CALL
    found = events(stubs, w.run_id)
    ended = of_type(found, E.EVENT_TYPE_STEP_ENDED)
    assert [e.step_ended_attributes.status for e in ended] == [E.STEP_STATUS_DENIED] * 3
    # A denied key is answered with the recorded refusal, not resolved again.
    again = w.tool("rm_rf", "c", path="/")
    assert again.existing and again.step.id == steps[2].id


def test_a_tool_the_policy_denies_is_refused_and_recorded(stubs: Stubs) -> None:
    w = start(stubs)
    version = closure(stubs, "coding_agent:prod")
    details = expect(DENIED, w.tool, "run_tests", "t1", reason="TOOL_DENIED")
    step = get_step(stubs, details["ErrorInfo"].metadata["step_id"])
    assert step.status == E.STEP_STATUS_DENIED and step.tool_name == "run_tests"
    [tool] = step.versions.tools
    pinned = next(t for t in version.closure.tools if t.name == "run_tests")
    assert (tool.name, tool.version, tool.schema_digest, tool.decision) == (
        "run_tests",
        "1",
        pinned.schema_digest,
        E.PERMISSION_DECISION_DENY,
    )
    # Offering the tool to the model records its decision, too.
    offered = w.model(tools=["run_tests"]).step.versions.tools
    assert [(t.name, t.decision) for t in offered] == [("run_tests", E.PERMISSION_DECISION_DENY)]


def test_arguments_failing_the_pinned_schema_are_invalid_and_recorded(stubs: Stubs) -> None:
    w = start(stubs)
    details = expect(grpc.StatusCode.INVALID_ARGUMENT, w.tool, "read_file", "r1", path=3)
    assert violations(details) == ["tool_call.arguments.path"]
    message = details["BadRequest"].field_violations[0].description
    # The number as the caller wrote it in JSON (a Struct carries it as the double 3.0).
    assert message == "$.path: 3 is not of type 'string' (schema of read_file@1)"
    step = get_step(stubs, details["ErrorInfo"].metadata["step_id"])
    assert step.status == FAILED and step.error_class == E.ERROR_CLASS_INVALID_ARGUMENTS
    assert json_format.MessageToDict(step.tool_arguments) == {"path": 3.0}

    details = expect(grpc.StatusCode.INVALID_ARGUMENT, w.tool, "read_file", "r2")
    assert violations(details) == ["tool_call.arguments"]  # "path" is required at the root
    details = expect(
        grpc.StatusCode.INVALID_ARGUMENT, w.tool, "read_file", "r3", path="a", mode="w"
    )
    assert "additional" in details["BadRequest"].field_violations[0].description.lower()

    # The failed key is retried with good arguments as a new step.
    good = w.tool("read_file", "r1", path="a.py")
    assert good.step.status == E.STEP_STATUS_STARTED and good.step.retry_of_step_id == step.id
    assert [s.status for s in list_steps(stubs, w.run_id)] == [
        FAILED,
        FAILED,
        FAILED,
        E.STEP_STATUS_STARTED,
    ]


def test_every_schema_violation_of_the_arguments_is_reported(stubs: Stubs) -> None:
    w = start(stubs)
    # Two violations at once: a number where a string belongs, and an argument the schema
    # does not allow. Each is its own BadRequest violation with its JSON path.
    details = expect(grpc.StatusCode.INVALID_ARGUMENT, w.tool, "read_file", "r1", path=42, mode=7.5)
    found = details["BadRequest"].field_violations
    assert [(v.field, v.description) for v in found] == [
        (
            "tool_call.arguments",
            "$: Additional properties are not allowed ('mode' was unexpected) "
            "(schema of read_file@1)",
        ),
        ("tool_call.arguments.path", "$.path: 42 is not of type 'string' (schema of read_file@1)"),
    ]
    assert "violation_count" not in details["ErrorInfo"].metadata
    # The step records them all.
    step = get_step(stubs, details["ErrorInfo"].metadata["step_id"])
    assert step.error_message == (
        "arguments do not match the schema of read_file@1: "
        "$: Additional properties are not allowed ('mode' was unexpected); "
        "$.path: 42 is not of type 'string'"
    )


def test_the_run_ceiling_bounds_side_effect_tools(stubs: Stubs) -> None:
    stubs.publish_agent()
    # An agent whose policy allows apply_patch outright, so only the ceiling limits it.
    publish_variant(
        stubs,
        "open_agent",
        permission_rules={
            "read_file": renum.PERMISSION_DECISION_ALLOW,
            "apply_patch": renum.PERMISSION_DECISION_ALLOW,
        },
    )
    results = {}
    for ceiling in (
        E.PERMISSION_CEILING_FULL,
        E.PERMISSION_CEILING_APPROVE_SIDE_EFFECTS,
        E.PERMISSION_CEILING_READ_ONLY,
    ):
        run = stubs.run(stubs.thread().id, ref="open_agent@v1", permission_ceiling=ceiling)
        assert run.permission_ceiling == ceiling
        w = acquire(stubs)
        assert w.run_id == run.id
        read = w.tool("read_file", path="a").step
        assert read.status == E.STEP_STATUS_STARTED  # no side effects: always allowed
        offered = {t.name: t.decision for t in w.model(tools=["apply_patch"]).step.versions.tools}
        try:
            begun = w.tool("apply_patch", "p", patch="diff")
            results[ceiling] = (begun.step.type, begun.step.status, offered["apply_patch"])
            assert begun.step.versions.tools[0].decision == offered["apply_patch"]
        except grpc.RpcError as error:
            assert error.code() == DENIED
            step = list_steps(stubs, run.id)[-1]
            assert step.status == E.STEP_STATUS_DENIED
            assert step.versions.tools[0].decision == E.PERMISSION_DECISION_DENY
            results[ceiling] = (step.type, step.status, offered["apply_patch"])
    assert results == {
        E.PERMISSION_CEILING_FULL: (
            E.STEP_TYPE_TOOL_CALL,
            E.STEP_STATUS_STARTED,
            E.PERMISSION_DECISION_ALLOW,
        ),
        E.PERMISSION_CEILING_APPROVE_SIDE_EFFECTS: (
            E.STEP_TYPE_APPROVAL_REQUEST,
            E.STEP_STATUS_WAITING_APPROVAL,
            E.PERMISSION_DECISION_REQUIRE_APPROVAL,
        ),
        E.PERMISSION_CEILING_READ_ONLY: (
            E.STEP_TYPE_TOOL_CALL,
            E.STEP_STATUS_DENIED,
            E.PERMISSION_DECISION_DENY,
        ),
    }


def test_steps_resolve_the_pinned_definition_after_the_registry_moves_on(stubs: Stubs) -> None:
    stubs.publish_agent()
    v7 = closure(stubs, "coding_agent:prod")
    run = stubs.run(stubs.thread().id)
    assert run.agent.agent_digest == v7.digest

    # After the run was created: newer skill and tool versions, a new agent version, and the
    # tag moved to it.
    registry_data.publish_all(
        stubs.registry,
        [
            registry_data.skill("repo-debug", "2.2.0", instructions="Newer instructions."),
            registry_data.tool(
                "apply_patch",
                "3",
                {
                    "type": "object",
                    "properties": {"diff": {"type": "string"}},
                    "required": ["diff"],
                },
                side_effects=True,
            ),
        ],
    )
    v8 = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(
            definition=registry_data.coding_definition(
                label="agent_v8", apply_patch="apply_patch@3"
            )
        ),
        timeout=T,
    ).agent_version
    stubs.registry.SetTag(
        rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8.digest), timeout=T
    )
    assert closure(stubs, "coding_agent:prod").digest == v8.digest != v7.digest

    w = acquire(stubs)
    assert w.run_id == run.id and w.acquired.agent.agent_digest == v7.digest
    model = w.model(skills=["repo-debug"], tools=["apply_patch"])
    [skill] = model.step.versions.skills
    assert (skill.version, skill.digest) == ("2.1.0", v7.closure.skills[0].digest)
    assert model.resolved.skills[0].instructions == "Reproduce, bisect, fix."
    [tool] = model.step.versions.tools
    pinned_patch = next(t for t in v7.closure.tools if t.name == "apply_patch")
    assert (tool.version, tool.schema_digest) == ("2", pinned_patch.schema_digest)
    # Arguments are checked against the pinned v2 schema ({patch}), not v3's ({diff}).
    call = w.tool("apply_patch", "p1", patch="--- a\n+++ b\n")
    assert call.step.type == E.STEP_TYPE_APPROVAL_REQUEST
    assert call.step.versions.tools[0].version == "2"
    expect(grpc.StatusCode.INVALID_ARGUMENT, w.tool, "apply_patch", "p2", diff="x")

    # A run created now binds the new version and resolves its components.
    fresh = stubs.run(stubs.thread().id)
    assert fresh.agent.agent_digest == v8.digest
    w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT)
    w8 = acquire(stubs)
    assert w8.run_id == fresh.id
    newer = w8.model(skills=["repo-debug"], tools=["apply_patch"]).step.versions
    assert newer.skills[0].version == "2.2.0" and newer.tools[0].version == "3"
