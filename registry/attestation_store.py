"""Attestations attached to agent versions: their table and queries (``registry/attestations.py``
holds the rules)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from agentrt_base.db import Base


class AttestationRow(Base):
    """A DSSE-signed in-toto statement about one agent version, as attached. Never changed;
    each is also an entry of the registry log (``log_index``)."""

    __tablename__ = "registry_attestations"
    __table_args__ = (sa.UniqueConstraint("agent_digest", "envelope_digest"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    agent_digest: Mapped[str] = mapped_column(sa.String(71), index=True)
    predicate_type: Mapped[str] = mapped_column(sa.String(500))
    #: The attesting principal: whose trusted key signed it, or the OIDC caller the server
    #: signed it for.
    principal: Mapped[str] = mapped_column(sa.String(200))
    #: The key that signed the envelope (``name+hash``).
    key_id: Mapped[str] = mapped_column(sa.String(250))
    #: The caller's verified OIDC claims, when the server signed on its behalf.
    verified_json: Mapped[str | None] = mapped_column(sa.Text)
    #: SHA-256 of the envelope as stored: one envelope is attached once per version.
    envelope_digest: Mapped[str] = mapped_column(sa.String(71))
    envelope: Mapped[str] = mapped_column(sa.Text)
    attach_time: Mapped[dt.datetime]
    #: Its entry's index (set in the same transaction, after the append).
    log_index: Mapped[int] = mapped_column(sa.BigInteger)


def by_envelope(session: Session, agent_digest: str, envelope_digest: str) -> AttestationRow | None:
    return session.scalar(
        sa.select(AttestationRow).where(
            AttestationRow.agent_digest == agent_digest,
            AttestationRow.envelope_digest == envelope_digest,
        )
    )


def of_version(session: Session, agent_digest: str) -> Sequence[AttestationRow]:
    """Every attestation of a version (what a tag policy reads), oldest first."""
    a = AttestationRow
    return session.scalars(
        sa.select(a).where(a.agent_digest == agent_digest).order_by(a.log_index)
    ).all()


def page(
    session: Session, agent_digest: str, predicate_type: str, after: int | None, limit: int
) -> Sequence[AttestationRow]:
    a = AttestationRow
    stmt = sa.select(a).where(a.agent_digest == agent_digest)
    if predicate_type:
        stmt = stmt.where(a.predicate_type == predicate_type)
    if after is not None:
        stmt = stmt.where(a.log_index > after)
    return session.scalars(stmt.order_by(a.log_index).limit(limit)).all()
