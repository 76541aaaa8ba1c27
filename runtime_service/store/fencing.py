"""Fenced writes: the run and attempt a worker's fence names, locked, if the fence holds.

The rule itself is ``runtime_service.fence`` (shared with the step engine); this is its read
for the ORM writes (turns, checkpoints, artifacts, heartbeats, FinishAttempt).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from runtime_service.fence import FenceClaim, fence_error
from runtime_service.store.tables import AttemptRow, RunRow

_LOCK_FENCED = (
    sa.select(RunRow.id)
    .join(AttemptRow, AttemptRow.run_id == RunRow.id)
    .where(AttemptRow.id == sa.bindparam("attempt_id"))
    .with_for_update(of=RunRow)
)
_FENCED = (
    sa.select(RunRow, AttemptRow)
    .join(AttemptRow, AttemptRow.run_id == RunRow.id)
    .where(AttemptRow.id == sa.bindparam("attempt_id"))
    .execution_options(populate_existing=True)
)


@dataclass(frozen=True, slots=True)
class _Fenced:
    """A run and attempt as :func:`runtime_service.fence.fence_error` reads them."""

    current_attempt_id: str
    lease_epoch: int
    lease_expire_time: dt.datetime
    lease_token_hash: str
    attempt_status: str
    run_status: str


def fenced(session: Session, claim: FenceClaim) -> tuple[RunRow, AttemptRow]:
    """The run (locked) and attempt a fence names, if it still holds; else the error of the
    fence rule (``runtime_service.fence``)."""
    attempt_id = claim.attempt_id
    if attempt_id and claim.lease_epoch > 0:
        # The run row is locked first, by a statement of its own, on PostgreSQL (SQLite's
        # writer holds the database lock already): a READ COMMITTED statement that waited for
        # a row lock re-reads the locked row but not its joins, so an attempt read in the
        # locking statement could predate the transaction it waited for (its usage totals
        # then lost that update).
        if session.get_bind().dialect.name == "postgresql":
            session.execute(_LOCK_FENCED, {"attempt_id": attempt_id})
        found = session.execute(_FENCED, {"attempt_id": attempt_id}).first()
    else:
        found = None
    view = None
    if found is not None:
        run, attempt = found
        view = _Fenced(
            run.current_attempt_id,
            run.lease_epoch,
            attempt.lease_expire_time,
            attempt.lease_token_hash,
            attempt.status,
            run.status,
        )
    error = fence_error(claim, view, utcnow())
    if error is not None:
        raise error
    assert found is not None
    return found[0], found[1]
