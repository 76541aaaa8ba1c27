"""Run attestations: the DSSE envelope each run's end was signed with (issue 31, item 3).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_run_attestations",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("key_id", sa.String(length=250), nullable=False),
        sa.Column("sign_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runtime_run_attestations")),
    )


def downgrade() -> None:
    op.drop_table("runtime_run_attestations")
