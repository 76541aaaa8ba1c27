"""The audit's reads of one run: its rows, its event chain, the agent version it ran.

Provenance (``GetProvenance``), ``VerifyRun`` and ``ExportBundle`` read through these; the
use cases are in ``runtime_service.services.audit``. Every function only reads, inside the
caller's read transaction, which :func:`snapshot` makes one snapshot. Nothing read here is
written back, so a run's rows are answered as records (``runtime_service.records``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.installation import Installation
from agentrt_core.audit_bundle import Link
from agentrt_core.event_chain import StoredEvent, format_time
from registry import store as registry_store
from runtime_service.records import (
    Artifact,
    Attempt,
    BundledAgent,
    BundledComponent,
    Checkpoint,
    Input,
    Run,
    Step,
    Thread,
    artifact_of,
    attempt_of,
    checkpoint_of,
    input_of,
    new_step,
    run_of,
    thread_of,
)
from runtime_service.store.ledger import (
    ArtifactRow,
    CheckpointRow,
    InputRow,
    StepRow,
    StepUsageRow,
)
from runtime_service.store.tables import AttemptRow, EventRow, RunRow, ThreadRow

_S = cast(sa.Table, StepRow.__table__)
_E = cast(sa.Table, EventRow.__table__)
_U = cast(sa.Table, StepUsageRow.__table__)


def snapshot(session: Session) -> None:
    """Make the whole read transaction one snapshot.

    SQLite's read transaction already is one (WAL). PostgreSQL's default READ COMMITTED gives
    every statement its own: VerifyRun or ExportBundle of a live run would read the run's head,
    then events appended after it, and report a break that is not there. REPEATABLE READ for a
    read-only transaction costs nothing and can never fail to serialise.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


# -- by id -----------------------------------------------------------------------------------


def run(session: Session, run_id: str) -> Run | None:
    row = session.get(RunRow, run_id)
    return None if row is None else run_of(row)


def thread_of_run(session: Session, run: Run) -> Thread:
    thread = session.get(ThreadRow, run.thread_id)
    assert thread is not None  # runs reference their thread by foreign key
    return thread_of(thread)


def artifact(session: Session, artifact_id: str) -> Artifact | None:
    row = session.get(ArtifactRow, artifact_id)
    return None if row is None else artifact_of(row)


def installation_id(session: Session) -> str:
    return session.scalar(sa.select(Installation.installation_id)) or ""


# -- a run's records -------------------------------------------------------------------------


def attempts_of_run(session: Session, run_id: str) -> list[Attempt]:
    """The run's attempts, first to last."""
    rows = session.scalars(
        sa.select(AttemptRow).where(AttemptRow.run_id == run_id).order_by(AttemptRow.number)
    )
    return [attempt_of(row) for row in rows]


def steps_of_run(session: Session, run_id: str, limit: int | None = None) -> list[Step]:
    """The run's steps in sequence order, the first ``limit`` of them if given.

    Read with Core rather than the ORM: a 200-step run is the common case, and identity-map
    work doubled its cost.
    """
    stmt = sa.select(_S).where(_S.c.run_id == run_id).order_by(_S.c.sequence)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [new_step(dict(row._mapping)) for row in session.execute(stmt)]


def artifacts_of_run(session: Session, run_id: str) -> list[Artifact]:
    rows = session.scalars(
        sa.select(ArtifactRow).where(ArtifactRow.run_id == run_id).order_by(ArtifactRow.id)
    )
    return [artifact_of(row) for row in rows]


def checkpoints_of_run(session: Session, run_id: str) -> list[Checkpoint]:
    rows = session.scalars(
        sa.select(CheckpointRow).where(CheckpointRow.run_id == run_id).order_by(CheckpointRow.id)
    )
    return [checkpoint_of(row) for row in rows]


def inputs_of_run(session: Session, run_id: str) -> list[Input]:
    rows = session.scalars(
        sa.select(InputRow).where(InputRow.run_id == run_id).order_by(InputRow.id)
    )
    return [input_of(row) for row in rows]


