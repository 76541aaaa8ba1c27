"""Indexes for the runs list filtered by agent digest or by the tag followed (issue 30,
item 3).

As 0017 for status and agent: ListRuns answers newest first (by id), so each filter needs an
index in that order within it, or a page of 50 sorts every matching run.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runtime_runs_agent_digest_id", "runtime_runs", ["agent_digest", "id"])
    op.create_index(
        "ix_runtime_runs_agent_resolved_via_tag_id",
        "runtime_runs",
        ["agent_resolved_via_tag", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_runtime_runs_agent_resolved_via_tag_id", table_name="runtime_runs")
    op.drop_index("ix_runtime_runs_agent_digest_id", table_name="runtime_runs")
