"""What a thread, run, step, artifact or attempt belongs to, for permission checks: its
namespace and, below a run, the run's agent (``agentrt_base.access.Resource``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.access import Kind, Resource
from runtime_service.store.ledger import ArtifactRow, StepRow
from runtime_service.store.tables import AttemptRow, RunRow, ThreadRow

_RUN = sa.select(RunRow.namespace, RunRow.agent_id)
#: How each kind of id reaches its run (or thread): one indexed statement each.
_BY_KIND: dict[Kind, sa.Select[str, str]] = {
    Kind.RUN: _RUN.where(RunRow.id == sa.bindparam("id")),
    Kind.STEP: _RUN.join(StepRow, StepRow.run_id == RunRow.id).where(
        StepRow.id == sa.bindparam("id")
    ),
    Kind.ARTIFACT: _RUN.join(ArtifactRow, ArtifactRow.run_id == RunRow.id).where(
        ArtifactRow.id == sa.bindparam("id")
    ),
    Kind.ATTEMPT: _RUN.join(AttemptRow, AttemptRow.run_id == RunRow.id).where(
        AttemptRow.id == sa.bindparam("id")
    ),
}


def find(session: Session, kind: Kind, id_: str) -> Resource | None:
    """The resource ``id_`` (of ``kind``) belongs to; None if there is no such thing."""
    if kind is Kind.THREAD:
        namespace = session.scalar(sa.select(ThreadRow.namespace).where(ThreadRow.id == id_))
        return None if namespace is None else Resource(namespace=namespace)
    row = session.execute(_BY_KIND[kind], {"id": id_}).first()
    return None if row is None else Resource(namespace=row[0], name=row[1])


def namespaces_of_runs(session: Session, run_ids: set[str]) -> dict[str, str]:
    """Each run's namespace (runs that do not exist are left out)."""
    if not run_ids:
        return {}
    rows = session.execute(
        sa.select(RunRow.id, RunRow.namespace).where(RunRow.id.in_(sorted(run_ids)))
    )
    return {run_id: namespace for run_id, namespace in rows}
