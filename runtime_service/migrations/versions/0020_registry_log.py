"""The registry log: an RFC 6962 Merkle tree over every publish and tag move (issue 31).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The head row is created, and the registry's earlier history appended, by the server at
    # start (registry/transparency.py, open_log): the origin is a setting, not a migration's.
    op.create_table(
        "registry_log_head",
        sa.Column("singleton", sa.Integer(), nullable=False),
        sa.Column("origin", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("frontier", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_registry_log_head")),
    )
    op.create_table(
        "registry_log_entries",
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("subject_digest", sa.String(length=71), nullable=True),
        sa.Column("leaf", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("position", name=op.f("pk_registry_log_entries")),
    )
    op.create_index(
        op.f("ix_registry_log_entries_subject_digest"),
        "registry_log_entries",
        ["subject_digest"],
        unique=False,
    )
    op.create_table(
        "registry_log_nodes",
        sa.Column("level", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("level", "position", name=op.f("pk_registry_log_nodes")),
    )


def downgrade() -> None:
    op.drop_table("registry_log_nodes")
    op.drop_index(op.f("ix_registry_log_entries_subject_digest"), table_name="registry_log_entries")
    op.drop_table("registry_log_entries")
    op.drop_table("registry_log_head")
