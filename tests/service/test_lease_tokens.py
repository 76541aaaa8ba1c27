"""Secret lease tokens (issue 16, item 5): a fence is the attempt id, the lease epoch and a
token AcquireRun hands to the worker alone. The id and the epoch are public (ListAttempts,
``attempt.started``); with them alone, a stranger once failed another client's step,
heartbeated its attempt and ended it. Now every fenced write without the token is refused
LEASE_LOST, exactly as a stale fence is, and changes nothing; on both engines, through the
step writer process and the server alike."""

from __future__ import annotations

import hashlib
from typing import Any

import grpc
import sqlalchemy as sa

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from tests.runtime_support import Stubs
from tests.service.steps_support import T, Worker, events, expect, get_run, put_blob, start


def _public_fence(stubs: Stubs, run_id: str) -> message_pb2.Fence:
    """The fence as anyone who can read the run sees it."""
    [attempt] = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run_id)).attempts
    return message_pb2.Fence(attempt_id=attempt.id, lease_epoch=attempt.lease_epoch)


def _writes(w: Worker, step_id: str, blob: str) -> dict[str, Any]:
    """Every fenced WorkerService call, as a thunk taking the fence to present."""
    worker = w.stubs.worker
    return {
        "Heartbeat": lambda f: worker.Heartbeat(wpb.HeartbeatRequest(fence=f), timeout=T),
        "BeginTurn": lambda f: worker.BeginTurn(wpb.BeginTurnRequest(fence=f), timeout=T),
        "EndTurn": lambda f: worker.EndTurn(
            wpb.EndTurnRequest(fence=f, turn_id=w.turn_id), timeout=T
        ),
        "BeginStep": lambda f: w.begin(
            fence=f, type=E.STEP_TYPE_MODEL_CALL, model_call=message_pb2.ModelCallSpec()
        ),
        "EndStep": lambda f: w.end(step_id, E.STEP_STATUS_FAILED, fence=f),
        "WriteCheckpoint": lambda f: worker.WriteCheckpoint(
            wpb.WriteCheckpointRequest(fence=f, state_ref=blob), timeout=T
        ),
        "CreateArtifact": lambda f: worker.CreateArtifact(
            wpb.CreateArtifactRequest(fence=f, step_id=step_id, name="x", blob_digest=blob),
            timeout=T,
        ),
        "FinishAttempt": lambda f: worker.FinishAttempt(
            wpb.FinishAttemptRequest(fence=f, outcome=E.ATTEMPT_OUTCOME_FAILED_PERMANENT),
            timeout=T,
        ),
    }


def test_a_stranger_with_the_public_fence_changes_nothing(stubs: Stubs, database_url: str) -> None:
    w = start(stubs)
    token = w.fence.lease_token
    assert len(token) >= 22  # at least 128 bits, URL-safe base64
    step = w.model().step
    blob = put_blob(stubs, b"state").blob.digest
    public = _public_fence(stubs, w.run_id)
    assert (public.attempt_id, public.lease_epoch) == (w.attempt_id, w.fence.lease_epoch)
    before = get_run(stubs, w.run_id)
    stale = message_pb2.Fence(
        attempt_id=w.attempt_id, lease_epoch=w.fence.lease_epoch + 1, lease_token=token
    )
    guessed = message_pb2.Fence(
        attempt_id=w.attempt_id, lease_epoch=w.fence.lease_epoch, lease_token="x" * len(token)
    )
    for name, call in _writes(w, step.id, blob).items():
        answers = []
        for fence in (public, guessed, stale):
            details = expect(grpc.StatusCode.ABORTED, call, fence, reason="LEASE_LOST")
            answers.append(
                (details["ErrorInfo"].metadata["attempt_status"], details["ErrorInfo"].reason)
            )
        # The stranger's answer is the stale fence's: it tells nothing a read does not.
        assert answers[0] == answers[1] == answers[2], name
    after = get_run(stubs, w.run_id)
    assert after.status == E.RUN_STATUS_RUNNING
    assert (after.step_count, after.last_event_sequence) == (
        before.step_count,
        before.last_event_sequence,
    )
    [attempt] = stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=w.run_id)).attempts
    assert attempt.status == E.ATTEMPT_STATUS_ACTIVE
    # The worker, with its token, goes on as if nothing happened.
    assert w.end(step.id).status == E.STEP_STATUS_SUCCEEDED
    w.stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=w.fence), timeout=T)
    assert w.finish(E.ATTEMPT_OUTCOME_FAILED_PERMANENT).run.status == E.RUN_STATUS_FAILED


def test_the_token_is_shown_nowhere_and_stored_only_as_its_hash(
    stubs: Stubs, database_url: str
) -> None:
    w = start(stubs)
    token = w.fence.lease_token
    w.end(w.model().step.id)
    shown = [
        stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=w.run_id)).SerializeToString(),
        get_run(stubs, w.run_id).SerializeToString(),
        *(e.SerializeToString() for e in events(stubs, w.run_id)),
    ]
    assert not any(token.encode() in message for message in shown)
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            stored = conn.execute(
                sa.text("SELECT lease_token_hash FROM runtime_attempts WHERE id = :id"),
                {"id": w.attempt_id},
            ).scalar_one()
            events_text = " ".join(
                conn.execute(sa.text("SELECT attributes_json FROM runtime_events")).scalars()
            )
    finally:
        engine.dispose()
    assert stored == "sha256:" + hashlib.sha256(token.encode()).hexdigest()
    assert token not in events_text


def test_each_attempt_gets_its_own_token(stubs: Stubs) -> None:
    w = start(stubs)
    first = w.fence.lease_token
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    again = stubs.acquire()
    assert again.HasField("run") and again.fence.lease_token not in ("", first)
    # The first attempt's token does not open the second.
    reused = message_pb2.Fence(
        attempt_id=again.fence.attempt_id,
        lease_epoch=again.fence.lease_epoch,
        lease_token=first,
    )
    expect(
        grpc.StatusCode.ABORTED,
        stubs.worker.Heartbeat,
        wpb.HeartbeatRequest(fence=reused),
        timeout=T,
        reason="LEASE_LOST",
    )
