"""``FindUsages``' reads: the steps that used a component, schema or model, and the runs bound
to an agent version, newest first, one page at a time.

The step queries read ``runtime_step_usages`` (the rows ``BeginStep``/``EndStep`` write with the
step), the run queries ``runtime_runs.agent_digest``; each is one ordered index range paged by
keyset (``docs/audit.md`` lists which index serves which query), never a scan of steps' JSON.

Every page function reads the uses in ``times`` by runs of ``namespaces`` (None: every
namespace) and at most ``page.size + 1`` rows after ``page.after`` (the keyset position
``(time, step or run id, usage name)``, name ``""`` for runs): the extra row tells the caller
another page follows. The namespace filter is part of the query, not applied to its page
afterwards: a page and its token are cut from what the caller may see, so they say nothing
about another namespace's runs (issue 25).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_core.paging import PageRequest
from registry import store as registry_store
from runtime_service.store.ledger import (
    USAGE_HAS_DIGEST,
    USAGE_HAS_SCHEMA,
    USAGE_IS_MODEL,
    StepRow,
    StepUsageRow,
)
from runtime_service.store.tables import RunRow

_U = cast(sa.Table, StepUsageRow.__table__)
_S = cast(sa.Table, StepRow.__table__)
_R = cast(sa.Table, RunRow.__table__)

#: How a usage row records a model: the one a step asked for, or the one its provider named.
ModelKind = Literal["model_requested", "model_reported"]


@dataclass(frozen=True)
class TimeRange:
    """When a use must have happened: from ``start`` (inclusive) to ``end`` (exclusive), each
    bound optional."""

    start: dt.datetime | None = None
    end: dt.datetime | None = None


def steps_using_digest(
    session: Session,
    digest: str,
    times: TimeRange,
    page: PageRequest,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[*tuple[Any, ...]]]:
    """A page of the uses of the component ``digest`` by steps."""
    return _step_uses(
        session, [_U.c.digest == digest, sa.text(USAGE_HAS_DIGEST)], times, page, namespaces
    )


def steps_using_schema(
    session: Session,
    schema_digest: str,
    times: TimeRange,
    page: PageRequest,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[*tuple[Any, ...]]]:
    """A page of the uses by steps of a tool whose input schema is ``schema_digest``."""
    return _step_uses(
        session,
        [_U.c.schema_digest == schema_digest, sa.text(USAGE_HAS_SCHEMA)],
        times,
        page,
        namespaces,
    )


def steps_using_model(
    session: Session,
    kind: ModelKind,
    model_id: str,
    times: TimeRange,
    page: PageRequest,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[*tuple[Any, ...]]]:
    """A page of the steps that requested (or were reported to have run) ``model_id``."""
    return _step_uses(
        session,
        [_U.c.kind == kind, _U.c.name == model_id, sa.text(USAGE_IS_MODEL)],
        times,
        page,
        namespaces,
    )


def _step_uses(
    session: Session,
    where: list[sa.ColumnElement[bool] | sa.TextClause],
    times: TimeRange,
    page: PageRequest,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[*tuple[Any, ...]]]:
    """Usage rows with their step's and run's columns: ``step_id, kind, name, version,
    schema_digest, start_time, run_id, sequence, type, attempt_id, thread_id,
    agent_digest``."""
    stmt = (
        sa.select(
            _U.c.step_id,
            _U.c.kind,
            _U.c.name,
            _U.c.version,
            _U.c.schema_digest,
            _U.c.start_time,
            _U.c.run_id,
            _S.c.sequence,
            _S.c.type,
            _S.c.attempt_id,
            _R.c.thread_id,
            _R.c.agent_digest,
        )
        .join(_S, _S.c.id == _U.c.step_id)
        .join(_R, _R.c.id == _U.c.run_id)
        .where(*where, *_time_filters(_U.c.start_time, times), *_in(_R.c.namespace, namespaces))
        .order_by(_U.c.start_time.desc(), _U.c.step_id.desc(), _U.c.name.desc())
        .limit(page.size + 1)
    )
    if page.after is not None:
        stmt = stmt.where(*_after(_U.c.start_time, _U.c.step_id, _U.c.name, page.after))
    return session.execute(stmt).all()


def runs_of_agent(
    session: Session,
    agent_digest: str,
    times: TimeRange,
    page: PageRequest,
    namespaces: frozenset[str] | None,
) -> Sequence[sa.Row[*tuple[Any, ...]]]:
    """A page of the runs bound to the agent version ``agent_digest``, by creation time:
    ``id, thread_id, agent_digest, agent_id, agent_version_label, create_time``."""
    stmt = (
        sa.select(
            _R.c.id,
            _R.c.thread_id,
            _R.c.agent_digest,
            _R.c.agent_id,
            _R.c.agent_version_label,
            _R.c.create_time,
        )
        .where(
            _R.c.agent_digest == agent_digest,
            *_time_filters(_R.c.create_time, times),
            *_in(_R.c.namespace, namespaces),
        )
        .order_by(_R.c.create_time.desc(), _R.c.id.desc())
        .limit(page.size + 1)
    )
    if page.after is not None:
        stmt = stmt.where(*_after(_R.c.create_time, _R.c.id, None, page.after))
    return session.execute(stmt).all()


def _time_filters(column: sa.ColumnElement[Any], times: TimeRange) -> list[sa.ColumnElement[bool]]:
    found: list[sa.ColumnElement[bool]] = []
    if times.start is not None:
        found.append(column >= times.start)
    if times.end is not None:
        found.append(column < times.end)
    return found


def _in(
    column: sa.ColumnElement[Any], namespaces: frozenset[str] | None
) -> list[sa.ColumnElement[bool]]:
    return [] if namespaces is None else [column.in_(sorted(namespaces))]


def _after(
    time: sa.ColumnElement[Any],
    ident: sa.ColumnElement[Any],
    name: sa.ColumnElement[Any] | None,
    key: list[Any],
) -> list[sa.ColumnElement[bool]]:
    """Rows strictly after ``key`` in newest-first order. The leading ``time <= t`` is
    redundant but bounds the index range scan (an OR alone would not)."""
    t, i, n = key
    tail: sa.ColumnElement[bool] = ident < i
    if name is not None:
        tail = sa.or_(ident < i, sa.and_(ident == i, name < n))
    return [time <= t, sa.or_(time < t, sa.and_(time == t, tail))]


# -- the registry side -----------------------------------------------------------------------


def agents_pinning(session: Session, component_digest: str) -> Sequence[sa.Row[str, str, str]]:
    """``(agent digest, agent id, version label)`` of every agent version whose closure pins
    the component ``component_digest``."""
    entries = registry_store.ClosureEntryRow
    versions = registry_store.AgentVersionRow
    return session.execute(
        sa.select(entries.agent_digest, versions.agent_id, versions.version_label)
        .join(versions, versions.digest == entries.agent_digest)
        .where(entries.component_digest == component_digest)
    ).all()


def is_schema_digest(session: Session, digest: str) -> bool:
    """Whether some component's tool input schema has the digest ``digest``."""
    schema = sa.select(registry_store.ComponentRow.digest).where(
        registry_store.ComponentRow.schema_digest == digest
    )
    return session.execute(schema.limit(1)).first() is not None
