"""Messages keep their request id (hashed with the thread, as runs do), so AppendMessage is
idempotent by request_id as the contract says.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: existing messages (and messages appended without a request id) have none,
    # and a unique constraint admits any number of NULLs on both engines.
    with op.batch_alter_table("runtime_messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_id", sa.String(length=128), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_runtime_messages_request_id"), ["request_id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("runtime_messages", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_runtime_messages_request_id"), type_="unique")
        batch_op.drop_column("request_id")
