"""A run keeps the whole resolution record of its agent reference (issue 17, item 11).

The registry's ``Resolution`` (GetAgentVersion) says how a reference resolved: its kind, the
digest, and for a tag its name and the tag event that set the target read. ``Run.agent``
keeps the same record, read back through GetRun, and the run's first event commits to it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from tests import registry_data
from tests.runtime_support import Stubs, get_run


def _registry_resolution(stubs: Stubs, ref: str) -> Any:
    return stubs.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref=ref), timeout=10
    ).resolution


def _run_created_agent(stubs: Stubs, run_id: str) -> dict[str, Any]:
    stream = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run_id), timeout=10)
    first = next(iter(stream)).event
    stream.cancel()
    assert first.event_type == E.EVENT_TYPE_RUN_CREATED
    agent: dict[str, Any] = json_format.MessageToDict(
        first.run_created_attributes.agent, preserving_proto_field_name=True
    )
    return agent


def _same_kind(runtime_kind: int, registry_kind: int) -> bool:
    # The two enums share names, not numbers.
    return E.ReferenceKind.Name(runtime_kind).removeprefix("REFERENCE_KIND_") == (
        renum.ReferenceKind.Name(registry_kind).removeprefix("REFERENCE_KIND_")
    )


def test_a_tag_reference_keeps_its_kind_tag_and_tag_event(stubs: Stubs) -> None:
    v7 = stubs.publish_agent()
    run = stubs.run(stubs.thread().id, ref="coding_agent:prod")
    history = stubs.registry.ListTagHistory(
        rpb.ListTagHistoryRequest(agent_id="coding_agent", tag="prod"), timeout=10
    ).events
    agent = get_run(stubs, run.id).agent
    assert agent.reference_kind == E.REFERENCE_KIND_TAG
    assert agent.resolved_via_tag == "prod"
    assert agent.tag_event_sequence == history[0].sequence > 0
    assert (history[0].to_digest, agent.agent_digest) == (v7, v7)
    registry = _registry_resolution(stubs, "coding_agent:prod")
    assert _same_kind(agent.reference_kind, registry.kind)
    assert agent.tag_event_sequence == registry.tag_event_sequence

    # The tag moves: a later run records the move it read, the first keeps its own.
    v8 = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition("agent_v8")),
        timeout=10,
    ).agent_version.digest
    moved = stubs.registry.SetTag(
        rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8), timeout=10
    ).event
    later = get_run(stubs, stubs.run(stubs.thread().id, ref="coding_agent:prod").id).agent
    assert (later.agent_digest, later.tag_event_sequence) == (v8, moved.sequence)
    assert moved.sequence > agent.tag_event_sequence
    assert get_run(stubs, run.id).agent == agent

    # The run's first event commits to the same record.
    created = _run_created_agent(stubs, run.id)
    assert created["reference_kind"] == "REFERENCE_KIND_TAG"
    assert created["tag_event_sequence"] == str(agent.tag_event_sequence)


def test_a_version_label_reference_is_recorded_as_a_label(stubs: Stubs) -> None:
    stubs.publish_agent()
    run = stubs.run(stubs.thread().id, ref="coding_agent@agent_v7")
    agent = get_run(stubs, run.id).agent
    assert agent.reference_kind == E.REFERENCE_KIND_LABEL
    assert (agent.resolved_via_tag, agent.tag_event_sequence) == ("", 0)
    assert _same_kind(agent.reference_kind, _registry_resolution(stubs, agent.requested_ref).kind)
    assert _run_created_agent(stubs, run.id)["reference_kind"] == "REFERENCE_KIND_LABEL"


def test_a_digest_reference_is_recorded_as_a_digest(stubs: Stubs) -> None:
    digest = stubs.publish_agent()
    thread = stubs.thread()
    for ref in (f"coding_agent@{digest}", digest):
        run = stubs.run(thread.id, ref=ref)
        agent = get_run(stubs, run.id).agent
        assert agent.requested_ref == ref
        assert agent.reference_kind == E.REFERENCE_KIND_DIGEST
        assert (agent.resolved_via_tag, agent.tag_event_sequence) == ("", 0)
        assert _same_kind(agent.reference_kind, _registry_resolution(stubs, ref).kind)
        assert _run_created_agent(stubs, run.id)["reference_kind"] == "REFERENCE_KIND_DIGEST"
