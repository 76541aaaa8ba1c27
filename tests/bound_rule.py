"""``BoundAgent.definition_json`` checked by the rules docs/digest.md §1.5 states, and nothing
else: written from the documentation alone (no import from the project), so a test that uses
it checks that the document, not our code, lets a worker recompute every digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

_KINDS = {
    "system_prompt": "PROMPT",
    "model_policy": "MODEL_POLICY",
    "skills": "SKILL",
    "tools": "TOOL",
    "permission_policy": "PERMISSION_POLICY",
    "completion_policy": "COMPLETION_POLICY",
}


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def check(definition_json: bytes, agent_digest: str) -> dict[str, Any]:
    """Check every digest of a bound definition from its bytes alone; return it parsed.

    Raises:
        AssertionError: the bytes are not canonical, or a digest does not recompute.
    """
    document: dict[str, Any] = json.loads(definition_json)
    # Canonical: JCS of what it parses to is the very bytes (numbers parsed as doubles).
    assert rfc8785.dumps(json.loads(definition_json, parse_int=float)) == definition_json
    assert set(document) == {"type", "agent_digest", "agent", "components"}
    assert document["type"] == "agentrt.bound_agent.v1"
    assert document["agent_digest"] == agent_digest
    agent = document["agent"]
    assert agent["type"] == "agentrt.agent.v1"
    assert _digest(agent) == agent_digest, "the agent digest does not recompute"
    components = document["components"]
    seen = set()
    for slot, kind in _KINDS.items():
        value = agent.get(slot)
        entries = value if isinstance(value, list) else [value] if value is not None else []
        for entry in entries:
            component = components[entry["digest"]]
            assert _digest(component) == entry["digest"], f"{slot} does not recompute"
            assert component["type"] == "agentrt.component.v1"
            assert component["kind"] == kind
            assert "description" in component
            # The entry names what the document says (both absent for an inline prompt).
            assert component.get("name") == entry.get("name")
            assert component.get("version") == entry.get("version")
            if kind == "TOOL":
                assert _digest(component["spec"]["input_schema"]) == entry["schema_digest"]
            seen.add(entry["digest"])
    assert seen == set(components), "components no entry names"
    return document
