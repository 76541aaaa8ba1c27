"""Registry protos for tests: the seed's coding_agent and its components."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def tool(
    name: str, version: str, schema: dict[str, Any] | None = None, *, side_effects: bool = False
) -> message_pb2.ComponentDraft:
    schema = schema or {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    }
    return message_pb2.ComponentDraft(
        kind=enum_pb2.COMPONENT_KIND_TOOL,
        name=name,
        version=version,
        description=f"the {name} tool",
        spec=message_pb2.ComponentSpec(
            tool=message_pb2.ToolSpec(
                description=f"{name}: does its thing",
                input_schema=struct(schema),
                side_effects=side_effects,
            )
        ),
    )


def skill(
    name: str, version: str, instructions: str = "Reproduce, bisect, fix."
) -> message_pb2.ComponentDraft:
    return message_pb2.ComponentDraft(
        kind=enum_pb2.COMPONENT_KIND_SKILL,
        name=name,
        version=version,
        spec=message_pb2.ComponentSpec(
            skill=message_pb2.SkillSpec(
                description="Debug a repository",
                instructions=instructions,
                files=[message_pb2.SkillFile(path="checklist.md", content="- run the tests\n")],
            )
        ),
    )


def model_policy(name: str = "coding-balanced", version: str = "3") -> message_pb2.ComponentDraft:
    return message_pb2.ComponentDraft(
        kind=enum_pb2.COMPONENT_KIND_MODEL_POLICY,
        name=name,
        version=version,
        spec=message_pb2.ComponentSpec(
            model_policy=message_pb2.ModelPolicySpec(
                candidates=[
                    message_pb2.ModelCandidate(
                        name="primary",
                        provider="anthropic",
                        model_id="claude-sonnet-4",
                        parameters=struct({"temperature": 0.2, "max_tokens": 4096}),
                        max_context_tokens=200000,
                        fallback_on=[
                            enum_pb2.ERROR_CLASS_RATE_LIMITED,
                            enum_pb2.ERROR_CLASS_PROVIDER_TIMEOUT,
                        ],
                    ),
                    message_pb2.ModelCandidate(
                        name="fallback",
                        provider="openai",
                        model_id="gpt-4.1",
                        parameters=struct({"temperature": 0.2}),
                    ),
                ]
            )
        ),
    )


def permission_policy(
    name: str = "workspace-safe", version: str = "4"
) -> message_pb2.ComponentDraft:
    return message_pb2.ComponentDraft(
        kind=enum_pb2.COMPONENT_KIND_PERMISSION_POLICY,
        name=name,
        version=version,
        spec=message_pb2.ComponentSpec(
            permission_policy=message_pb2.PermissionPolicySpec(
                rules=[
                    message_pb2.PermissionRule(
                        tool="read_file", decision=enum_pb2.PERMISSION_DECISION_ALLOW
                    ),
                    message_pb2.PermissionRule(
                        tool="apply_patch", decision=enum_pb2.PERMISSION_DECISION_REQUIRE_APPROVAL
                    ),
                ],
                default_decision=enum_pb2.PERMISSION_DECISION_DENY,
            )
        ),
    )


def completion_policy(
    name: str = "test-and-diff", version: str = "3"
) -> message_pb2.ComponentDraft:
    return message_pb2.ComponentDraft(
        kind=enum_pb2.COMPONENT_KIND_COMPLETION_POLICY,
        name=name,
        version=version,
        spec=message_pb2.ComponentSpec(
            completion_policy=message_pb2.CompletionPolicySpec(
                checks=[
                    message_pb2.CompletionCheck(
                        name="tests-pass", description="the suite is green"
                    ),
                    message_pb2.CompletionCheck(name="diff-reviewed", description="a diff exists"),
                ]
            )
        ),
    )


def coding_components(apply_patch_version: str = "2") -> list[message_pb2.ComponentDraft]:
    return [
        skill("repo-debug", "2.1.0"),
        tool("read_file", "1"),
        tool(
            "apply_patch",
            apply_patch_version,
            {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]},
            side_effects=True,
        ),
        tool("run_tests", "1", {"type": "object", "properties": {}}),
        model_policy(),
        permission_policy(),
        completion_policy(),
    ]


def coding_definition(
    label: str = "agent_v7", apply_patch: str = "apply_patch@2", agent_id: str = "coding_agent"
) -> message_pb2.AgentDefinition:
    return message_pb2.AgentDefinition(
        agent_id=agent_id,
        version_label=label,
        description="Fixes failing tests in a repository.",
        system_prompt=message_pb2.SystemPrompt(text="You are a careful coding agent."),
        model_policy="coding-balanced@3",
        skills=["repo-debug@^2.1"],
        tools=["read_file@1", apply_patch, "run_tests@1"],
        permission_policy="workspace-safe@4",
        completion_policy="test-and-diff@3",
    )


def publish_all(stub: Any, drafts: list[message_pb2.ComponentDraft]) -> None:
    for draft in drafts:
        stub.PublishComponent(pb.PublishComponentRequest(component=draft), timeout=10)
