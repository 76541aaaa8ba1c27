"""Run attestations as they were signed when each run ended (``RunAttestationRow``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from agentrt_base.db import Base
from runtime_service.lifecycle import TERMINAL
from runtime_service.store.tables import RunRow


class RunAttestationRow(Base):
    """The DSSE envelope signed when a run ended. Written once; never changed (a row changed
    by hand no longer verifies with the key, and the run it names no longer matches it)."""

    __tablename__ = "runtime_run_attestations"

    run_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    #: The envelope's JSON, as served.
    envelope: Mapped[str] = mapped_column(sa.Text)
    key_id: Mapped[str] = mapped_column(sa.String(250))
    sign_time: Mapped[dt.datetime]


def get(session: Session, run_id: str) -> str | None:
    return session.scalar(
        sa.select(RunAttestationRow.envelope).where(RunAttestationRow.run_id == run_id)
    )


def keep(session: Session, run_id: str, envelope: str, key_id: str, now: dt.datetime) -> str:
    """Keep the envelope unless the run has one already (another replica signed it first:
    with one key and one snapshot of an ended run it is the same envelope); the one kept."""
    table = RunAttestationRow.__table__
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(
        dialect.insert(table)
        .values(run_id=run_id, envelope=envelope, key_id=key_id, sign_time=now)
        .on_conflict_do_nothing(index_elements=[table.c.run_id])
    )
    kept = get(session, run_id)
    assert kept is not None
    return kept


def unattested(session: Session, after_id: str, limit: int) -> Sequence[str]:
    """Ended runs with no attestation, by id after ``after_id``: what a server attests at
    start that ended while no server could (a crash between the end's commit and its
    signature)."""
    r, a = RunRow, RunAttestationRow
    return session.scalars(
        sa.select(r.id)
        .outerjoin(a, a.run_id == r.id)
        .where(r.id > after_id, r.status.in_([s.value for s in TERMINAL]), a.run_id.is_(None))
        .order_by(r.id)
        .limit(limit)
    ).all()
