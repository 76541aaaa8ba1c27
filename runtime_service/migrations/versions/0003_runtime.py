"""The runtime ledger: threads, messages, runs, attempts and the hash-chained event log.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("thread_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("thread_cursor", sa.BigInteger(), nullable=False),
        sa.Column("event_type", sa.String(length=40), nullable=False),
        sa.Column("event_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("attributes_json", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=71), nullable=False),
        sa.Column("hash", sa.String(length=71), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_events")),
        sa.UniqueConstraint(
            "thread_id",
            "run_id",
            "sequence",
            name=op.f("uq_runtime_events_thread_id_run_id_sequence"),
        ),
        sa.UniqueConstraint(
            "thread_id", "thread_cursor", name=op.f("uq_runtime_events_thread_id_thread_cursor")
        ),
    )
    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_events_run_id_sequence", ["run_id", "sequence"], unique=False
        )

    op.create_table(
        "runtime_threads",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.Column("concurrency_policy", sa.String(length=16), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("last_event_sequence", sa.BigInteger(), nullable=False),
        sa.Column("last_event_hash", sa.String(length=71), nullable=False),
        sa.Column("event_cursor", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_threads")),
        sa.UniqueConstraint("request_id", name=op.f("uq_runtime_threads_request_id")),
    )
    op.create_table(
        "runtime_messages",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("thread_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["runtime_threads.id"],
            name=op.f("fk_runtime_messages_thread_id_runtime_threads"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_messages")),
    )
    with op.batch_alter_table("runtime_messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_messages_thread_id_seq", ["thread_id", "seq"], unique=False
        )

    op.create_table(
        "runtime_runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("thread_id", sa.String(length=40), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("agent_requested_ref", sa.String(length=200), nullable=False),
        sa.Column("agent_digest", sa.String(length=71), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("agent_version_label", sa.String(length=128), nullable=False),
        sa.Column("agent_resolved_via_tag", sa.String(length=128), nullable=False),
        sa.Column("agent_tag_event_sequence", sa.BigInteger(), nullable=False),
        sa.Column("agent_resolve_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("goal_json", sa.Text(), nullable=False),
        sa.Column("amendments_json", sa.Text(), nullable=False),
        sa.Column("input_revision", sa.BigInteger(), nullable=False),
        sa.Column("max_steps", sa.BigInteger(), nullable=False),
        sa.Column("max_model_tokens", sa.BigInteger(), nullable=False),
        sa.Column("max_cost_usd", sa.Float(), nullable=False),
        sa.Column("deadline_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("parent_run_id", sa.String(length=40), nullable=False),
        sa.Column("derived_from_run_id", sa.String(length=40), nullable=False),
        sa.Column("permission_ceiling", sa.String(length=32), nullable=False),
        sa.Column("concurrency_policy", sa.String(length=16), nullable=False),
        sa.Column("labels_json", sa.Text(), nullable=False),
        sa.Column("runtime_version", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("terminal_reason", sa.String(length=40), nullable=False),
        sa.Column("terminal_message", sa.Text(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("pause_requested", sa.Boolean(), nullable=False),
        sa.Column("stop_reason", sa.String(length=40), nullable=False),
        sa.Column("stop_deadline_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("blocked_by_run_id", sa.String(length=40), nullable=False),
        sa.Column("next_attempt_reason", sa.String(length=32), nullable=False),
        sa.Column("latest_checkpoint_id", sa.String(length=40), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("step_count", sa.BigInteger(), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("current_attempt_id", sa.String(length=40), nullable=False),
        sa.Column("lease_epoch", sa.BigInteger(), nullable=False),
        sa.Column("result_summary", sa.Text(), nullable=False),
        sa.Column("output_ref", sa.String(length=71), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("start_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("end_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("update_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_event_sequence", sa.BigInteger(), nullable=False),
        sa.Column("last_event_hash", sa.String(length=71), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["runtime_threads.id"],
            name=op.f("fk_runtime_runs_thread_id_runtime_threads"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_runs")),
        sa.UniqueConstraint("request_id", name=op.f("uq_runtime_runs_request_id")),
    )
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_runtime_runs_agent_digest"), ["agent_digest"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_runtime_runs_agent_id"), ["agent_id"], unique=False)
        batch_op.create_index("ix_runtime_runs_deadline_time", ["deadline_time"], unique=False)
        batch_op.create_index(
            "ix_runtime_runs_queue",
            ["status", "blocked_by_run_id", "priority", "create_time"],
            unique=False,
        )
        batch_op.create_index(
            "ix_runtime_runs_thread_id_create_time", ["thread_id", "create_time"], unique=False
        )

    op.create_table(
        "runtime_attempts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("lease_epoch", sa.BigInteger(), nullable=False),
        sa.Column("resume_from_checkpoint_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("start_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("end_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("lease_expire_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("lease_ttl_ms", sa.BigInteger(), nullable=False),
        sa.Column("error_class", sa.String(length=32), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("retryable", sa.Boolean(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("result_summary", sa.Text(), nullable=False),
        sa.Column("output_ref", sa.String(length=71), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runtime_runs.id"], name=op.f("fk_runtime_attempts_run_id_runtime_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_attempts")),
        sa.UniqueConstraint("run_id", "number", name=op.f("uq_runtime_attempts_run_id_number")),
    )
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_attempts_status_lease_expire_time",
            ["status", "lease_expire_time"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_attempts_status_lease_expire_time")

    op.drop_table("runtime_attempts")
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_runs_thread_id_create_time")
        batch_op.drop_index("ix_runtime_runs_queue")
        batch_op.drop_index("ix_runtime_runs_deadline_time")
        batch_op.drop_index(batch_op.f("ix_runtime_runs_agent_id"))
        batch_op.drop_index(batch_op.f("ix_runtime_runs_agent_digest"))

    op.drop_table("runtime_runs")
    with op.batch_alter_table("runtime_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_messages_thread_id_seq")

    op.drop_table("runtime_messages")
    op.drop_table("runtime_threads")
    with op.batch_alter_table("runtime_events", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_events_run_id_sequence")

    op.drop_table("runtime_events")
