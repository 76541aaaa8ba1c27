"""Any number of inline system prompts.

An agent's inline system prompt is stored as an anonymous PROMPT component: empty name and
version, known by its digest alone. The (name, version) unique constraint counted those empty
strings as a name@version, so only the first inline prompt ever published could be stored
and every other one failed the constraint. The constraint becomes a unique index over named
components only (a partial index, on both engines); digests and rows are unchanged.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("registry_components", schema=None) as batch_op:
        batch_op.drop_constraint("uq_registry_components_name_version", type_="unique")
        batch_op.create_index(
            "ix_registry_components_name_version",
            ["name", "version"],
            unique=True,
            # As SQLAlchemy renders `~anonymous` on each engine (see registry.store).
            sqlite_where=sa.text("anonymous = 0"),
            postgresql_where=sa.text("NOT anonymous"),
        )


def downgrade() -> None:
    # Fails (unique violation) once a second inline prompt is stored: the old schema cannot
    # hold two.
    with op.batch_alter_table("registry_components", schema=None) as batch_op:
        batch_op.drop_index("ix_registry_components_name_version")
        batch_op.create_unique_constraint(
            "uq_registry_components_name_version", ["name", "version"]
        )
