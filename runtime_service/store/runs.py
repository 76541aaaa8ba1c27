"""Runs as stored: the reads other writes build on (a run locked, its active attempt), and the
reads of runs, their attempts and their events that clients page through."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.access import scope_like
from agentrt_core import event_chain
from agentrt_core.errors import NotFound
from runtime_service import events
from runtime_service.lifecycle import RunStatus
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


def find(session: Session, run_id: str) -> RunRow | None:
    """The run (unlocked), or None."""
    return session.get(RunRow, run_id)


def get(session: Session, run_id: str) -> RunRow:
    """The run (unlocked).

    Raises:
        NotFound: no such run.
    """
    run = session.get(RunRow, run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


def by_request_id(session: Session, request_id: str) -> RunRow | None:
    """The run an earlier CreateRun stored under ``request_id`` (already scoped to its
    thread), if any."""
    return session.scalar(sa.select(RunRow).where(RunRow.request_id == request_id))


#: The statuses a run may still leave.
_ACTIVE = tuple(s.value for s in RunStatus if not s.terminal)


def lock_active(session: Session, thread_id: str) -> list[RunRow]:
    """The thread's non-terminal runs, oldest first, locked."""
    return list(
        session.scalars(
            sa.select(RunRow)
            .where(RunRow.thread_id == thread_id, RunRow.status.in_(_ACTIVE))
            .order_by(RunRow.create_time)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )


@dataclass(frozen=True)
class RunFilter:
    """What a list of runs is narrowed to (ListRuns's filters); an empty field: any."""

    thread_id: str = ""
    statuses: tuple[str, ...] = ()
    agent_id: str = ""
    namespace: str = ""
    #: The exact definition the runs are bound to.
    agent_digest: str = ""
    #: The tag the run's agent reference followed when it was created.
    agent_tag: str = ""
    #: Created at or after (inclusive) ...
    created_from: dt.datetime | None = None
    #: ... and before (exclusive).
    created_before: dt.datetime | None = None


def page(
    session: Session,
    where: RunFilter,
    *,
    namespaces: frozenset[str] | None,
    scopes: tuple[str, ...] | None,
    after_id: str | None,
    limit: int,
) -> Sequence[RunRow]:
    """Up to ``limit`` runs matching every filter of ``where`` in ``namespaces`` and of
    agents ``scopes`` match (None: any), newest id first, after ``after_id`` (exclusive) if
    given. (``where.namespace`` is already within ``namespaces``: the caller narrowed them.)"""
    stmt = sa.select(RunRow)
    if namespaces is not None:
        stmt = stmt.where(RunRow.namespace.in_(sorted(namespaces)))
    if scopes is not None:
        stmt = stmt.where(agent_in_scopes(scopes))
    if where.thread_id:
        stmt = stmt.where(RunRow.thread_id == where.thread_id)
    if where.statuses:
        stmt = stmt.where(RunRow.status.in_(where.statuses))
    if where.agent_id:
        stmt = stmt.where(RunRow.agent_id == where.agent_id)
    if where.agent_digest:
        stmt = stmt.where(RunRow.agent_digest == where.agent_digest)
    if where.agent_tag:
        stmt = stmt.where(RunRow.agent_resolved_via_tag == where.agent_tag)
    if where.created_from is not None:
        stmt = stmt.where(RunRow.create_time >= where.created_from)
    if where.created_before is not None:
        stmt = stmt.where(RunRow.create_time < where.created_before)
    if after_id is not None:
        stmt = stmt.where(RunRow.id < after_id)
    return session.scalars(stmt.order_by(RunRow.id.desc()).limit(limit)).all()


def agent_in_scopes(scopes: tuple[str, ...]) -> sa.ColumnElement[bool]:
    """The run's agent matches one of ``scopes`` (``agentrt_base.access.scope_matches``)."""
    return sa.or_(sa.false(), *(RunRow.agent_id.like(scope_like(p), escape="\\") for p in scopes))


def attempts_page(
    session: Session, run_id: str, after_number: int | None, limit: int
) -> Sequence[AttemptRow]:
    """Up to ``limit`` of the run's attempts in number order, after ``after_number``
    (exclusive) if given."""
    stmt = sa.select(AttemptRow).where(AttemptRow.run_id == run_id)
    if after_number is not None:
        stmt = stmt.where(AttemptRow.number > after_number)
    return session.scalars(stmt.order_by(AttemptRow.number).limit(limit)).all()


def events_after(
    session: Session, thread_id: str, run_id: str, after_sequence: int, limit: int
) -> list[event_chain.StoredEvent]:
    """Up to ``limit`` of the run's events after ``after_sequence``, in order (``thread_id`` is
    the run's: the chain's index is keyed by it)."""
    return events.run_events_after(session.connection(), thread_id, run_id, after_sequence, limit)


def count_active(session: Session) -> list[tuple[str, str, str, int]]:
    """``(namespace, agent_id, status, count)`` of the runs not yet ended. The status leads
    the acquisition index (``ix_runtime_runs_queue``), so this reads the active runs only,
    however many have ended."""
    active = [status.value for status in RunStatus if not status.terminal]
    rows = session.execute(
        sa.select(RunRow.namespace, RunRow.agent_id, RunRow.status, sa.func.count())
        .where(RunRow.status.in_(active))
        .group_by(RunRow.namespace, RunRow.agent_id, RunRow.status)
    )
    return [
        (namespace, agent_id, status, int(count)) for namespace, agent_id, status, count in rows
    ]
