"""The registry's tables and queries (SQLAlchemy 2.x, one schema for SQLite and PostgreSQL).

Every statement the registry runs is here, as a named function; the use cases
(``registry/service*.py``) call them and hold the rules, with no SQL of their own. The domain
values (``agentrt_core.model``) are built from rows here too, one function per kind.

Rows are only ever inserted, except a tag's current target and the per-agent tag sequence:
nothing with a digest is updated or deleted. Content (specs, definitions, closures) is stored
as the normalised JSON that was digested, so what is served is exactly what was hashed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from agentrt_base.db import Base
from agentrt_core.canonical import ComponentKind
from agentrt_core.model import (
    AgentDefinition,
    AgentVersion,
    ClosureEntry,
    Component,
    Provenance,
    Tag,
    TagEvent,
    VerifiedProvenance,
)
from agentrt_core.publishing import DigestedComponent

#: What a write that lost a unique-key race raises (at its flush or its commit): two replicas
#: inserting the same key at once on PostgreSQL. The loser's retry sees the winner's row.
KeyRace = sa.exc.IntegrityError


def dumps(value: Any) -> str:
    """JSON text for a stored document (compact; key order kept as given)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads(text: str) -> Any:
    return json.loads(text)


class ComponentRow(Base):
    """One published component version, or an anonymous PROMPT (an agent's inline system
    prompt), which has no name or version and is known by its digest alone."""

    __tablename__ = "registry_components"
    __table_args__ = (
        # A name@version is published once; anonymous prompts are left out of the index
        # (any number of them share the empty name and version, each its own digest).
        # The condition is spelled as SQLAlchemy renders `~anonymous` on each engine, so the
        # queries below, which all say `~anonymous`, can use the index on SQLite too.
        sa.Index(
            "ix_registry_components_name_version",
            "name",
            "version",
            unique=True,
            sqlite_where=sa.text("anonymous = 0"),
            postgresql_where=sa.text("NOT anonymous"),
        ),
        sa.Index("ix_registry_components_kind_name", "kind", "name"),
    )

    digest: Mapped[str] = mapped_column(sa.String(71), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(32))
    # Empty strings (not NULL) for an anonymous prompt; such rows are told apart by
    # `anonymous` and are found by digest only.
    name: Mapped[str] = mapped_column(sa.String(64))
    version: Mapped[str] = mapped_column(sa.String(128))
    anonymous: Mapped[bool] = mapped_column(default=False)
    description: Mapped[str] = mapped_column(sa.Text)
    spec_json: Mapped[str] = mapped_column(sa.Text)
    schema_digest: Mapped[str | None] = mapped_column(sa.String(71), index=True)
    publish_time: Mapped[dt.datetime]
    #: What the publisher said (Provenance: a display label, never verified).
    provenance_json: Mapped[str] = mapped_column(sa.Text)
    #: Who published: the authenticated principal ('' for rows written before it was kept).
    principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    #: The verified claims of the OIDC token it was published with (VerifiedProvenance), or
    #: NULL when it was published otherwise.
    verified_provenance_json: Mapped[str | None] = mapped_column(sa.Text)


class AgentRow(Base):
    """One agent id: the row a tag move locks, and the counter of its tag history."""

    __tablename__ = "registry_agents"

    agent_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    create_time: Mapped[dt.datetime]
    last_tag_sequence: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class AgentVersionRow(Base):
    """One published agent version: definition as written, closure as resolved."""

    __tablename__ = "registry_agent_versions"
    __table_args__ = (
        sa.UniqueConstraint("agent_id", "version_label"),
        sa.Index("ix_registry_agent_versions_agent_id_publish_time", "agent_id", "publish_time"),
    )

    digest: Mapped[str] = mapped_column(sa.String(71), primary_key=True)
    agent_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("registry_agents.agent_id"))
    version_label: Mapped[str] = mapped_column(sa.String(64))
    description: Mapped[str] = mapped_column(sa.Text)
    definition_json: Mapped[str] = mapped_column(sa.Text)
    closure_json: Mapped[str] = mapped_column(sa.Text)
    publish_time: Mapped[dt.datetime]
    #: What the publisher said (Provenance: a display label, never verified).
    provenance_json: Mapped[str] = mapped_column(sa.Text)
    #: Who published: the authenticated principal ('' for rows written before it was kept).
    principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    #: The verified claims of the OIDC token it was published with (VerifiedProvenance), or
    #: NULL when it was published otherwise.
    verified_provenance_json: Mapped[str | None] = mapped_column(sa.Text)