def usages_of_run(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The usage index rows of the run's steps (``FindUsages`` serves them), as columns.

    Found through the steps (by their run, then the usage key's leading ``step_id``), not by
    the usage row's own ``run_id``, which has no index and is itself a field to check: a row
    moved to another run is still found under its step's run, and reported there.
    """
    rows = session.execute(
        sa.select(_U)
        .join(_S, _S.c.id == _U.c.step_id)
        .where(_S.c.run_id == run_id)
        .order_by(_S.c.sequence, _U.c.kind, _U.c.name)
    )
    return [dict(row._mapping) for row in rows]


def chain_links(session: Session, run: Run) -> Iterator[Link]:
    """The run's event chain in sequence order, as the hash covers each event, streamed (a
    long run's chain is read a few thousand rows at a time, not all at once)."""
    rows = session.execute(
        sa.select(_E)
        .where(_E.c.thread_id == run.thread_id, _E.c.run_id == run.id)
        .order_by(_E.c.sequence)
        .execution_options(yield_per=2000)
    )
    return (_link(row) for row in rows)


def _link(row: Any) -> Link:
    try:
        attributes = json.loads(row.attributes_json)
    except ValueError:
        return Link(
            row.id,
            row.thread_id,
            row.run_id,
            row.sequence,
            row.event_type,
            format_time(row.event_time),
            None,
            row.prev_hash,
            row.hash,
            problem=f"event {row.id} ({row.event_type}): its attributes are not valid JSON",
        )
    return Link.from_stored(
        StoredEvent(
            row.id,
            row.thread_id,
            row.run_id,
            row.sequence,
            row.thread_cursor,
            row.event_type,
            row.event_time,
            attributes,
            row.prev_hash,
            row.hash,
        )
    )


# -- the agent version a run ran (registry tables) -------------------------------------------


def tag_events_before(
    session: Session, run: Run
) -> Sequence[sa.Row[int, str, str, str, dt.datetime]]:
    """The run's agent's tag events up to the run's resolution, as
    ``(sequence, tag, type, to_digest, event_time)``.

    An event is "before" the run if its sequence is at most the one the run's tag resolution
    read (exact: that event was committed and visible), or if it was written no later than
    the resolution (by the clock, for moves of the agent's other tags).
    """
    t = registry_store.TagEventRow
    return session.execute(
        sa.select(t.sequence, t.tag, t.type, t.to_digest, t.event_time).where(
            t.agent_id == run.agent_id,
            sa.or_(
                t.sequence <= run.agent_tag_event_sequence,
                t.event_time <= run.agent_resolve_time,
            ),
        )
    ).all()


def agent_version_as_stored(session: Session, digest: str) -> BundledAgent | None:
    """The agent version of ``digest`` as the registry stored it (its JSON parsed)."""
    row = registry_store.agent_version_by_digest(session, digest)
    if row is None:
        return None
    return BundledAgent(
        agent_id=row.agent_id,
        version_label=row.version_label,
        digest=row.digest,
        description=row.description,
        definition=registry_store.loads(row.definition_json),
        closure=registry_store.loads(row.closure_json),
        publish_time=row.publish_time,
        provenance=registry_store.loads(row.provenance_json),
        principal=row.principal,
        verified_provenance=(
            registry_store.loads(row.verified_provenance_json)
            if row.verified_provenance_json
            else None
        ),
    )


def closure_components(session: Session, agent_digest: str) -> list[BundledComponent]:
    """The components an agent version pins, in its closure's slot order, as stored."""
    c = registry_store.ComponentRow
    entries = registry_store.ClosureEntryRow
    rows = session.scalars(
        sa.select(c)
        .join(entries, entries.component_digest == c.digest)
        .where(entries.agent_digest == agent_digest)
        .order_by(entries.slot)
    )
    return [
        BundledComponent(
            kind=row.kind,
            name=row.name,
            version=row.version,
            description=row.description,
            spec=registry_store.loads(row.spec_json),
            digest=row.digest,
            schema_digest=row.schema_digest,
        )
        for row in rows
    ]
