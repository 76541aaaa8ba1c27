"""The authorisation matrix (issue 16): every RPC, driven by a principal of every role, by a
principal of every role in another namespace and agent scope, and without valid
credentials, on both engines; each answer checked against the matrix in docs/security.md
(which a unit test holds equal to the table the server enforces).

A cell of the docs says what the role may do: ``-`` refused, ``yes`` anywhere, ``ns`` /
``scope`` / ``ns+scope`` only within the principal's namespaces / agent scopes / both. Each
request below says what it touches (the thread, run and blob of namespace ``team-a``, the
agent ``coding_agent``), so a principal of ``team-b`` with scope ``other_agent*`` must be
refused exactly where its role's limit meets what the request touches. Allowed means any
answer but PERMISSION_DENIED and UNAUTHENTICATED (the call may still fail on its own terms:
a fence without its token is LEASE_LOST, a run cancelled by an earlier row is
FAILED_PRECONDITION); refused means PERMISSION_DENIED naming the permission of the docs.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.auth import ROLES, new_token, token_entry
from tests import registry_data
from tests.oidc import Issuer, issuer_config
from tests.runtime_support import Stubs
from tests.support import error_details, serving

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
NS, SCOPE = "ns", "scope"


def _docs_matrix() -> dict[str, tuple[str, dict[str, str]]]:
    """RPC -> (permission, role -> cell), read from docs/security.md."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- permission-matrix:start -->\n(.*?)<!-- permission-matrix:end -->", text, re.S
    )
    assert block is not None
    lines = block.group(1).strip().splitlines()
    roles = [c.strip() for c in lines[0].strip("|").split("|")][2:]
    matrix = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        matrix[cells[0].split(".")[1]] = (
            cells[1].strip("`"),
            dict(zip(roles, cells[2:], strict=True)),
        )
    return matrix


MATRIX = _docs_matrix()


def _expect_allowed(cell: str, touches: set[str], home: bool) -> bool:
    if cell == "-":
        return False
    if home or cell == "yes" or (cell.endswith("(list)") and not touches):
        return True
    return not (set(cell.split(" ")[0].split("+")) & touches)


@dataclass
class World:
    """What the requests touch, made by an admin: in namespace team-a, agent coding_agent."""

    digest: str
    thread_id: str
    run_id: str
    step_id: str
    attempt_id: str
    epoch: int
    blob: str


def _stubs(address: str, token: str | None) -> tuple[Stubs, Any]:
    stubs = Stubs.open(address, token)
    return stubs, audit_service_pb2_grpc.AuditServiceStub(stubs.channel)


def _build_world(admin: Stubs) -> World:
    digest = admin.publish_agent()
    thread = admin.thread(namespace="team-a")
    run = admin.run(thread.id)
    got = admin.acquire()
    assert got.run.id == run.id
    turn = admin.worker.BeginTurn(wpb.BeginTurnRequest(fence=got.fence), timeout=10).turn
    step = admin.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=got.fence,
            turn_id=turn.id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            model_call=message_pb2.ModelCallSpec(estimated_input_tokens=10),
        ),
        timeout=10,
    ).step
    content = b"team-a's notes"
    blob = admin.runtime.PutBlob(
        iter(
            [
                pb.PutBlobRequest(
                    header=message_pb2.BlobHeader(size=len(content), namespace="team-a")
                ),
                pb.PutBlobRequest(chunk=content),
            ]
        ),
        timeout=10,
    ).blob.digest
    return World(digest, thread.id, run.id, step.id, got.attempt.id, got.fence.lease_epoch, blob)


Call = Callable[[Stubs, Any, World], Any]


def _first(responses: Any) -> Any:
    """A server stream's first message (errors surface on the first read)."""
    for response in responses:
        return response
    return None


def _fence(w: World) -> message_pb2.Fence:
    # The public fence: attempt id and epoch, as ListAttempts shows them, without the token.
    return message_pb2.Fence(attempt_id=w.attempt_id, lease_epoch=w.epoch)


_TOOL = registry_data.tool("coding_agent_helper", "1")

