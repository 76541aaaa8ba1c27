"""Saved views: a runs list's filters kept per principal under a name (issue 30, item 9).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_saved_views",
        sa.Column("principal", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("query_json", sa.Text(), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("update_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("principal", "name", name=op.f("pk_runtime_saved_views")),
    )


def downgrade() -> None:
    op.drop_table("runtime_saved_views")
