"""Saved views: a principal's runs-list filters kept under names (``SavedViewRow``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from runtime_service.store.tables import SavedViewRow


def save(
    session: Session, principal: str, name: str, query_json: str, now: dt.datetime
) -> tuple[SavedViewRow, bool]:
    """Keep ``query_json`` as ``principal``'s view ``name``, replacing one of that name;
    return it and whether it is new. One statement (INSERT ... ON CONFLICT DO UPDATE), so two
    saves of one name at once on PostgreSQL both succeed, the later one winning."""
    table = SavedViewRow.__table__
    values = {
        "principal": principal,
        "name": name,
        "query_json": query_json,
        "create_time": now,
        "update_time": now,
    }
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.principal, table.c.name],
        set_={"query_json": stmt.excluded.query_json, "update_time": stmt.excluded.update_time},
    ).returning(table.c.create_time)
    created_at = session.execute(stmt).scalar_one()
    row = get(session, principal, name)
    assert row is not None
    return row, created_at == now


def get(session: Session, principal: str, name: str) -> SavedViewRow | None:
    return session.get(SavedViewRow, (principal, name), populate_existing=True)


def page(
    session: Session, principal: str, after_name: str | None, limit: int
) -> Sequence[SavedViewRow]:
    """Up to ``limit`` of ``principal``'s views by name, after ``after_name`` (exclusive)."""
    stmt = sa.select(SavedViewRow).where(SavedViewRow.principal == principal)
    if after_name is not None:
        stmt = stmt.where(SavedViewRow.name > after_name)
    return session.scalars(stmt.order_by(SavedViewRow.name).limit(limit)).all()


def delete(session: Session, principal: str, name: str) -> bool:
    """Delete ``principal``'s view ``name``; whether there was one."""
    deleted = session.execute(
        sa.delete(SavedViewRow)
        .where(SavedViewRow.principal == principal, SavedViewRow.name == name)
        .returning(SavedViewRow.name)
    ).first()
    return deleted is not None
