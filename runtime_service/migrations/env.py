"""Alembic environment: one migration tree for SQLite and PostgreSQL.

Migrations are run programmatically (:mod:`runtime_service.migrate`), which hands over an open
connection in ``config.attributes["connection"]``; there is no ``alembic.ini``.
"""

from __future__ import annotations

from alembic import context

from runtime_service.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
