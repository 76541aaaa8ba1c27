"""A realistic history for the audit tests, built through real gRPC: the service suite reads it
through AuditService, the e2e suite through the ``agentrt audit`` command.

coding_agent@agent_v7 published with CI provenance and tagged ``prod`` and ``stable``; run A
via ``coding_agent:prod`` makes a rate-limited model call, a fallback call, a read_file call
whose output is stored as a blob and made an artifact, and completes. Then ``prod`` moves to
agent_v8 (repo-debug@2.2.0, apply_patch@3); run B via ``coding_agent:prod`` reads the same blob
as its input; run C via the label ``coding_agent@agent_v7`` makes one model call.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests import registry_data
from tests.runtime_support import Stubs
from tests.service.steps_support import args, put_blob
from tests.support import ServerThread


@dataclass
class Env:
    """A server and stubs for the audit tests (the ``env`` fixture of tests/service/conftest.py)."""

    stubs: Stubs
    audit: Any
    server: ServerThread


PROVENANCE = rmsg.Provenance(
    publisher="ci-bot",
    source_repo="https://git.example.com/agents/coding",
    commit="4f2c9e1",
    pipeline_url="https://ci.example.com/pipelines/812",
)


@dataclass
class History:
    v7: str
    v8: str
    run_a: str
    run_b: str
    run_c: str
    artifact: str
    blob: str
    #: Run A's steps by role.
    a_model: str
    a_fallback: str
    a_read: str
    b_model: str
    b_read: str
    b_approval: str
    b_patch: str
    checkpoint: str
    state_blob: str
    c_model: str
    read_file_schema: str
    between_a_and_c: dt.datetime


def _step(stubs: Stubs, fence: Any, turn: str, kind: str, key: str, **spec: Any) -> Any:
    types = {
        "model": enum_pb2.STEP_TYPE_MODEL_CALL,
        "tool": enum_pb2.STEP_TYPE_TOOL_CALL,
    }
    request = wpb.BeginStepRequest(
        fence=fence, turn_id=turn, type=types[kind], idempotency_key=key, **spec
    )
    return stubs.worker.BeginStep(request, timeout=10)


def _end(stubs: Stubs, fence: Any, step_id: str, **kw: Any) -> None:
    kw.setdefault("status", enum_pb2.STEP_STATUS_SUCCEEDED)
    stubs.worker.EndStep(wpb.EndStepRequest(fence=fence, step_id=step_id, **kw), timeout=10)


def _publish(stubs: Stubs, definition: rmsg.AgentDefinition) -> str:
    return str(
        stubs.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=definition, provenance=PROVENANCE),
            timeout=10,
        ).agent_version.digest
    )


def _tag(stubs: Stubs, tag: str, digest: str) -> None:
    stubs.registry.SetTag(
        rpb.SetTagRequest(agent_id="coding_agent", tag=tag, digest=digest, actor="deployer"),
        timeout=10,
    )


def build_history(stubs: Stubs) -> History:
    registry_data.publish_all(stubs.registry, registry_data.coding_components())
    v7 = _publish(stubs, registry_data.coding_definition())
    _tag(stubs, "prod", v7)
    _tag(stubs, "stable", v7)
    tool = stubs.registry.GetComponent(rpb.GetComponentRequest(ref="read_file@1")).component

    # Run A on v7 (via coding_agent:prod).
    run_a = stubs.run(stubs.thread().id)
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    spec = message_pb2.ModelCallSpec(
        estimated_input_tokens=100, skills=["repo-debug"], tools=["read_file"]
    )
    a_model = _step(stubs, fence, turn, "model", "m1", model_call=spec).step.id
    _end(
        stubs,
        fence,
        a_model,
        status=enum_pb2.STEP_STATUS_FAILED,
        error_class=enum_pb2.ERROR_CLASS_RATE_LIMITED,
    )
    retry = message_pb2.ModelCallSpec(
        estimated_input_tokens=100,
        skills=["repo-debug"],
        tools=["read_file"],
        previous_error_class=enum_pb2.ERROR_CLASS_RATE_LIMITED,
        previous_candidate="primary",
    )
    a_fallback = _step(stubs, fence, turn, "model", "m1", model_call=retry).step.id
    _end(stubs, fence, a_fallback, reported_model_id="gpt-4.1-2025")
    read_call = message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="src/app.py"))
    a_read = _step(stubs, fence, turn, "tool", "r1", tool_call=read_call).step.id
    blob = put_blob(stubs, b"def app():\n    return 42\n").blob.digest
    _end(stubs, fence, a_read, output_ref=blob)
    artifact = stubs.worker.CreateArtifact(
        wpb.CreateArtifactRequest(
            fence=fence, step_id=a_read, name="app.py", blob_digest=blob, labels={"kind": "src"}
        ),
        timeout=10,
    ).artifact.id
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn), timeout=10)
    stubs.complete(fence)

    # prod moves to v8 after run A was created.
    registry_data.publish_all(
        stubs.registry,
        [
            registry_data.skill("repo-debug", "2.2.0", "Reproduce, bisect, fix, add a test."),
            registry_data.tool(
                "apply_patch",
                "3",
                {"type": "object", "properties": {"patch": {"type": "string"}}},
                side_effects=True,
            ),
        ],
    )
    v8 = _publish(stubs, registry_data.coding_definition("agent_v8", "apply_patch@3"))
    _tag(stubs, "prod", v8)

    # Run B on v8 (via coding_agent:prod): a steer consumed by its model call, A's output
    # blob as a tool call's input, a checkpoint, and apply_patch behind an approval, called
    # by a second attempt once approved.
    run_b = stubs.run(stubs.thread().id)
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    stubs.runtime.SendInput(
        pb.SendInputRequest(
            run_id=run_b.id,
            kind=enum_pb2.INPUT_KIND_STEER,
            content="prefer small diffs",
            sender="alice",
        ),
        timeout=10,
    )
    b_model = _step(stubs, fence, turn, "model", "m1", model_call=spec).step.id
    _end(stubs, fence, b_model, reported_model_id="claude-sonnet-4")
    b_read = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="r1",
            input_ref=blob,
            tool_call=read_call,
        ),
        timeout=10,
    ).step.id
    _end(stubs, fence, b_read)
    state = put_blob(stubs, b'{"files": ["src/app.py"]}', "application/json").blob.digest
    checkpoint = stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=fence, state_ref=state, after_sequence=2), timeout=10
    ).checkpoint
    patch = message_pb2.ToolCallSpec(tool="apply_patch", arguments=args(patch="--- a\n+++ b\n"))
    approval = _step(stubs, fence, turn, "tool", "p1", tool_call=patch).step
    assert approval.type == enum_pb2.STEP_TYPE_APPROVAL_REQUEST
    stubs.finish(fence, enum_pb2.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    stubs.runtime.ResolveApproval(
        pb.ResolveApprovalRequest(
            run_id=run_b.id,
            step_id=approval.id,
            decision=enum_pb2.APPROVAL_DECISION_APPROVE,
            approver="alice",
            comment="small and safe",
        ),
        timeout=10,
    )
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    b_patch = _step(stubs, fence, turn, "tool", "p1", tool_call=patch).step.id
    _end(stubs, fence, b_patch, side_effect=True)
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn), timeout=10)
    stubs.complete(fence)
    between = dt.datetime.now(dt.UTC)

    # Run C on v7 by label.
    run_c = stubs.run(stubs.thread().id, ref="coding_agent@agent_v7")
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    c_model = _step(stubs, fence, turn, "model", "m1", model_call=spec).step.id
    _end(stubs, fence, c_model, reported_model_id="claude-sonnet-4-20250514")
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn), timeout=10)
    stubs.complete(fence)
    return History(
        v7=v7,
        v8=v8,
        run_a=run_a.id,
        run_b=run_b.id,
        run_c=run_c.id,
        artifact=artifact,
        blob=blob,
        a_model=a_model,
        a_fallback=a_fallback,
        a_read=a_read,
        b_model=b_model,
        b_read=b_read,
        b_approval=approval.id,
        b_patch=b_patch,
        checkpoint=checkpoint.id,
        state_blob=state,
        c_model=c_model,
        read_file_schema=tool.schema_digest,
        between_a_and_c=between,
    )