class ClosureEntryRow(Base):
    """One resolved reference of an agent version, a row per component for indexed reverse
    look-ups ("which agent versions pin repo-debug@2.1.0 / this tool schema?")."""

    __tablename__ = "registry_closure_entries"

    agent_digest: Mapped[str] = mapped_column(
        sa.String(71), sa.ForeignKey("registry_agent_versions.digest"), primary_key=True
    )
    # `system_prompt`, `model_policy`, `skills[<name>]`, `tools[<name>]`, … (unique per agent).
    slot: Mapped[str] = mapped_column(sa.String(80), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(32))
    name: Mapped[str] = mapped_column(sa.String(64))
    version: Mapped[str] = mapped_column(sa.String(128))
    component_digest: Mapped[str] = mapped_column(
        sa.String(71), sa.ForeignKey("registry_components.digest"), index=True
    )
    schema_digest: Mapped[str | None] = mapped_column(sa.String(71), index=True)
    requested_ref: Mapped[str] = mapped_column(sa.String(200))


class TagRow(Base):
    """A tag's current target."""

    __tablename__ = "registry_tags"

    agent_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("registry_agents.agent_id"), primary_key=True
    )
    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(
        sa.String(71), sa.ForeignKey("registry_agent_versions.digest"), index=True
    )
    update_time: Mapped[dt.datetime]
    #: The display label the mover gave (SetTagRequest.actor).
    updated_by: Mapped[str] = mapped_column(sa.String(200))
    #: The authenticated principal that moved it ('' for moves before it was kept).
    updated_by_principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    event_sequence: Mapped[int] = mapped_column(sa.BigInteger)


class TagEventRow(Base):
    """One entry of an agent's append-only tag history."""

    __tablename__ = "registry_tag_events"
    __table_args__ = (sa.Index("ix_registry_tag_events_to_digest", "to_digest"),)

    agent_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("registry_agents.agent_id"), primary_key=True
    )
    sequence: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    tag: Mapped[str] = mapped_column(sa.String(64))
    type: Mapped[str] = mapped_column(sa.String(16))
    from_digest: Mapped[str] = mapped_column(sa.String(71))
    to_digest: Mapped[str] = mapped_column(sa.String(71))
    #: The display label the caller gave (SetTagRequest.actor / DeleteTagRequest.actor).
    actor: Mapped[str] = mapped_column(sa.String(200))
    #: The authenticated principal that made the move ('' for moves before it was kept).
    principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    reason: Mapped[str] = mapped_column(sa.Text)
    provenance_json: Mapped[str] = mapped_column(sa.Text)
    event_time: Mapped[dt.datetime]


# -- queries -------------------------------------------------------------------------------


def component_by_digest(session: Session, digest: str) -> ComponentRow | None:
    return session.get(ComponentRow, digest)


def component_by_version(session: Session, name: str, version: str) -> ComponentRow | None:
    return session.scalar(
        sa.select(ComponentRow).where(
            ComponentRow.name == name, ComponentRow.version == version, ~ComponentRow.anonymous
        )
    )


def component_digest_by_version(session: Session, name: str, version: str) -> str | None:
    return session.execute(
        sa.select(ComponentRow.digest).where(
            ComponentRow.name == name, ComponentRow.version == version, ~ComponentRow.anonymous
        )
    ).scalar()


