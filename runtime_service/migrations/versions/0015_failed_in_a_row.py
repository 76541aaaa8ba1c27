"""An attempt counts its steps FAILED in a row (issue 27, item 1).

A worker that called a dead model provider again and again without backing off recorded
2,508 FAILED steps in 44 seconds. BeginStep now ends an attempt whose last
``MAX_FAILED_STEPS_IN_A_ROW`` steps all FAILED (``runtime_service.step_rules``); the count is
kept on the attempt, as its usage totals are, so the check reads no steps. Attempts that
exist when this runs start from 0.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("failed_in_a_row", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.drop_column("failed_in_a_row")
