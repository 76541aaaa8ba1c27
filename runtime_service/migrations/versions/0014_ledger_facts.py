"""What a model fallback follows is read from the ledger (issue 17, item 2).

A MODEL_CALL step chosen FALLBACK_AFTER_ERROR records the failed MODEL_CALL step of the same
attempt it follows (``fallback_from_step_id``; empty on every step recorded before, and on
every other step). BeginStep(MODEL_CALL) finds that step, the attempt's latest model call, by
one probe of a partial index on (attempt_id, sequence) holding only MODEL_CALL steps.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_MODEL_CALLS = "type = 'MODEL_CALL'"


def upgrade() -> None:
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("fallback_from_step_id", sa.String(40), nullable=False, server_default="")
        )
        batch_op.create_index(
            "ix_runtime_steps_attempt_id_model_calls",
            ["attempt_id", "sequence"],
            unique=False,
            sqlite_where=sa.text(_MODEL_CALLS),
            postgresql_where=sa.text(_MODEL_CALLS),
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_attempt_id_model_calls")
        batch_op.drop_column("fallback_from_step_id")
