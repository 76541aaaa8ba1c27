"""The installation record: names this agentrt database.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from agentrt_base.db import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "installation",
        sa.Column("singleton", sa.Integer(), nullable=False),
        sa.Column("installation_id", sa.String(), nullable=False),
        sa.Column("create_time", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_installation")),
        sa.UniqueConstraint("installation_id", name=op.f("uq_installation_installation_id")),
    )


def downgrade() -> None:
    op.drop_table("installation")