#: Every RPC: how to call it, and what of team-a / coding_agent its request touches.
REQUESTS: dict[str, tuple[Call, set[str]]] = {
    "PublishComponent": (
        lambda s, a, w: s.registry.PublishComponent(
            rpb.PublishComponentRequest(component=_TOOL), timeout=10
        ),
        {SCOPE},
    ),
    "GetComponent": (
        lambda s, a, w: s.registry.GetComponent(rpb.GetComponentRequest(ref="read_file@1")),
        set(),
    ),
    "ListComponents": (
        lambda s, a, w: s.registry.ListComponents(rpb.ListComponentsRequest()),
        set(),
    ),
    "PublishAgentVersion": (
        lambda s, a, w: s.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition())
        ),
        {SCOPE},
    ),
    "GetAgentVersion": (
        lambda s, a, w: s.registry.GetAgentVersion(
            rpb.GetAgentVersionRequest(ref="coding_agent:prod")
        ),
        set(),
    ),
    "ListAgentVersions": (
        lambda s, a, w: s.registry.ListAgentVersions(
            rpb.ListAgentVersionsRequest(agent_id="coding_agent")
        ),
        set(),
    ),
    "ComputeDigest": (
        lambda s, a, w: s.registry.ComputeDigest(
            rpb.ComputeDigestRequest(agent_definition=registry_data.coding_definition())
        ),
        set(),
    ),
    "SetTag": (
        lambda s, a, w: s.registry.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag="staging", digest=w.digest)
        ),
        {SCOPE},
    ),
    "DeleteTag": (
        lambda s, a, w: s.registry.DeleteTag(
            rpb.DeleteTagRequest(agent_id="coding_agent", tag="staging")
        ),
        {SCOPE},
    ),
    "ListTags": (
        lambda s, a, w: s.registry.ListTags(rpb.ListTagsRequest(agent_id="coding_agent")),
        set(),
    ),
    "ListTagHistory": (
        lambda s, a, w: s.registry.ListTagHistory(
            rpb.ListTagHistoryRequest(agent_id="coding_agent", tag="prod")
        ),
        set(),
    ),
    "DiffAgentVersions": (
        lambda s, a, w: s.registry.DiffAgentVersions(
            rpb.DiffAgentVersionsRequest(base_ref=w.digest, target_ref="coding_agent:prod")
        ),
        set(),
    ),
    "GetSigningKeys": (
        lambda s, a, w: s.registry.GetSigningKeys(rpb.GetSigningKeysRequest()),
        set(),
    ),
    "GetCheckpoint": (lambda s, a, w: s.registry.GetCheckpoint(rpb.GetCheckpointRequest()), set()),
    "GetInclusionProof": (
        lambda s, a, w: s.registry.GetInclusionProof(rpb.GetInclusionProofRequest(digest=w.digest)),
        set(),
    ),
    "GetConsistencyProof": (
        lambda s, a, w: s.registry.GetConsistencyProof(rpb.GetConsistencyProofRequest(old_size=1)),
        set(),
    ),
    "AttachAttestation": (
        lambda s, a, w: s.registry.AttachAttestation(
            rpb.AttachAttestationRequest(agent_id="coding_agent", digest=w.digest, envelope="{}")
        ),
        {SCOPE},
    ),
    "ListAttestations": (
        lambda s, a, w: s.registry.ListAttestations(rpb.ListAttestationsRequest(digest=w.digest)),
        set(),
    ),
    "GetAgentCard": (
        lambda s, a, w: s.registry.GetAgentCard(rpb.GetAgentCardRequest(ref=w.digest)),
        set(),
    ),
    "GetLogEntries": (
        lambda s, a, w: s.registry.GetLogEntries(rpb.GetLogEntriesRequest(start=0)),
        set(),
    ),
    "CreateThread": (
        lambda s, a, w: s.runtime.CreateThread(pb.CreateThreadRequest(namespace="team-a")),
        {NS},
    ),
    "GetThread": (
        lambda s, a, w: s.runtime.GetThread(pb.GetThreadRequest(thread_id=w.thread_id)),
        {NS},
    ),
    "ListThreads": (
        lambda s, a, w: s.runtime.ListThreads(pb.ListThreadsRequest()),
        set(),
    ),
    "AppendMessage": (
        lambda s, a, w: s.runtime.AppendMessage(
            pb.AppendMessageRequest(
                thread_id=w.thread_id, role=enum_pb2.MESSAGE_ROLE_USER, content="hi"
            )
        ),
        {NS},
    ),
    "ListMessages": (
        lambda s, a, w: s.runtime.ListMessages(pb.ListMessagesRequest(thread_id=w.thread_id)),
        {NS},
    ),
    "WatchThread": (
        lambda s, a, w: _first(
            s.runtime.WatchThread(pb.WatchThreadRequest(thread_id=w.thread_id), timeout=5)
        ),
        {NS},
    ),
    "CreateRun": (
        lambda s, a, w: s.run(w.thread_id),
        {NS},
    ),
    "GetRun": (lambda s, a, w: s.runtime.GetRun(pb.GetRunRequest(run_id=w.run_id)), {NS, SCOPE}),
    "ListRuns": (lambda s, a, w: s.runtime.ListRuns(pb.ListRunsRequest()), set()),
    "SaveView": (
        lambda s, a, w: s.runtime.SaveView(
            pb.SaveViewRequest(
                view=message_pb2.SavedView(
                    name="mine", query=message_pb2.RunsQuery(agent_id="coding_agent")
                )
            )
        ),
        set(),
    ),
    "ListViews": (lambda s, a, w: s.runtime.ListViews(pb.ListViewsRequest()), set()),
    "DeleteView": (lambda s, a, w: s.runtime.DeleteView(pb.DeleteViewRequest(name="mine")), set()),
    "ListAttempts": (
        lambda s, a, w: s.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "ListSteps": (
        lambda s, a, w: s.runtime.ListSteps(pb.ListStepsRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "GetStep": (
        lambda s, a, w: s.runtime.GetStep(pb.GetStepRequest(step_id=w.step_id)),
        {NS, SCOPE},
    ),
    "ListArtifacts": (
        lambda s, a, w: s.runtime.ListArtifacts(pb.ListArtifactsRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "WatchRun": (
        lambda s, a, w: _first(s.runtime.WatchRun(pb.WatchRunRequest(run_id=w.run_id), timeout=5)),
        {NS, SCOPE},
    ),
    "CancelRun": (
        lambda s, a, w: s.runtime.CancelRun(pb.CancelRunRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "PauseRun": (
        lambda s, a, w: s.runtime.PauseRun(pb.PauseRunRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "ResumeRun": (
        lambda s, a, w: s.runtime.ResumeRun(pb.ResumeRunRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "AmendRun": (
        lambda s, a, w: s.runtime.AmendRun(pb.AmendRunRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "SendInput": (
        lambda s, a, w: s.runtime.SendInput(
            pb.SendInputRequest(run_id=w.run_id, kind=enum_pb2.INPUT_KIND_STEER, content="go")
        ),
        {NS, SCOPE},
    ),
    "ResolveApproval": (
        lambda s, a, w: s.runtime.ResolveApproval(
            pb.ResolveApprovalRequest(
                run_id=w.run_id,
                step_id=w.step_id,
                decision=enum_pb2.APPROVAL_DECISION_APPROVE,
            )
        ),
        {NS, SCOPE},
    ),
    "PutBlob": (
        lambda s, a, w: s.runtime.PutBlob(
            iter(
                [
                    pb.PutBlobRequest(header=message_pb2.BlobHeader(size=2, namespace="team-a")),
                    pb.PutBlobRequest(chunk=b"hi"),
                ]
            )
        ),
        {NS},
    ),
    "GetBlob": (
        lambda s, a, w: _first(
            s.runtime.GetBlob(pb.GetBlobRequest(digest=w.blob, namespace="team-a"), timeout=5)
        ),
        {NS},
    ),
    "AcquireRun": (lambda s, a, w: s.acquire("matrix"), set()),
    "Heartbeat": (
        lambda s, a, w: s.worker.Heartbeat(wpb.HeartbeatRequest(fence=_fence(w))),
        {NS, SCOPE},
    ),
    "BeginTurn": (
        lambda s, a, w: s.worker.BeginTurn(wpb.BeginTurnRequest(fence=_fence(w))),
        {NS, SCOPE},
    ),
    "EndTurn": (
        lambda s, a, w: s.worker.EndTurn(wpb.EndTurnRequest(fence=_fence(w), turn_id="trn_x")),
        {NS, SCOPE},
    ),
    "BeginStep": (
        lambda s, a, w: s.worker.BeginStep(
            wpb.BeginStepRequest(
                fence=_fence(w), turn_id="trn_x", type=enum_pb2.STEP_TYPE_MODEL_CALL
            )
        ),
        {NS, SCOPE},
    ),
    "EndStep": (
        lambda s, a, w: s.worker.EndStep(
            wpb.EndStepRequest(
                fence=_fence(w), step_id=w.step_id, status=enum_pb2.STEP_STATUS_FAILED
            )
        ),
        {NS, SCOPE},
    ),
    "WriteCheckpoint": (
        lambda s, a, w: s.worker.WriteCheckpoint(
            wpb.WriteCheckpointRequest(fence=_fence(w), state_ref=w.blob)
        ),
        {NS, SCOPE},
    ),
    "CreateArtifact": (
        lambda s, a, w: s.worker.CreateArtifact(
            wpb.CreateArtifactRequest(
                fence=_fence(w), step_id=w.step_id, name="x", blob_digest=w.blob
            )
        ),
        {NS, SCOPE},
    ),
    "FinishAttempt": (
        lambda s, a, w: s.worker.FinishAttempt(
            wpb.FinishAttemptRequest(
                fence=_fence(w), outcome=enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE
            )
        ),
        {NS, SCOPE},
    ),
    "GetProvenance": (
        lambda s, a, w: a.GetProvenance(apb.GetProvenanceRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "FindUsages": (
        lambda s, a, w: a.FindUsages(apb.FindUsagesRequest(agent_digest=w.digest)),
        set(),
    ),
    "VerifyRun": (
        lambda s, a, w: a.VerifyRun(apb.VerifyRunRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
    "ExportBundle": (
        lambda s, a, w: _first(a.ExportBundle(apb.ExportBundleRequest(run_id=w.run_id))),
        {NS, SCOPE},
    ),
    "GetRunAttestation": (
        lambda s, a, w: a.GetRunAttestation(apb.GetRunAttestationRequest(run_id=w.run_id)),
        {NS, SCOPE},
    ),
}


@dataclass(frozen=True)
class Caller:
    label: str
    token: str | None
    role: str | None  # None: not a principal the server knows
    home: bool  # of team-a and coding_agent* (else of team-b and other_agent*, or of none)


def _callers(config: Path) -> tuple[list[Caller], str]:
    """A principal of every role at home and away, an OIDC publisher, and callers the server
    must not authenticate: none, an unknown token, an expired JWT, a JWT for another
    audience."""
    issuer = Issuer()
    (config.parent / "jwks.json").write_text(json.dumps(issuer.jwks()), encoding="utf-8")
    rules = (
        '[[oidc.rules]]\nclaims = { repository = "acme/agents" }\nroles = ["publisher"]\n'
        'scopes = ["coding_agent*"]\n'
    )
    entries, callers = [issuer_config(jwks_file="jwks.json", rules=rules)], []
    now = int(time.time())
    callers += [
        Caller("OIDC publisher", issuer.token(lifetime=3600), "publisher", True),
        Caller(
            "expired JWT", issuer.token(exp=now - 60, iat=now - 3600, nbf=now - 3600), None, False
        ),
        Caller("JWT of another audience", issuer.token(aud="someone-else"), None, False),
    ]
    for role in ROLES:
        for label, namespaces, scopes in (
            (role, ["team-a"], ["coding_agent*"]),
            (f"{role}@team-b", ["team-b"], ["other_agent*"]),
            # Empty namespaces and scopes mean none, not all: reaches nothing its role limits.
            (f"{role} without namespaces or scopes", [], []),
        ):
            token = new_token()
            entries.append(token_entry(label, token, [role], scopes, namespaces))
            callers.append(Caller(label, token, role, home=label == role))
    admin = new_token()
    entries.append(token_entry("world-builder", admin, ["admin"], [], []))
    config.write_text("".join(entries), encoding="utf-8")
    callers.append(Caller("no credentials", None, None, False))
    callers.append(Caller("unknown token", new_token(), None, False))
    return callers, admin


def test_every_rpc_answers_every_caller_as_the_docs_matrix_says(
    database_url: str, tmp_path: Path
) -> None:
    assert sorted(REQUESTS) == sorted(MATRIX), "a request for every RPC of the matrix"
    config = tmp_path / "auth.toml"
    callers, admin_token = _callers(config)
    mismatches: list[str] = []
    with serving(database_url, auth_config=str(config)) as server:
        address = f"127.0.0.1:{server.server.port}"
        with Stubs.open(address, admin_token) as admin:
            world = _build_world(admin)
        for caller in callers:
            stubs, audit = _stubs(address, caller.token)
            with stubs:
                for rpc, (call, touches) in REQUESTS.items():
                    permission, cells = MATRIX[rpc]
                    got = _outcome(call, stubs, audit, world)
                    if caller.role is None:
                        want = "UNAUTHENTICATED"
                    elif _expect_allowed(cells[caller.role], touches, caller.home):
                        want = "allowed"
                    else:
                        want = f"PERMISSION_DENIED {permission}"
                    if got != want:
                        mismatches.append(f"{rpc} as {caller.label}: {got}, docs say {want}")
    assert not mismatches, "\n".join(mismatches)


def _outcome(call: Call, stubs: Stubs, audit: Any, world: World) -> str:
    try:
        call(stubs, audit, world)
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return "UNAUTHENTICATED"
        if code == grpc.StatusCode.PERMISSION_DENIED:
            info = error_details(error)["ErrorInfo"]
            return f"PERMISSION_DENIED {info.metadata['permission']}"
        if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            return f"{code.name} {error.details()}"  # never right: a bug of ours
    return "allowed"
