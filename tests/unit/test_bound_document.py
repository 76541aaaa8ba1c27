"""The bound definition a worker is handed is canonical and complete (issue 17, item 5):
built from the digest vectors, every digest recomputes from its bytes alone, and each member
is exactly the vector's document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrt_core import publishing, resolution
from agentrt_core.canonical import ComponentKind
from agentrt_core.jcs import canonical_bytes
from agentrt_core.model import ClosureEntry, ComponentDraft
from tests import bound_rule

_VECTORS = Path(__file__).resolve().parents[1] / "vectors"
_SLOT_KINDS = {
    "system_prompt": ComponentKind.PROMPT,
    "model_policy": ComponentKind.MODEL_POLICY,
    "skills": ComponentKind.SKILL,
    "tools": ComponentKind.TOOL,
    "permission_policy": ComponentKind.PERMISSION_POLICY,
    "completion_policy": ComponentKind.COMPLETION_POLICY,
}


def _vectors() -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(_VECTORS.glob("*.json"))]


def _bound(agent_vector: dict[str, Any]) -> bytes:
    """The bytes AcquireRun would hand out for an agent vector, its components the vectors'."""
    by_digest = {v["digest"]: v["input"] for v in _vectors() if v["kind"] == "component"}
    args = agent_vector["input"]
    closure = []
    for slot, kind in _SLOT_KINDS.items():
        value = args["closure"].get(slot)
        for e in value if isinstance(value, list) else [value] if value else []:
            name = e.get("name", "")
            closure.append(
                ClosureEntry(
                    f"{slot}[{name}]" if isinstance(value, list) else slot,
                    kind,
                    name,
                    e.get("version", ""),
                    e["digest"],
                    "",
                    e.get("schema_digest"),
                )
            )
    drafts = {
        e.digest: ComponentDraft(
            ComponentKind(c["kind"]), c["name"], c["version"], c["description"], c["spec"]
        )
        for e in closure
        for c in [by_digest[e.digest]]
    }
    document = publishing.bound_agent_document(
        agent_vector["digest"],
        args["agent_id"],
        args["version_label"],
        args["description"],
        closure,
        drafts,
    )
    return canonical_bytes(document)


def test_every_digest_recomputes_from_the_bound_definition_alone() -> None:
    vectors = _vectors()
    canonical_by_digest = {v["digest"]: v["canonical"] for v in vectors}
    agents = [v for v in vectors if v["kind"] == "agent"]
    assert len(agents) >= 2
    for vector in agents:
        data = _bound(vector)
        document = bound_rule.check(data, vector["digest"])
        # Each member is byte for byte the vector's document: the agent's and every component's.
        assert canonical_bytes(document["agent"]).decode() == vector["canonical"]
        for digest, component in document["components"].items():
            assert canonical_bytes(component).decode() == canonical_by_digest[digest]
        # The runtime reads its bound definition from the same document.
        bound = resolution.bound_definition(document)
        assert bound.digest == vector["digest"]
        assert bound.model_policy.spec == document["components"][bound.model_policy.digest]["spec"]
