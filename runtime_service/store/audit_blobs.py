"""Who references a blob: the steps that read or wrote it, the checkpoints that hold it as
their state, the artifacts made of it (``GetProvenance`` of a blob digest).

Each look-up is one index range (``docs/audit.md`` names them), capped at ``limit`` rows:
a blob shared by many runs could name thousands. Each takes the runs' ``namespaces`` (None:
every namespace) as part of the query, so the cap counts only what the caller may see and
another namespace's references can neither crowd out the caller's nor be counted (issue 25).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from runtime_service.records import Artifact, artifact_of
from runtime_service.store.ledger import ArtifactRow, CheckpointRow, StepRow
from runtime_service.store.tables import RunRow

#: The step column that holds a blob digest: what the step read, or what it wrote.
StepSide = Literal["input_ref", "output_ref"]

_STEP_COLUMNS = {"input_ref": StepRow.input_ref, "output_ref": StepRow.output_ref}


def _visible(run_id: Any, namespaces: frozenset[str] | None) -> list[Any]:
    """The condition that the run ``run_id`` is in ``namespaces`` (none for None)."""
    if namespaces is None:
        return []
    runs = sa.select(RunRow.id).where(RunRow.namespace.in_(sorted(namespaces)))
    return [run_id.in_(runs)]


def steps_with_blob(
    session: Session,
    digest: str,
    side: StepSide,
    limit: int,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[str, str]]:
    """``(step id, run id)`` of the steps whose ``side`` is ``digest``, by run and sequence."""
    column = _STEP_COLUMNS[side]
    return session.execute(
        sa.select(StepRow.id, StepRow.run_id)
        # `!= ""` matches the partial indexes' predicate word for word, which is
        # what lets SQLite (and PostgreSQL with a generic plan) use them.
        .where(column == digest, column != "", *_visible(StepRow.run_id, namespaces))
        .order_by(StepRow.run_id, StepRow.sequence)
        .limit(limit)
    ).all()


def checkpoints_with_state(
    session: Session, digest: str, limit: int, namespaces: frozenset[str] | None
) -> list[CheckpointRow]:
    return list(
        session.scalars(
            sa.select(CheckpointRow)
            .where(CheckpointRow.state_ref == digest, *_visible(CheckpointRow.run_id, namespaces))
            .order_by(CheckpointRow.id)
            .limit(limit)
        )
    )


def artifacts_with_blob(
    session: Session, digest: str, limit: int, namespaces: frozenset[str] | None
) -> list[Artifact]:
    rows = session.scalars(
        sa.select(ArtifactRow)
        .where(ArtifactRow.blob_digest == digest, *_visible(ArtifactRow.run_id, namespaces))
        .order_by(ArtifactRow.id)
        .limit(limit)
    )
    return [artifact_of(row) for row in rows]
