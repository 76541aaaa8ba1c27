"""Property: whatever a caller sends, publishing answers a deliberate status, never INTERNAL.

Hypothesis generates component drafts and agent definitions mixing valid and invalid names,
versions, references, JSON Schemas and spec contents, and sends them through real gRPC.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.registry.v1 import enum_pb2, message_pb2, registry_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as pb
from tests import registry_data as data

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
}

names = st.one_of(
    st.sampled_from(["read_file", "repo-debug", "apply_patch", "x", "coding_agent"]),
    st.text(min_size=0, max_size=12),
)
versions = st.one_of(
    st.sampled_from(["1", "2", "2.1.0", "1.0.0-rc.1", "01", "1.2", "v1", "", "^2.1"]),
    st.text(max_size=8),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
schemas = st.one_of(
    st.just({"type": "object"}),
    st.dictionaries(
        st.sampled_from(
            ["type", "properties", "required", "minimum", "items", "$ref", "enum", "x"]
        ),
        json_values,
        max_size=4,
    ),
)


@st.composite
def drafts(draw: Any) -> message_pb2.ComponentDraft:
    kind = draw(st.sampled_from(list(enum_pb2.ComponentKind.values())))
    draft = message_pb2.ComponentDraft(
        kind=kind, name=draw(names), version=draw(versions), description=draw(st.text(max_size=10))
    )
    case = draw(
        st.sampled_from(
            [
                "prompt",
                "skill",
                "tool",
                "model_policy",
                "permission_policy",
                "completion_policy",
                None,
            ]
        )
    )
    if case == "prompt":
        draft.spec.prompt.text = draw(st.text(max_size=20))
    elif case == "skill":
        draft.spec.skill.description = draw(st.text(max_size=5))
        draft.spec.skill.instructions = draw(st.text(max_size=5))
        for path in draw(
            st.lists(st.sampled_from(["a.md", "../x", "/abs", "a.md", "b/c.txt", ""]), max_size=3)
        ):
            draft.spec.skill.files.add(path=path, content=draw(st.text(max_size=5)))
    elif case == "tool":
        draft.spec.tool.description = draw(st.text(max_size=5))
        if draw(st.booleans()):
            # A value Struct itself cannot hold is simply not sent.
            with contextlib.suppress(ValueError, TypeError):
                draft.spec.tool.input_schema.CopyFrom(data.struct(draw(schemas)))
    elif case == "model_policy":
        for _ in range(draw(st.integers(0, 3))):
            draft.spec.model_policy.candidates.add(
                name=draw(st.sampled_from(["a", "b", "a", ""])),
                provider=draw(st.sampled_from(["p", ""])),
                model_id=draw(st.sampled_from(["m", ""])),
                max_context_tokens=draw(st.integers(-5, 10**9)),
                fallback_on=draw(st.lists(st.integers(0, 20), max_size=3)),
            )
    elif case == "permission_policy":
        draft.spec.permission_policy.default_decision = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 3))):
            draft.spec.permission_policy.rules.add(
                tool=draw(names), decision=draw(st.integers(0, 5))
            )
    elif case == "completion_policy":
        for _ in range(draw(st.integers(0, 3))):
            draft.spec.completion_policy.checks.add(name=draw(st.sampled_from(["t", "t", "", "u"])))
    return draft


refs = st.one_of(
    st.sampled_from(
        [
            "read_file@1",
            "apply_patch@2",
            "repo-debug@^2.1",
            "repo-debug@2.1.0",
            "workspace-safe@4",
            "coding-balanced@3",
            "test-and-diff@3",
            "run_tests@1",
            "nope@1",
            "read_file:prod",
            "sha256:" + "a" * 64,
            "read_file@sha256:" + "b" * 64,
            "",
            "@",
            "x@",
            "UP@1",
        ]
    ),
    st.text(max_size=10),
)


@st.composite
def definitions(draw: Any) -> message_pb2.AgentDefinition:
    definition = message_pb2.AgentDefinition(
        agent_id=draw(names),
        version_label=draw(
            st.one_of(st.sampled_from(["agent_v7", "v8", "", "sha256:x"]), st.text(max_size=6))
        ),
        model_policy=draw(refs),
        skills=draw(st.lists(refs, max_size=3)),
        tools=draw(st.lists(refs, max_size=4)),
        permission_policy=draw(refs),
        completion_policy=draw(refs),
    )
    if draw(st.booleans()):
        definition.system_prompt.text = draw(st.text(max_size=10))
    elif draw(st.booleans()):
        definition.system_prompt.ref = draw(refs)
    return definition


@pytest.fixture
def seeded(
    stub: registry_service_pb2_grpc.RegistryServiceStub,
) -> registry_service_pb2_grpc.RegistryServiceStub:
    """The registry stub with coding_agent's components published, so that some of the drafts'
    and definitions' references resolve."""
    data.publish_all(stub, data.coding_components())
    return stub


def _code(call: Any, request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=10)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(draft=drafts())
def test_publish_component_never_internal(seeded: Any, draft: message_pb2.ComponentDraft) -> None:
    assert _code(seeded.PublishComponent, pb.PublishComponentRequest(component=draft)) in ALLOWED
    assert _code(seeded.ComputeDigest, pb.ComputeDigestRequest(component=draft)) in ALLOWED


@_SETTINGS
@given(definition=definitions())
def test_publish_agent_never_internal(seeded: Any, definition: message_pb2.AgentDefinition) -> None:
    assert (
        _code(seeded.PublishAgentVersion, pb.PublishAgentVersionRequest(definition=definition))
        in ALLOWED
    )
    assert (
        _code(seeded.GetAgentVersion, pb.GetAgentVersionRequest(ref=definition.model_policy))
        in ALLOWED
    )
