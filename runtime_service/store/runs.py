"""Runs as stored: the reads other writes build on (a run locked, its active attempt)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.errors import NotFound
from runtime_service.store.tables import AttemptRow, RunRow


def run_for_update(session: Session, run_id: str) -> RunRow:
    """The run, locked, with the values the lock protects: ``populate_existing`` refreshes
    an object this session loaded earlier (a plain query would hand it back as it was)."""
    run = session.scalar(
        sa.select(RunRow)
        .where(RunRow.id == run_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if run is None:
        raise NotFound("run", run_id)
    return run


def active_attempt(session: Session, run: RunRow) -> AttemptRow | None:
    if not run.current_attempt_id:
        return None
    return session.get(AttemptRow, run.current_attempt_id)
