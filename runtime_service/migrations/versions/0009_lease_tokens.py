"""Secret lease tokens: each attempt keeps the hash of the token AcquireRun handed out.

attempt_id and lease_epoch are public (ListAttempts, attempt.started), so a fence of those
two alone let anyone who could read a run write as its worker. An attempt now also stores the
SHA-256 of a random token only its worker was given; every fenced write must present it.
Attempts started before this revision keep an empty hash, which matches only an empty token
(their workers never had one); they end when their leases do.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("lease_token_hash", sa.String(71), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.drop_column("lease_token_hash")
