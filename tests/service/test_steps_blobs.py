"""Blobs (PutBlob / GetBlob), checkpoints and artifacts through real gRPC on both engines."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from agentrt.runtime.v1 import enum_pb2 as E
from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db import Database, utcnow
from runtime_service import migrate
from runtime_service.store import blobs
from runtime_service.store.ledger import BlobRow
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    T,
    Worker,
    acquire,
    chunk,
    digest_of,
    events,
    expect,
    get_run,
    header,
    list_steps,
    of_type,
    put,
    put_blob,
    start,
    violations,
)
from tests.support import error_details

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MIB = 1024 * 1024


def get(stubs: Stubs, digest: str) -> tuple[message_pb2.Blob, list[bytes]]:
    responses = list(stubs.runtime.GetBlob(pb.GetBlobRequest(digest=digest), timeout=T))
    assert responses[0].WhichOneof("content") == "blob"
    assert all(r.WhichOneof("content") == "chunk" for r in responses[1:])
    return responses[0].blob, [r.chunk for r in responses[1:]]


def test_put_and_get_a_blob_in_chunks_deduplicated(stubs: Stubs) -> None:
    data = bytes(range(256)) * (10 * 1024) + b"tail"  # 2.5 MiB and a bit
    first = put_blob(stubs, data, media_type="application/x-tar", chunk=MIB // 2)
    assert first.created
    assert first.blob.digest == digest_of(data) and first.blob.size == len(data)
    assert first.blob.media_type == "application/x-tar" and first.blob.HasField("create_time")

    # The same content again (other chunking, other media type): stored once.
    second = put_blob(stubs, data, media_type="text/plain", chunk=MIB)
    assert not second.created and second.blob == first.blob

    meta, chunks = get(stubs, first.blob.digest)
    assert meta == first.blob
    assert b"".join(chunks) == data
    assert len(chunks) == 3 and all(len(c) <= MIB for c in chunks)

    # An empty blob is a blob too; a correct expected_digest is accepted.
    empty = put(stubs, header(0, expected=digest_of(b"")))
    assert empty.blob.size == 0 and empty.blob.digest == digest_of(b"")
    assert empty.blob.media_type == "application/octet-stream"
    assert get(stubs, empty.blob.digest) == (empty.blob, [])


def test_concurrent_uploads_of_the_same_content_store_it_once(stubs: Stubs) -> None:
    # Big enough that the stores overlap: each insert writes three 1 MiB chunk rows.
    data = b"same bytes from many workers" * 110_000
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: put_blob(stubs, data), range(8)))
    assert sum(r.created for r in results) == 1
    assert {r.blob.digest for r in results} == {digest_of(data)}
    assert b"".join(get(stubs, digest_of(data))[1]) == data


def test_a_row_inserted_meanwhile_is_told_apart(database_url: str) -> None:
    """Two replicas that both found the content missing: the primary key refuses the second
    row, and the store says so (PutBlob then answers as for a repeated upload)."""
    database = Database(database_url)
    try:
        migrate.upgrade(database)
        digest = digest_of(b"abc")

        def insert(session: Any) -> BlobRow:
            return blobs.insert(session, digest, 3, "text/plain", utcnow())

        database.write_sync(insert)
        with pytest.raises(blobs.StoredMeanwhile):
            database.write_sync(insert)
        assert database.read_sync(blobs.used_bytes) == 3
    finally:
        database.dispose()


def test_put_blob_refuses_bad_uploads(stubs: Stubs) -> None:
    data = b"hello blob"

    def refused(field: str, *messages: pb.PutBlobRequest) -> None:
        details = expect(INVALID, put, stubs, *messages)
        assert field in violations(details), violations(details)

    wrong = digest_of(b"something else")
    refused("header.expected_digest", header(len(data), expected=wrong), chunk(data))
    refused("header.expected_digest", header(len(data), expected="sha256:XYZ"), chunk(data))
    refused("header.size", header(len(data) + 1), chunk(data))
    refused("header.size", header(0), chunk(data))  # size is required and exact
    refused("header.size", header(-1))
    refused("header", chunk(data))  # the first message must be the header
    refused("header", header(len(data)), chunk(data[:4]), header(6), chunk(data[4:]))
    refused("header")  # no message at all
    # None of them stored anything.
    expect(grpc.StatusCode.NOT_FOUND, get, stubs, digest_of(data))


def test_get_blob_errors(stubs: Stubs) -> None:
    expect(grpc.StatusCode.NOT_FOUND, get, stubs, digest_of(b"never stored"))
    for bad in ("", "sha256:abc", "md5:" + "0" * 32, "sha256:" + "G" * 64):
        details = expect(INVALID, get, stubs, bad)
        assert "digest" in violations(details)


def checkpoint(w: Worker, state: str, after: int = 0, **kw: Any) -> Any:
    return w.stubs.worker.WriteCheckpoint(
        wpb.WriteCheckpointRequest(fence=w.fence, state_ref=state, after_sequence=after, **kw),
        timeout=T,
    ).checkpoint


def test_checkpoints_set_the_runs_resume_point(stubs: Stubs) -> None:
    w = start(stubs)
    w.end(w.model().step.id)
    state = put_blob(stubs, b'{"plan": 1}', media_type="application/json").blob.digest

    ckp = checkpoint(w, state, after=1, request_id="c1")
    assert ckp.id.startswith("ckp_") and ckp.state_ref == state and ckp.after_sequence == 1
    assert (ckp.run_id, ckp.attempt_id) == (w.run_id, w.attempt_id)
    assert get_run(stubs, w.run_id).latest_checkpoint_id == ckp.id
    step = list_steps(stubs, w.run_id)[-1]
    assert step.id == ckp.step_id and step.sequence == 2
    assert (step.type, step.status) == (E.STEP_TYPE_CHECKPOINT, E.STEP_STATUS_SUCCEEDED)
    assert step.turn_id == w.turn_id and step.input_ref == state
    [written] = of_type(events(stubs, w.run_id), E.EVENT_TYPE_CHECKPOINT_WRITTEN)
    attributes = written.checkpoint_written_attributes
    assert (attributes.checkpoint_id, attributes.state_ref) == (ckp.id, state)
    # A retry with the request_id: the same checkpoint, no new step.
    assert checkpoint(w, state, after=1, request_id="c1") == ckp
    assert len(list_steps(stubs, w.run_id)) == 2

    expect(INVALID, checkpoint, w, state, after=3)  # beyond the last step (2)
    expect(INVALID, checkpoint, w, state, after=-1)
    expect(
        grpc.StatusCode.FAILED_PRECONDITION, checkpoint, w, digest_of(b"?"), reason="BLOB_MISSING"
    )
    assert get_run(stubs, w.run_id).latest_checkpoint_id == ckp.id

    # Outside a turn, a checkpoint is recorded without one; the latest one wins.
    w.end_turn()
    later = checkpoint(w, put_blob(stubs, b'{"plan": 2}').blob.digest, after=2)
    assert list_steps(stubs, w.run_id)[-1].turn_id == ""
    assert get_run(stubs, w.run_id).latest_checkpoint_id == later.id

    # The next attempt is told to resume from it.
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs, turn=False)
    assert w2.acquired.attempt.resume_from_checkpoint_id == later.id
    assert w2.acquired.resume_from.id == later.id
    # request_id is scoped: another attempt may reuse "c1" for its own checkpoint.
    own = checkpoint(w2, state, after=3, request_id="c1")
    assert own.id != ckp.id and own.attempt_id == w2.attempt_id


def test_acquire_hands_over_the_whole_checkpoint(stubs: Stubs) -> None:
    w = start(stubs)
    state = put_blob(stubs, b"state").blob.digest
    ckp = checkpoint(w, state)
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    assert acquire(stubs, turn=False).acquired.resume_from == ckp


def test_artifacts_point_to_their_step_and_list_by_run_and_thread(stubs: Stubs) -> None:
    w = start(stubs)
    thread_id = w.acquired.run.thread_id
    step = w.tool("read_file", path="a.py").step
    patch = put_blob(stubs, b"--- a\n+++ b\n", media_type="text/x-diff").blob

    def create(**kw: Any) -> Any:
        fields: dict[str, Any] = {
            "fence": w.fence,
            "step_id": step.id,
            "name": "fix.patch",
            "blob_digest": patch.digest,
        }
        fields.update(kw)
        return stubs.worker.CreateArtifact(wpb.CreateArtifactRequest(**fields), timeout=T).artifact

    art = create(labels={"kind": "patch"}, request_id="a1")
    assert art.id.startswith("art_")
    assert (art.run_id, art.thread_id, art.attempt_id, art.step_id) == (
        w.run_id,
        thread_id,
        w.attempt_id,
        step.id,
    )
    assert (art.blob_digest, art.size, art.media_type) == (patch.digest, patch.size, "text/x-diff")
    assert dict(art.labels) == {"kind": "patch"}
    assert create(labels={"kind": "patch"}, request_id="a1") == art  # idempotent
    # A label is a word and one line (runtime_service/labels.py), as a run's are.
    with pytest.raises(grpc.RpcError) as bad:
        create(name="bad.patch", labels={"kind\n": "patch"})
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error_details(bad.value)["BadRequest"].field_violations] == [
        'labels["kind\\n"]'
    ]
    report = create(name="report.md", media_type="text/markdown")
    assert report.media_type == "text/markdown"
    [created, _] = of_type(events(stubs, w.run_id), E.EVENT_TYPE_ARTIFACT_CREATED)
    assert created.artifact_created_attributes.artifact_id == art.id
    assert created.artifact_created_attributes.step_id == step.id

    expect(grpc.StatusCode.NOT_FOUND, create, step_id="stp_nope")
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        create,
        blob_digest=digest_of(b"?"),
        reason="BLOB_MISSING",
    )
    assert "name" in violations(expect(INVALID, create, name=""))
    assert "step_id" in violations(expect(INVALID, create, step_id=""))

    # A step of the run's earlier attempt is refused; one of another run is not found.
    w.finish(E.ATTEMPT_OUTCOME_FAILED_RETRYABLE)
    w2 = acquire(stubs)
    details = expect(INVALID, create, fence=w2.fence)
    assert violations(details) == ["step_id"]
    mine = w2.model().step
    other = start(stubs, publish=False)
    same_thread_run = stubs.run(thread_id)
    expect(grpc.StatusCode.NOT_FOUND, create, fence=other.fence, step_id=mine.id)
    later = create(fence=w2.fence, step_id=mine.id, name="fix.patch")  # names may repeat
    assert later.attempt_id == w2.attempt_id

    def listed(**kw: Any) -> list[str]:
        response = stubs.runtime.ListArtifacts(pb.ListArtifactsRequest(**kw), timeout=T)
        return [a.id for a in response.artifacts]

    assert listed(run_id=w.run_id) == [art.id, report.id, later.id]
    # The thread lists its runs' artifacts: add one from another run of the same thread.
    w3 = acquire(stubs)
    assert w3.run_id == same_thread_run.id
    theirs = create(fence=w3.fence, step_id=w3.model().step.id, name="notes")
    assert listed(thread_id=thread_id) == [art.id, report.id, later.id, theirs.id]
    assert listed(thread_id=other.acquired.run.thread_id) == []
    page = stubs.runtime.ListArtifacts(
        pb.ListArtifactsRequest(run_id=w.run_id, page_size=2), timeout=T
    )
    assert [a.id for a in page.artifacts] == [art.id, report.id] and page.next_page_token
    assert "run_id" in violations(expect(INVALID, listed))
    assert "run_id" in violations(expect(INVALID, listed, run_id=w.run_id, thread_id=thread_id))
