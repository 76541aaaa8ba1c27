"""The one-row record that names this agentrt database.

Every replica over one database shares its ``installation_id``; audit exports carry it so a
bundle says which ledger it came from.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import Mapped, Session, mapped_column

from agentrt_base.db import Base, utcnow
from agentrt_core.ids import new_id


class Installation(Base):
    __tablename__ = "installation"

    # A constant key makes "exactly one row" a primary-key fact rather than a convention.
    singleton: Mapped[int] = mapped_column(primary_key=True, default=1)
    installation_id: Mapped[str] = mapped_column(unique=True)
    create_time: Mapped[dt.datetime]


def ensure_installation(session: Session) -> str:
    """Return the installation id, creating the row on first start."""
    existing: str | None = session.scalar(select(Installation.installation_id))
    if existing is not None:
        return existing
    row = Installation(singleton=1, installation_id=new_id("ins"), create_time=utcnow())
    session.add(row)
    session.flush()
    return row.installation_id
