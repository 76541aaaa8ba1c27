"""Inside a run: turns, steps with their resolved versions and usage index, inputs,
checkpoints, artifacts and blobs; runs count step sequences and turns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_blobs",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_runtime_blobs")),
    )
    op.create_table(
        "runtime_step_usages",
        sa.Column("step_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("schema_digest", sa.String(length=71), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("start_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("step_id", "kind", "name", name=op.f("pk_runtime_step_usages")),
    )
    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_step_usages_digest_time", ["digest", "start_time"], unique=False
        )
        batch_op.create_index(
            "ix_runtime_step_usages_kind_name_version", ["kind", "name", "version"], unique=False
        )
        batch_op.create_index(
            "ix_runtime_step_usages_schema_digest_time",
            ["schema_digest", "start_time"],
            unique=False,
        )

    op.create_table(
        "runtime_blob_chunks",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"],
            ["runtime_blobs.digest"],
            name=op.f("fk_runtime_blob_chunks_digest_runtime_blobs"),
        ),
        sa.PrimaryKeyConstraint("digest", "chunk", name=op.f("pk_runtime_blob_chunks")),
    )
    op.create_table(
        "runtime_artifacts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("thread_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.String(length=40), nullable=False),
        sa.Column("step_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.Column("blob_digest", sa.String(length=71), nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("labels_json", sa.Text(), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_artifacts_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_artifacts")),
        sa.UniqueConstraint("request_id", name=op.f("uq_runtime_artifacts_request_id")),
    )
    with op.batch_alter_table("runtime_artifacts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_runtime_artifacts_blob_digest"), ["blob_digest"], unique=False
        )
        batch_op.create_index("ix_runtime_artifacts_run_id", ["run_id"], unique=False)
        batch_op.create_index("ix_runtime_artifacts_thread_id", ["thread_id"], unique=False)

    op.create_table(
        "runtime_checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.String(length=40), nullable=False),
        sa.Column("step_id", sa.String(length=40), nullable=False),
        sa.Column("state_ref", sa.String(length=71), nullable=False),
        sa.Column("after_sequence", sa.BigInteger(), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_checkpoints_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_checkpoints")),
        sa.UniqueConstraint("request_id", name=op.f("uq_runtime_checkpoints_request_id")),
    )
    with op.batch_alter_table("runtime_checkpoints", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runtime_checkpoints_run_id"), ["run_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_runtime_checkpoints_state_ref"), ["state_ref"], unique=False
        )

    op.create_table(
        "runtime_inputs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.Column("sender", sa.String(length=200), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("delivered_step_id", sa.String(length=40), nullable=False),
        sa.Column("delivered_turn_id", sa.String(length=40), nullable=False),
        sa.Column("deliver_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_inputs_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_inputs")),
        sa.UniqueConstraint("request_id", name=op.f("uq_runtime_inputs_request_id")),
    )
    with op.batch_alter_table("runtime_inputs", schema=None) as batch_op:
        batch_op.create_index("ix_runtime_inputs_run_id_status", ["run_id", "status"], unique=False)

    op.create_table(
        "runtime_steps",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.String(length=40), nullable=False),
        sa.Column("turn_id", sa.String(length=40), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(length=24), nullable=False),
        sa.Column("operation", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("input_ref", sa.String(length=71), nullable=False),
        sa.Column("output_ref", sa.String(length=71), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("start_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("end_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("error_class", sa.String(length=32), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("retryable", sa.Boolean(), nullable=False),
        sa.Column("retry_of_step_id", sa.String(length=40), nullable=False),
        sa.Column("side_effect", sa.Boolean(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("input_revision", sa.BigInteger(), nullable=False),
        sa.Column("consumed_input_ids_json", sa.Text(), nullable=False),
        sa.Column("tool_name", sa.String(length=64), nullable=False),
        sa.Column("tool_arguments_json", sa.Text(), nullable=False),
        sa.Column("approval_decision", sa.String(length=16), nullable=False),
        sa.Column("approver", sa.String(length=200), nullable=False),
        sa.Column("approval_comment", sa.Text(), nullable=False),
        sa.Column("approval_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("approval_step_id", sa.String(length=40), nullable=False),
        sa.Column("completion_check", sa.String(length=200), nullable=False),
        sa.Column("model_policy_digest", sa.String(length=71), nullable=False),
        sa.Column("candidate_name", sa.String(length=200), nullable=False),
        sa.Column("candidate_reason", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=200), nullable=False),
        sa.Column("requested_model_id", sa.String(length=200), nullable=False),
        sa.Column("parameters_json", sa.Text(), nullable=False),
        sa.Column("reported_model_id", sa.String(length=200), nullable=False),
        sa.Column("system_prompt_digest", sa.String(length=71), nullable=False),
        sa.Column("context_digest", sa.String(length=71), nullable=False),
        sa.Column("skills_json", sa.Text(), nullable=False),
        sa.Column("tools_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_steps_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_steps")),
        sa.UniqueConstraint("run_id", "sequence", name=op.f("uq_runtime_steps_run_id_sequence")),
    )
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_runtime_steps_attempt_id"), ["attempt_id"], unique=False
        )
        batch_op.create_index(
            "ix_runtime_steps_run_id_idempotency_key", ["run_id", "idempotency_key"], unique=False
        )

    op.create_table(
        "runtime_turns",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.String(length=40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("start_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("end_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"],
            ["runtime_attempts.id"],
            name=op.f("fk_runtime_turns_attempt_id_runtime_attempts"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_turns_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_turns")),
        sa.UniqueConstraint("run_id", "number", name=op.f("uq_runtime_turns_run_id_number")),
    )
    with op.batch_alter_table("runtime_turns", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_runtime_turns_attempt_id"), ["attempt_id"], unique=False
        )

    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("last_step_sequence", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("turn_count", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.drop_column("turn_count")
        batch_op.drop_column("last_step_sequence")

    with op.batch_alter_table("runtime_turns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runtime_turns_attempt_id"))

    op.drop_table("runtime_turns")
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_steps_run_id_idempotency_key")
        batch_op.drop_index(batch_op.f("ix_runtime_steps_attempt_id"))

    op.drop_table("runtime_steps")
    with op.batch_alter_table("runtime_inputs", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_inputs_run_id_status")

    op.drop_table("runtime_inputs")
    with op.batch_alter_table("runtime_checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runtime_checkpoints_state_ref"))
        batch_op.drop_index(batch_op.f("ix_runtime_checkpoints_run_id"))

    op.drop_table("runtime_checkpoints")
    with op.batch_alter_table("runtime_artifacts", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_artifacts_thread_id")
        batch_op.drop_index("ix_runtime_artifacts_run_id")
        batch_op.drop_index(batch_op.f("ix_runtime_artifacts_blob_digest"))

    op.drop_table("runtime_artifacts")
    op.drop_table("runtime_blob_chunks")
    with op.batch_alter_table("runtime_step_usages", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_step_usages_schema_digest_time")
        batch_op.drop_index("ix_runtime_step_usages_kind_name_version")
        batch_op.drop_index("ix_runtime_step_usages_digest_time")

    op.drop_table("runtime_step_usages")
    op.drop_table("runtime_blobs")
