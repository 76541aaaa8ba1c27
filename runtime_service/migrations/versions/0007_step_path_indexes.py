"""Fewer index entries written per step.

* A run's events are found through the chain's unique (thread_id, run_id, sequence) index,
  not a second (run_id, sequence) one.
* The idempotency-key index holds only the steps that have a key.
* The usage indexes hold only the rows their FindUsages query asks for (by digest, by tool
  schema digest, by model id); the (kind, name, version) one, which no query used, goes.

Every index a step's rows go into is work on the step path and, for per-run indexes whose
pages a batch rarely shares, one more page written to the log at each commit: at 16
concurrent runs the first two were ~20% of the step path's log frames, and a model call's
three usage rows went into 18 b-trees, now 9 (``bench/results/steps.md``).

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


_USAGE_INDEXES = {
    "ix_runtime_step_usages_digest_time": (["digest", "start_time"], "digest != ''"),
    "ix_runtime_step_usages_schema_digest_time": (
        ["schema_digest", "start_time"],
        "schema_digest != ''",
    ),
    "ix_runtime_step_usages_kind_name_time": (
        ["kind", "name", "start_time"],
        "kind IN ('model_requested', 'model_reported')",
    ),
}


def upgrade() -> None:
    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_events_run_id_sequence")

    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_step_usages_kind_name_version")
        for name, (columns, where) in _USAGE_INDEXES.items():
            batch_op.drop_index(name)
            batch_op.create_index(
                name,
                columns,
                unique=False,
                sqlite_where=sa.text(where),
                postgresql_where=sa.text(where),
            )

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
    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        for name, (columns, _) in _USAGE_INDEXES.items():
            batch_op.drop_index(name)
            batch_op.create_index(name, columns, unique=False)
        batch_op.create_index(
            "ix_runtime_step_usages_kind_name_version", ["kind", "name", "version"], unique=False
        )

    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_run_id_idempotency_key")
        batch_op.create_index(
            "ix_runtime_steps_run_id_idempotency_key", ["run_id", "idempotency_key"], unique=False
        )

    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_events_run_id_sequence", ["run_id", "sequence"], unique=False
        )
