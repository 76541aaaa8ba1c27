"""Namespaces: threads (and their runs) and blobs belong to one, for access control.

A thread's namespace is set at creation and never changes; its runs carry a copy so a run's
namespace (every permission check on a run, ListRuns, AcquireRun's filter) is one row away.
A blob's bytes are stored once by digest, but a blob is found only in the namespaces it was
uploaded to (``runtime_blob_namespaces``), each of which it counts against for the blob
quota. Everything stored before this revision is in ``default``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("runtime_threads", "runtime_runs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("namespace", sa.String(63), nullable=False, server_default="default")
            )
            batch_op.create_index(f"ix_{table}_namespace_id", ["namespace", "id"], unique=False)
    op.create_table(
        "runtime_blob_namespaces",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["digest"], ["runtime_blobs.digest"]),
        sa.PrimaryKeyConstraint("namespace", "digest"),
    )
    op.execute(
        "INSERT INTO runtime_blob_namespaces (namespace, digest, size, create_time)"
        " SELECT 'default', digest, size, create_time FROM runtime_blobs"
    )


def downgrade() -> None:
    op.drop_table("runtime_blob_namespaces")
    for table in ("runtime_runs", "runtime_threads"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(f"ix_{table}_namespace_id")
            batch_op.drop_column("namespace")
