"""Two fewer index pages written per step: a step's events are found through the chain's
unique (thread_id, run_id, sequence) index instead of a second (run_id, sequence) one, and
the idempotency-key index holds only the steps that have a key.

Every index a step's rows go into is one more page written to the log at each commit, and
the pages of per-run indexes are rarely shared within a batch: at 16 concurrent runs these
two were ~20% of the step path's log frames (``bench/results/steps.md``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_events_run_id_sequence")

    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_run_id_idempotency_key")
        batch_op.create_index(
            "ix_runtime_steps_run_id_idempotency_key",
            ["run_id", "idempotency_key"],
            unique=False,
            sqlite_where=sa.text("idempotency_key != ''"),
            postgresql_where=sa.text("idempotency_key != ''"),
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_run_id_idempotency_key")
        batch_op.create_index(
            "ix_runtime_steps_run_id_idempotency_key", ["run_id", "idempotency_key"], unique=False
        )

    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_events_run_id_sequence", ["run_id", "sequence"], unique=False
        )