def component_versions_named(
    session: Session, names: Iterable[str]
) -> Sequence[tuple[str, str, str]]:
    """(name, version, digest) of every published version of each name."""
    c = ComponentRow
    rows = session.execute(
        sa.select(c.name, c.version, c.digest).where(c.name.in_(list(names)), ~c.anonymous)
    ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def component_digests_named(session: Session, name: str) -> Sequence[str]:
    """Digests of every published version of a name (few per name; ranges pick among them)."""
    return (
        session.execute(
            sa.select(ComponentRow.digest).where(ComponentRow.name == name, ~ComponentRow.anonymous)
        )
        .scalars()
        .all()
    )


def any_component_named(session: Session, name: str) -> ComponentRow | None:
    return session.scalar(
        sa.select(ComponentRow).where(ComponentRow.name == name, ~ComponentRow.anonymous).limit(1)
    )


def agent_version_by_digest(session: Session, digest: str) -> AgentVersionRow | None:
    return session.get(AgentVersionRow, digest)


def agent_version_by_label(session: Session, agent_id: str, label: str) -> AgentVersionRow | None:
    return session.scalar(
        sa.select(AgentVersionRow).where(
            AgentVersionRow.agent_id == agent_id, AgentVersionRow.version_label == label
        )
    )


def agent_digest_by_label(session: Session, agent_id: str, label: str) -> str | None:
    return session.execute(
        sa.select(AgentVersionRow.digest).where(
            AgentVersionRow.agent_id == agent_id, AgentVersionRow.version_label == label
        )
    ).scalar()


# Resolving a tag is the registry's hot read (every run created from `agent:prod`): one
# prebuilt statement answers the target, its history position and every tag on that target.
# Prebuilt with bind parameters and run on the session's connection, it costs ~0.3 ms instead
# of ~2 ms for two freshly built ORM queries.
_tag = TagRow.__table__.alias("tag")
_sibling = TagRow.__table__.alias("sibling")
_RESOLVE_TAG = (
    sa.select(_tag.c.digest, _tag.c.event_sequence, _sibling.c.name)
    .join(_sibling, _sibling.c.digest == _tag.c.digest)
    .where(_tag.c.agent_id == sa.bindparam("agent_id"), _tag.c.name == sa.bindparam("tag"))
)
_TAGS_ON = sa.select(TagRow.name).where(TagRow.digest == sa.bindparam("digest"))


def resolve_tag(session: Session, agent_id: str, name: str) -> tuple[str, int, list[str]] | None:
    """(digest, event sequence, every tag on that digest) for ``agent_id:name``, or None."""
    rows = session.connection().execute(_RESOLVE_TAG, {"agent_id": agent_id, "tag": name}).all()
    if not rows:
        return None
    return rows[0][0], rows[0][1], sorted(r[2] for r in rows)


def tag(session: Session, agent_id: str, name: str, *, for_update: bool = False) -> TagRow | None:
    stmt = sa.select(TagRow).where(TagRow.agent_id == agent_id, TagRow.name == name)
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalar(stmt)


def tags_pointing_at(session: Session, digest: str) -> list[str]:
    return sorted(session.connection().execute(_TAGS_ON, {"digest": digest}).scalars().all())


def lock_agent(session: Session, agent_id: str) -> AgentRow | None:
    """The agent row, locked for the rest of the transaction (PostgreSQL ``FOR UPDATE``; on
    SQLite the writer's ``BEGIN IMMEDIATE`` already serialises every write)."""
    return session.scalar(
        sa.select(AgentRow).where(AgentRow.agent_id == agent_id).with_for_update()
    )


# -- rows -> domain values -------------------------------------------------------------------


def verified(text: str | None) -> VerifiedProvenance | None:
    """A stored ``verified_provenance_json`` (NULL: published without an OIDC token)."""
    return VerifiedProvenance.from_json(loads(text)) if text else None


def verified_json(value: VerifiedProvenance | None) -> str | None:
    return dumps(value.to_json()) if value is not None else None


def component_of(row: ComponentRow) -> Component:
    return Component(
        kind=ComponentKind(row.kind),
        name=row.name,
        version=row.version,
        digest=row.digest,
        description=row.description,
        spec=loads(row.spec_json),
        schema_digest=row.schema_digest,
        publish_time=row.publish_time,
        provenance=Provenance.from_json(loads(row.provenance_json)),
        anonymous=row.anonymous,
        principal=row.principal,
        verified=verified(row.verified_provenance_json),
    )


def agent_version_of(session: Session, row: AgentVersionRow) -> AgentVersion:
    """The version of ``row``, with the tags pointing at it now (read in ``session``)."""
    return AgentVersion(
        agent_id=row.agent_id,
        version_label=row.version_label,
        digest=row.digest,
        definition=AgentDefinition.from_json(loads(row.definition_json)),
        closure=tuple(ClosureEntry.from_json(e) for e in loads(row.closure_json)),
        publish_time=row.publish_time,
        provenance=Provenance.from_json(loads(row.provenance_json)),
        tags=tuple(tags_pointing_at(session, row.digest)),
        principal=row.principal,
        verified=verified(row.verified_provenance_json),
    )


def tag_of(row: TagRow) -> Tag:
    return Tag(
        row.agent_id,
        row.name,
        row.digest,
        row.update_time,
        row.updated_by_principal,
        row.event_sequence,
        updated_by_label=row.updated_by,
    )


def tag_event_of(row: TagEventRow) -> TagEvent:
    return TagEvent(
        sequence=row.sequence,
        agent_id=row.agent_id,
        tag=row.tag,
        type=row.type,
        from_digest=row.from_digest,
        to_digest=row.to_digest,
        actor=row.principal,
        reason=row.reason,
        provenance=Provenance.from_json(loads(row.provenance_json)),
        event_time=row.event_time,
        actor_label=row.actor,
    )


# -- pages (keyset: each takes the last row's key of the page before) ------------------------


def components_page(
    session: Session,
    kind: str,
    name: str,
    after: tuple[str, dt.datetime, str] | None,
    limit: int,
) -> Sequence[ComponentRow]:
    """Published components (``kind`` and ``name`` filter when not empty), by name, then
    newest first."""
    c = ComponentRow
    stmt = sa.select(c).where(~c.anonymous)
    if kind:
        stmt = stmt.where(c.kind == kind)
    if name:
        stmt = stmt.where(c.name == name)
    if after is not None:
        after_name, t, after_digest = after
        stmt = stmt.where(
            sa.or_(
                c.name > after_name,
                sa.and_(c.name == after_name, c.publish_time < t),
                sa.and_(c.name == after_name, c.publish_time == t, c.digest < after_digest),
            )
        )
    stmt = stmt.order_by(c.name, c.publish_time.desc(), c.digest.desc()).limit(limit)
    return session.scalars(stmt).all()


def agent_versions_page(
    session: Session, agent_id: str, after: tuple[dt.datetime, str] | None, limit: int
) -> Sequence[AgentVersionRow]:
    """Agent versions (of ``agent_id`` when not empty), newest first."""
    v = AgentVersionRow
    stmt = sa.select(v)
    if agent_id:
        stmt = stmt.where(v.agent_id == agent_id)
    if after is not None:
        t, after_digest = after
        stmt = stmt.where(
            sa.or_(v.publish_time < t, sa.and_(v.publish_time == t, v.digest < after_digest))
        )
    stmt = stmt.order_by(v.publish_time.desc(), v.digest.desc()).limit(limit)
    return session.scalars(stmt).all()


def tags_page(
    session: Session, agent_id: str, after: tuple[str, str] | None, limit: int
) -> Sequence[TagRow]:
    """Tags (of ``agent_id`` when not empty), by agent, then name."""
    t = TagRow
    stmt = sa.select(t)
    if agent_id:
        stmt = stmt.where(t.agent_id == agent_id)
    if after is not None:
        stmt = stmt.where(
            sa.or_(t.agent_id > after[0], sa.and_(t.agent_id == after[0], t.name > after[1]))
        )
    return session.scalars(stmt.order_by(t.agent_id, t.name).limit(limit)).all()


def tag_events_page(
    session: Session, agent_id: str, tag_name: str, before: int | None, limit: int
) -> Sequence[TagEventRow]:
    """The agent's tag history (of ``tag_name`` when not empty), newest first."""
    e = TagEventRow
    stmt = sa.select(e).where(e.agent_id == agent_id)
    if tag_name:
        stmt = stmt.where(e.tag == tag_name)
    if before is not None:
        stmt = stmt.where(e.sequence < before)
    return session.scalars(stmt.order_by(e.sequence.desc()).limit(limit)).all()


def agent_exists(session: Session, agent_id: str) -> bool:
    return session.get(AgentRow, agent_id) is not None


# -- writes (inserts, and a tag's move) ------------------------------------------------------


def add_component(
    session: Session,
    digested: DigestedComponent,
    provenance: Provenance,
    principal: str,
    verified_provenance: VerifiedProvenance | None,
    now: dt.datetime,
) -> ComponentRow:
    """Insert the component (written now: its row is in the database for what follows)."""
    draft = digested.draft
    row = ComponentRow(
        digest=digested.digest,
        kind=draft.kind.value,
        name=draft.name,
        version=draft.version,
        anonymous=not draft.name,
        description=draft.description,
        spec_json=dumps(digested.spec),
        schema_digest=digested.schema_digest,
        publish_time=now,
        provenance_json=dumps(provenance.to_json()),
        principal=principal,
        verified_provenance_json=verified_json(verified_provenance),
    )
    session.add(row)
    session.flush()
    return row


def add_agent_if_new(session: Session, agent_id: str, now: dt.datetime) -> None:
    if session.get(AgentRow, agent_id) is None:
        session.add(AgentRow(agent_id=agent_id, create_time=now, last_tag_sequence=0))


def add_agent_version(session: Session, version: AgentVersion) -> None:
    """Insert the version and its closure entries (one row per pinned component)."""
    session.add(
        AgentVersionRow(
            digest=version.digest,
            agent_id=version.agent_id,
            version_label=version.version_label,
            description=version.definition.description,
            definition_json=dumps(version.definition.to_json()),
            closure_json=dumps([e.to_json() for e in version.closure]),
            publish_time=version.publish_time,
            provenance_json=dumps(version.provenance.to_json()),
            principal=version.principal,
            verified_provenance_json=verified_json(version.verified),
        )
    )
    session.flush()
    # Core executemany: one statement for the whole closure.
    session.execute(
        sa.insert(ClosureEntryRow),
        [
            {
                "agent_digest": version.digest,
                "slot": e.slot,
                "kind": e.kind.value,
                "name": e.name,
                "version": e.version,
                "component_digest": e.digest,
                "schema_digest": e.schema_digest,
                "requested_ref": e.requested_ref,
            }
            for e in version.closure
        ],
    )


def append_tag_event(
    session: Session,
    agent: AgentRow,
    tag_name: str,
    kind: str,
    from_digest: str,
    to_digest: str,
    *,
    principal: str,
    actor: str,
    reason: str,
    provenance: Provenance,
    now: dt.datetime,
) -> TagEvent:
    """The next entry of the agent's tag history (``agent`` locked by the caller)."""
    agent.last_tag_sequence += 1
    row = TagEventRow(
        agent_id=agent.agent_id,
        sequence=agent.last_tag_sequence,
        tag=tag_name,
        type=kind,
        from_digest=from_digest,
        to_digest=to_digest,
        principal=principal,
        actor=actor,
        reason=reason,
        provenance_json=dumps(provenance.to_json()),
        event_time=now,
    )
    session.add(row)
    return tag_event_of(row)


def point_tag(
    session: Session,
    current: TagRow | None,
    agent_id: str,
    tag_name: str,
    event: TagEvent,
    *,
    actor: str,
    principal: str,
) -> Tag:
    """Point the tag (``current``, its row read for update, or None for a new tag) where
    ``event`` moved it."""
    if current is None:
        current = TagRow(agent_id=agent_id, name=tag_name)
        session.add(current)
    current.digest = event.to_digest
    current.update_time = event.event_time
    current.updated_by = actor
    current.updated_by_principal = principal
    current.event_sequence = event.sequence
    session.flush()
    return tag_of(current)


def delete_tag(session: Session, current: TagRow) -> None:
    session.delete(current)
    session.flush()
