"""The digest test vectors in tests/vectors/*.json hold, and hold independently.

Each vector is checked three ways: our document functions must reproduce its ``canonical``
text byte for byte; ``hashlib`` on that text must give its ``digest`` (so the digest is not
just whatever our code says); and the ``rfc8785`` reference library must leave the text
unchanged (so the text really is JCS). A change to the digest rules shows up here first.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from google.protobuf import json_format

from agentrt.runtime.v1 import event_pb2
from agentrt_core import event_chain
from agentrt_core.canonical import (
    AgentClosure,
    ComponentKind,
    agent_digest,
    agent_document,
    component_digest,
    component_document,
    tool_digests,
)
from agentrt_core.jcs import canonical_bytes, schema_digest

VECTORS_DIR = Path(__file__).resolve().parents[1] / "vectors"
VECTOR_FILES = sorted(VECTORS_DIR.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def document_and_digest(vector: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Rebuild a vector's document and digest through the public API."""
    args = vector["input"]
    match vector["kind"]:
        case "component":
            return component_document(**args), component_digest(**args)
        case "agent":
            closure = AgentClosure.from_mapping(args["closure"])
            head = (args["agent_id"], args["version_label"], args["description"])
            return agent_document(*head, closure), agent_digest(*head, closure)
        case "schema":
            return args["schema"], schema_digest(args["schema"])
        case "event":
            return _event_document_and_hash(args)
    raise AssertionError(f"unknown vector kind {vector['kind']!r}")


def _event_document_and_hash(wire: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """An event vector's document and hash, the way the runtime writes them."""
    event = json_format.ParseDict(wire, event_pb2.Event())
    attributes = getattr(event, str(event.WhichOneof("attributes")))
    members = {
        "event_id": event.id,
        "thread_id": event.thread_id,
        "run_id": event.run_id,
        "sequence": event.sequence,
        "event_type": event_chain.event_type_name(attributes),
        "event_time": event_chain.format_time(event.event_time.ToDatetime(dt.UTC)),
        "prev_hash": event.prev_hash,
    }
    attributes_json = json_format.MessageToDict(attributes, preserving_proto_field_name=True)
    document = {
        "attributes": attributes_json,
        **{("id" if k == "event_id" else k): v for k, v in members.items()},
        "type": "agentrt.event.v1",
    }
    assert event.hash == event_chain.event_hash(attributes=attributes_json, **members)
    return document, event.hash


def test_the_vector_set_covers_every_rule() -> None:
    vectors = [load(p) for p in VECTOR_FILES]
    assert len(vectors) >= 8
    kinds = {v["input"]["kind"] for v in vectors if v["kind"] == "component"}
    assert kinds == set(ComponentKind)
    assert {v["kind"] for v in vectors} == {"component", "agent", "schema", "event"}
    assert all(set(v) == {"description", "kind", "input", "canonical", "digest"} for v in vectors)
    inputs = {
        "component": {"kind", "name", "version", "description", "spec"},
        "agent": {"agent_id", "version_label", "description", "closure"},
        "schema": {"schema"},
    }
    assert all(set(v["input"]) == inputs[v["kind"]] for v in vectors if v["kind"] in inputs)
    # An event vector's input is an Event as a watcher receives it.
    for v in vectors:
        if v["kind"] == "event":
            assert {"id", "thread_id", "sequence", "event_time", "event_type", "hash"} <= set(
                v["input"]
            )
            assert v["input"]["hash"] == v["digest"]
    # Both component document shapes: named (with version) and the anonymous inline PROMPT.
    components = [json.loads(v["canonical"]) for v in vectors if v["kind"] == "component"]
    assert any("name" not in c and "version" not in c for c in components)
    assert any(c["description"] for c in components)
    assert any(c["description"] == "" for c in components)
    agents = [v["input"]["closure"] for v in vectors if v["kind"] == "agent"]
    assert any(set(a["system_prompt"]) == {"digest"} for a in agents)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector(path: Path) -> None:
    vector = load(path)
    expected = vector["canonical"].encode("utf-8")

    # Independent of our code: the digest is SHA-256 of the canonical text ...
    assert vector["digest"] == "sha256:" + hashlib.sha256(expected).hexdigest()
    # ... and that text is already in JCS form according to the reference library (parsing
    # every number as a double, as JCS does: 100000000000000000000 is 1e20, not a Python int).
    assert rfc8785.dumps(json.loads(vector["canonical"], parse_int=float)) == expected

    document, digest = document_and_digest(vector)
    assert canonical_bytes(document) == expected
    assert digest == vector["digest"]
    if vector["kind"] == "component" and vector["input"]["kind"] == "TOOL":
        args = dict(vector["input"])
        del args["kind"]
        assert tool_digests(**args) == (digest, schema_digest(args["spec"]["input_schema"]))


def test_agent_vectors_are_merkle_trees_over_the_component_vectors() -> None:
    vectors = [load(p) for p in VECTOR_FILES]
    by_digest = {v["digest"]: v for v in vectors}
    agents = [v for v in vectors if v["kind"] == "agent"]
    assert len(agents) >= 2
    for agent in agents:
        closure = agent["input"]["closure"]
        entries = [closure["system_prompt"], closure["model_policy"]]
        entries += closure.get("skills", []) + closure.get("tools", [])
        entries += [closure[k] for k in ("permission_policy", "completion_policy") if k in closure]
        for entry in entries:
            # Every entry is the digest of a component vector published as that name@version
            # (an inline prompt: the anonymous PROMPT, empty name and version).
            component = by_digest[entry["digest"]]["input"]
            assert component["name"] == entry.get("name", "")
            assert component["version"] == entry.get("version", "")
    full = next(a for a in agents if a["input"]["closure"].get("tools"))
    read_file = next(t for t in full["input"]["closure"]["tools"] if t["name"] == "read_file")
    assert by_digest[read_file["schema_digest"]]["kind"] == "schema"
