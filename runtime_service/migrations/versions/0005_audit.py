"""Indexes for the audit queries: steps by blob (partial: only steps that have one), step
usages by model id in time order, runs by agent digest in time order.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_runs_agent_digest_create_time",
            ["agent_digest", "create_time"],
            unique=False,
        )

    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_step_usages_kind_name_time", ["kind", "name", "start_time"], unique=False
        )

    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_steps_input_ref",
            ["input_ref"],
            unique=False,
            sqlite_where=sa.text("input_ref != ''"),
            postgresql_where=sa.text("input_ref != ''"),
        )
        batch_op.create_index(
            "ix_runtime_steps_output_ref",
            ["output_ref"],
            unique=False,
            sqlite_where=sa.text("output_ref != ''"),
            postgresql_where=sa.text("output_ref != ''"),
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_output_ref")
        batch_op.drop_index("ix_runtime_steps_input_ref")

    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_step_usages_kind_name_time")

    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_runs_agent_digest_create_time")
