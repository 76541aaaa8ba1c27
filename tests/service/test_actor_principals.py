"""The recorded actor is the authenticated principal (issue 16, item 3, the runtime's half).

Every request field that names who acts (CancelRun/PauseRun/ResumeRun/AmendRun ``actor``,
SendInput ``sender``, ResolveApproval ``approver``, AcquireRun ``worker_id``) is a display
label: each test below gives a made-up one (often another principal's name), and the ledger
records the principal the call authenticated as beside it: on the run, the attempt, the
step, the input and the amendment as GetRun/ListAttempts/GetStep show them, in the events
(hash-chained), in the audit bundle and in ``agentrt audit``. Without an auth config every
call is recorded as "anonymous". Both engines, the step writer process on (steps are written
there; the approver is recorded by the server).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import (
    event_pb2,
    message_pb2,
)
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.auth import ANONYMOUS, new_token, token_entry
from agentrt_core import audit_bundle
from runtime_service.cli.main import main as agentrt
from tests.runtime_support import Stubs
from tests.service.steps_support import T, acquire, events, get_run, get_step, of_type, send
from tests.support import ServerThread

#: The principals of the authenticated server (each gets a token, role admin: authorisation
#: is not what these tests are about).
PRINCIPALS = ("alice", "bob", "worker-7", "security")


@dataclass
class Callers:
    """Stubs calling as each principal, and the name the ledger must record for one."""

    address: str
    stubs: dict[str, Stubs]
    tokens: dict[str, str]
    authenticated: bool

    def recorded(self, principal: str) -> str:
        return principal if self.authenticated else ANONYMOUS

    def cli(self, principal: str, *args: str) -> list[str]:
        """``agentrt`` as ``principal`` against the server."""
        token = ["--token", self.tokens[principal]] if self.authenticated else []
        return [*args, "--target", self.address, *token]


@contextlib.contextmanager
def _callers(database_url: str, config: Path | None) -> Iterator[Callers]:
    tokens = {name: new_token() for name in PRINCIPALS}
    if config is not None:
        config.write_text(
            "".join(token_entry(name, tokens[name], ["admin"], [], []) for name in PRINCIPALS)
        )
    settings: dict[str, Any] = {"auth_config": str(config)} if config is not None else {}
    server = ServerThread(database_url, **settings)
    address = server.start()
    opened = {
        name: Stubs.open(address, tokens[name] if config is not None else None)
        for name in PRINCIPALS
    }
    try:
        yield Callers(address, opened, tokens, config is not None)
    finally:
        for stubs in opened.values():
            stubs.close()
        server.stop()


@pytest.fixture(params=["authenticated", "anonymous"])
def callers(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Iterator[Callers]:
    config = tmp_path / "auth.toml" if request.param == "authenticated" else None
    with _callers(database_url, config) as opened:
        yield opened


def _attributes(found: list[event_pb2.Event], event_type: int) -> list[Any]:
    return [getattr(e, str(e.WhichOneof("attributes"))) for e in of_type(found, event_type)]


def test_the_unauthenticated_server_really_authenticates_nobody(callers: Callers) -> None:
    """The two settings the other tests compare: with an auth config an unknown caller is
    refused (so the names recorded are proven identities), without one it is served."""
    anonymous = Stubs.open(callers.address, None)
    try:
        if callers.authenticated:
            with pytest.raises(grpc.RpcError) as refused:
                anonymous.thread()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        else:
            assert anonymous.thread().id
    finally:
        anonymous.close()


def test_run_attempt_input_amendment_and_control_record_the_principal(
    callers: Callers,
) -> None:
    alice, bob, worker = (callers.stubs[n] for n in ("alice", "bob", "worker-7"))
    who: Callable[[str], str] = callers.recorded
    alice.publish_agent()
    run = alice.run(alice.thread().id)
    assert run.creator_principal == who("alice")

    # The worker calls itself "alice-laptop": a label, kept as given; its identity is its
    # principal.
    w = acquire(worker, worker="alice-laptop")
    attempt = w.acquired.attempt
    assert (attempt.worker_id, attempt.worker_principal) == ("alice-laptop", who("worker-7"))
    [listed] = alice.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run.id), timeout=T).attempts
    assert (listed.worker_id, listed.worker_principal) == ("alice-laptop", who("worker-7"))

    # bob sends an input signed "alice", amends as "alice", pauses as "alice".
    item = send(bob, run.id, E.INPUT_KIND_STEER, "look at the flaky test", sender="alice")
    assert (item.sender, item.sender_principal) == ("alice", who("bob"))
    amended = bob.runtime.AmendRun(
        pb.AmendRunRequest(
            run_id=run.id, amendment=message_pb2.Amendment(note="keep it small"), actor="alice"
        ),
        timeout=T,
    ).run
    [amendment] = amended.amendments
    assert (amendment.actor, amendment.actor_principal) == ("alice", who("bob"))
    assert get_run(alice, run.id).amendments[0].actor_principal == who("bob")
    bob.runtime.PauseRun(pb.PauseRunRequest(run_id=run.id, actor="alice"), timeout=T)
    # alice withdraws it, signing as "bob".
    alice.runtime.ResumeRun(pb.ResumeRunRequest(run_id=run.id, actor="bob"), timeout=T)
    # bob cancels, as "security"; the worker acknowledges.
    bob.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id, actor="security"), timeout=T)
    w.finish(E.ATTEMPT_OUTCOME_CANCELLED)

    found = events(alice, run.id)
    [created] = _attributes(found, E.EVENT_TYPE_RUN_CREATED)
    assert created.creator_principal == who("alice")
    [started] = _attributes(found, E.EVENT_TYPE_ATTEMPT_STARTED)
    assert (started.worker_id, started.worker_principal) == ("alice-laptop", who("worker-7"))
    [received] = _attributes(found, E.EVENT_TYPE_INPUT_RECEIVED)
    assert (received.sender, received.sender_principal) == ("alice", who("bob"))
    [amended_event] = _attributes(found, E.EVENT_TYPE_RUN_AMENDED)
    assert amended_event.amendment.actor_principal == who("bob")
    requested = [
        (a.actor, a.actor_principal)
        for kind in (
            E.EVENT_TYPE_RUN_PAUSE_REQUESTED,
            E.EVENT_TYPE_RUN_RESUME_REQUESTED,
            E.EVENT_TYPE_RUN_CANCEL_REQUESTED,
        )
        for a in _attributes(found, kind)
    ]
    assert requested == [("alice", who("bob")), ("bob", who("alice")), ("security", who("bob"))]
    # The worker's acquisition and its acknowledgement are the worker principal's moves.
    [queued_to_running] = _attributes(found, E.EVENT_TYPE_RUN_STATUS_CHANGED)
    assert (queued_to_running.actor, queued_to_running.actor_principal) == (
        "worker",
        who("worker-7"),
    )
    [ended] = _attributes(found, E.EVENT_TYPE_RUN_ENDED)
    assert (ended.status, ended.actor_principal) == (E.RUN_STATUS_CANCELLED, who("worker-7"))

    # A run without an attempt is cancelled at once: run.ended names who cancelled it.
    queued = alice.run(alice.thread().id)
    bob.runtime.CancelRun(pb.CancelRunRequest(run_id=queued.id, actor="alice"), timeout=T)
    [ended] = _attributes(events(alice, queued.id), E.EVENT_TYPE_RUN_ENDED)
    assert (ended.status, ended.actor_principal) == (E.RUN_STATUS_CANCELLED, who("bob"))


def _approved_run(callers: Callers) -> tuple[str, str]:
    """A run whose approval step ``security`` approved as "alice", then completed by a
    worker calling itself "w-made-up"; returns (run id, approval step id)."""
    alice, security, worker = (callers.stubs[n] for n in ("alice", "security", "worker-7"))
    alice.publish_agent()
    run = alice.run(alice.thread().id)
    w = acquire(worker, worker="w-made-up")
    approval = w.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n").step
    assert approval.type == E.STEP_TYPE_APPROVAL_REQUEST
    w.finish(E.ATTEMPT_OUTCOME_WAITING_APPROVAL)
    resolved = security.runtime.ResolveApproval(
        pb.ResolveApprovalRequest(
            run_id=run.id,
            step_id=approval.id,
            decision=E.APPROVAL_DECISION_APPROVE,
            approver="alice",
            comment="fine",
        ),
        timeout=T,
    )
    decided = resolved.step.approval
    assert (decided.approver, decided.approver_principal) == ("alice", callers.recorded("security"))
    w2 = acquire(worker, worker="w-made-up")
    call = w2.tool("apply_patch", "patch-1", patch="--- a\n+++ b\n").step
    w2.end(call.id)
    w2.complete()
    return run.id, approval.id


def test_an_approval_records_the_principal_that_decided(callers: Callers) -> None:
    who = callers.recorded
    run_id, approval_id = _approved_run(callers)
    alice = callers.stubs["alice"]
    approval = get_step(alice, approval_id).approval
    assert (approval.approver, approval.approver_principal) == ("alice", who("security"))
    found = events(alice, run_id)
    [resolved] = _attributes(found, E.EVENT_TYPE_APPROVAL_RESOLVED)
    assert (resolved.approver, resolved.approver_principal) == ("alice", who("security"))
    # The run left WAITING_APPROVAL by the approver's call.
    moves = _attributes(found, E.EVENT_TYPE_RUN_STATUS_CHANGED)
    requeued = [m for m in moves if m.status == E.RUN_STATUS_QUEUED]
    assert [(m.actor, m.actor_principal) for m in requeued] == [("client", who("security"))]
    # Every step the attempts wrote (in the step writer process) is their worker's: the
    # attempt's principal, recorded once at AcquireRun.
    attempts = alice.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run_id), timeout=T)
    assert [a.worker_principal for a in attempts.attempts] == [who("worker-7")] * 2


def test_the_bundle_and_agentrt_audit_show_principals(
    callers: Callers, capsys: pytest.CaptureFixture[str]
) -> None:
    who = callers.recorded
    run_id, approval_id = _approved_run(callers)
    alice = callers.stubs["alice"]
    audit = audit_service_pb2_grpc.AuditServiceStub(alice.channel)
    parts = list(audit.ExportBundle(apb.ExportBundleRequest(run_id=run_id), timeout=T))
    document = audit_bundle.decode(b"".join(p.chunk for p in parts[1:]))
    report = audit_bundle.verify_bundle(document)
    assert report.ok, report.failures
    assert document["run"]["creator_principal"] == who("alice")
    assert [(a["worker_id"], a["worker_principal"]) for a in document["attempts"]] == [
        ("w-made-up", who("worker-7"))
    ] * 2
    [approval] = [s for s in document["steps"] if s["id"] == approval_id]
    assert (approval["approval"]["approver"], approval["approval"]["approver_principal"]) == (
        "alice",
        who("security"),
    )
    attributes = {
        e["event_type"]: e["attributes"] for e in document["events"] if e["run_id"] == run_id
    }
    assert attributes["run.created"]["creator_principal"] == who("alice")
    assert attributes["attempt.started"]["worker_principal"] == who("worker-7")
    assert attributes["approval.resolved"]["approver_principal"] == who("security")
    # The bundle's events are what WatchRun shows, attribute for attribute (new fields too).
    shown = {
        e.sequence: json_format.MessageToDict(
            getattr(e, str(e.WhichOneof("attributes"))), preserving_proto_field_name=True
        )
        for e in events(alice, run_id)
    }
    assert {e["sequence"]: e["attributes"] for e in document["events"]} == shown

    assert agentrt(callers.cli("alice", "audit", run_id)) == 0
    tree = capsys.readouterr().out
    assert f" by {who('alice')}, ended " in tree  # the run's creator
    assert f"worker {who('worker-7')} (label 'w-made-up') epoch " in tree
    assert f"approval APPROVE by {who('security')} (label 'alice')" in tree
