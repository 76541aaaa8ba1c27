"""Indexes for the runs list filtered by status or by agent (issue 30, item 8).

ListRuns answers newest first (by id, a ULID); filtered by a status or an agent, the database
had no index giving that order within the filter, and sorted every matching run: 370-450 ms
for a page of 50 out of 100,000 runs on SQLite (bench/results/console.md). With these, the
page is read in index order and stops after 50.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runtime_runs_status_id", "runtime_runs", ["status", "id"])
    op.create_index("ix_runtime_runs_agent_id_id", "runtime_runs", ["agent_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_runtime_runs_agent_id_id", table_name="runtime_runs")
    op.drop_index("ix_runtime_runs_status_id", table_name="runtime_runs")
