"""The queue and the lease as stored: which run a worker gets, a lease renewed, an epoch
bumped, and what the reaper finds due."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from agentrt_base.access import Visibility
from runtime_service.lifecycle import TERMINAL, RunStatus
from runtime_service.store import runs
from runtime_service.store.tables import AttemptRow, RunRow


def _label(session: Session, key: str) -> sa.ColumnElement[Any]:
    """A run label's value, read from the stored JSON in SQL on either engine."""
    if session.get_bind().dialect.name == "postgresql":
        value: sa.ColumnElement[Any] = sa.cast(RunRow.labels_json, JSONB)[key].astext
        return value
    return sa.func.json_extract(RunRow.labels_json, "$." + json.dumps(key))


def lock_next_queued(
    session: Session,
    agent_ids: list[str],
    labels: dict[str, str],
    visible: Visibility,
    now: dt.datetime,
) -> RunRow | None:
    """The highest-priority, oldest run a worker may take now (queued, not blocked, before its
    deadline, of one of ``agent_ids`` if any, with every label of ``labels``, in what
    ``visible`` admits: the worker's namespaces and agent scopes), locked; None if there is
    none (or every one is locked by another acquirer)."""
    stmt = (
        sa.select(RunRow)
        .where(
            RunRow.status == RunStatus.QUEUED.value,
            RunRow.blocked_by_run_id == "",
            sa.or_(RunRow.deadline_time.is_(None), RunRow.deadline_time > now),
        )
        .order_by(RunRow.priority.desc(), RunRow.create_time, RunRow.id)
    )
    if agent_ids:
        stmt = stmt.where(RunRow.agent_id.in_(agent_ids))
    if visible.namespaces is not None:
        stmt = stmt.where(RunRow.namespace.in_(sorted(visible.namespaces)))
    if visible.scopes is not None:
        stmt = stmt.where(runs.agent_in_scopes(visible.scopes))
    for key, value in sorted(labels.items()):
        stmt = stmt.where(_label(session, key) == value)
    # SKIP LOCKED: concurrent acquirers on PostgreSQL take different rows instead of
    # queueing behind one (SQLite's single writer serialises acquirers already). Labels are
    # matched in SQL, so the first unlocked candidate is the one: lock just it.
    return session.scalars(stmt.limit(1).with_for_update(skip_locked=True)).first()


def renew(attempt: AttemptRow, now: dt.datetime) -> dt.datetime:
    """Extend the attempt's lease by its TTL from ``now``; the new expiry."""
    attempt.lease_expire_time = now + dt.timedelta(milliseconds=attempt.lease_ttl_ms)
    return attempt.lease_expire_time


def bump_epoch(run: RunRow) -> None:
    """Move the run's lease epoch on: every fence naming the old one stops holding."""
    run.lease_epoch += 1


def due_runs(session: Session, now: dt.datetime) -> list[str]:
    """Runs the reaper has to look at (at most 100 of each kind, each run once): an attempt's
    lease expired, a cancel or pause past its grace period, a live run past its deadline."""
    expired = sa.select(AttemptRow.run_id).where(
        AttemptRow.status == "ACTIVE", AttemptRow.lease_expire_time < now
    )
    stop_due = sa.select(RunRow.id).where(
        RunRow.status == RunStatus.RUNNING.value, RunRow.stop_deadline_time < now
    )
    past_deadline = sa.select(RunRow.id).where(
        RunRow.status.in_([s.value for s in RunStatus if s not in TERMINAL]),
        RunRow.deadline_time < now,
    )
    found: list[str] = []
    for stmt in (expired, stop_due, past_deadline):
        found += session.scalars(stmt.limit(100)).all()
    return list(dict.fromkeys(found))


def lock_unless_held(session: Session, run_id: str) -> RunRow | None:
    """The run, locked; None if another transaction holds its lock (or it does not exist)."""
    return session.scalar(
        sa.select(RunRow).where(RunRow.id == run_id).with_for_update(skip_locked=True)
    )
