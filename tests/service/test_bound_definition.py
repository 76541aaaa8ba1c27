"""AcquireRun hands a worker a definition it can verify (issue 17, item 5), on both engines.

The digest vectors' components are published through the API; a worker recomputes the agent
digest and every component digest from ``BoundAgent.definition_json`` alone, by the rules of
docs/digest.md (tests/bound_rule.py), and finds each component's document byte for byte as
the vectors have it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import message_pb2
from agentrt_core import registry_map
from agentrt_core.jcs import canonical_bytes
from agentrt_core.specs import ComponentKind, normalise_spec
from tests import bound_rule
from tests.runtime_support import Stubs

_VECTORS = Path(__file__).resolve().parents[1] / "vectors"
# The component vectors the registry accepts for publishing (others are digest edge cases:
# a TOOL without a description, an anonymous PROMPT).
_PUBLISHABLE = (
    "prompt",
    "model_policy",
    "tool",
    "skill_set_ordering",
    "permission_policy",
    "completion_policy",
)


def _vector(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def _publish_components(stubs: Stubs) -> dict[str, str]:
    """Publish the vectors' components; return each one's ``name@version``."""
    refs = {}
    for name in _PUBLISHABLE:
        args = _vector(name)["input"]
        kind = ComponentKind(args["kind"])
        draft = rmsg.ComponentDraft(
            kind=registry_map.kind_to_proto(kind),
            name=args["name"],
            version=args["version"],
            description=args["description"],
            spec=registry_map.spec_to_proto(kind, normalise_spec(kind, args["spec"])),
        )
        published = stubs.registry.PublishComponent(
            rpb.PublishComponentRequest(component=draft), timeout=10
        ).component
        assert published.digest == _vector(name)["digest"]
        refs[name] = f"{args['name']}@{args['version']}"
    return refs


def _acquired_definition(stubs: Stubs, definition: rmsg.AgentDefinition) -> Any:
    digest = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=definition), timeout=10
    ).agent_version.digest
    stubs.run(stubs.thread().id, ref=digest)
    got = stubs.acquire(filter=message_pb2.AcquireFilter(agent_ids=[definition.agent_id]))
    assert got.agent.agent_digest == digest
    return got.agent


def test_a_worker_recomputes_every_digest_from_the_bound_definition(stubs: Stubs) -> None:
    refs = _publish_components(stubs)
    canonical_by_digest = {_vector(n)["digest"]: _vector(n)["canonical"] for n in _PUBLISHABLE}

    # agent_inline_prompt.json, published: the inline prompt and the model policy.
    inline = _vector("agent_inline_prompt")
    agent = _acquired_definition(
        stubs,
        rmsg.AgentDefinition(
            agent_id=inline["input"]["agent_id"],
            version_label=inline["input"]["version_label"],
            description=inline["input"]["description"],
            system_prompt=rmsg.SystemPrompt(text=_vector("prompt_inline")["input"]["spec"]["text"]),
            model_policy=refs["model_policy"],
        ),
    )
    assert agent.agent_digest == inline["digest"]
    document = bound_rule.check(agent.definition_json, agent.agent_digest)
    assert canonical_bytes(document["agent"]).decode() == inline["canonical"]
    prompt = _vector("prompt_inline")
    assert (
        canonical_bytes(document["components"][prompt["digest"]]).decode() == (prompt["canonical"])
    )

    # Every kind, each with a description: the documents are the vectors'.
    agent = _acquired_definition(
        stubs,
        rmsg.AgentDefinition(
            agent_id="vector_agent",
            version_label="v1",
            description="Every publishable vector.",
            system_prompt=rmsg.SystemPrompt(ref=refs["prompt"]),
            model_policy=refs["model_policy"],
            skills=[refs["skill_set_ordering"]],
            tools=[refs["tool"]],
            permission_policy=refs["permission_policy"],
            completion_policy=refs["completion_policy"],
        ),
    )
    document = bound_rule.check(agent.definition_json, agent.agent_digest)
    assert set(document["components"]) == set(canonical_by_digest)
    for digest, component in document["components"].items():
        assert canonical_bytes(component).decode() == canonical_by_digest[digest]
    described = [c["description"] for c in document["components"].values()]
    assert "Sonnet first; GPT-4.1 when rate limited." in described
    assert list(agent.tool_names) == ["read_file"]
    assert list(agent.skill_names) == ["repo-debug"]
    assert list(agent.completion_checks) == ["diff-reviewed", "tests-pass"]
