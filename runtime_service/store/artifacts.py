"""Artifacts as stored: what a step produced, by name, pointing at a blob."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import event_pb2
from agentrt_core.ids import new_id
from agentrt_core.paging import PageRequest
from runtime_service.step_rules import dumps
from runtime_service.store import transitions
from runtime_service.store.ledger import ArtifactRow, BlobRow, StepRow
from runtime_service.store.tables import AttemptRow, RunRow


def by_request(session: Session, request_key: str) -> ArtifactRow | None:
    """The artifact an earlier CreateArtifact stored under this (scoped) request id, if any."""
    return session.scalar(sa.select(ArtifactRow).where(ArtifactRow.request_id == request_key))


def create(
    session: Session,
    run: RunRow,
    attempt: AttemptRow,
    step: StepRow,
    name: str,
    blob_digest: str,
    media_type: str,
    labels: dict[str, str],
    request_key: str | None,
    now: dt.datetime,
) -> ArtifactRow:
    """Store an artifact of ``step`` pointing at the uploaded blob ``blob_digest`` (its media
    type the blob's unless given) and record ``artifact.created``."""
    blob = session.get(BlobRow, blob_digest)
    artifact = ArtifactRow(
        id=new_id("art"),
        run_id=run.id,
        thread_id=run.thread_id,
        attempt_id=attempt.id,
        step_id=step.id,
        name=name,
        blob_digest=blob_digest,
        media_type=media_type or (blob.media_type if blob else ""),
        size=blob.size if blob else 0,
        labels_json=dumps(labels),
        create_time=now,
        request_id=request_key,
    )
    session.add(artifact)
    transitions.append_run_event(
        session,
        run,
        event_pb2.ArtifactCreatedAttributes(
            artifact_id=artifact.id,
            step_id=step.id,
            name=name,
            blob_digest=blob_digest,
            media_type=artifact.media_type,
            attempt_id=attempt.id,
            size=artifact.size,
            labels=labels,
        ),
        now,
    )
    return artifact


def page(session: Session, run_id: str, thread_id: str, request: PageRequest) -> list[ArtifactRow]:
    """The run's artifacts (or, without a run, the thread's) in id order after the request's
    position, read with ``LIMIT size + 1`` as :func:`agentrt_core.paging.cut_page` wants."""
    stmt = sa.select(ArtifactRow)
    stmt = (
        stmt.where(ArtifactRow.run_id == run_id)
        if run_id
        else stmt.where(ArtifactRow.thread_id == thread_id)
    )
    if request.after is not None:
        stmt = stmt.where(ArtifactRow.id > request.after[0])
    return list(session.scalars(stmt.order_by(ArtifactRow.id).limit(request.size + 1)))
