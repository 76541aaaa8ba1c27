"""Trace context on the ledger (issue 29, item 2).

A run records the W3C ``traceparent`` it was created in and each attempt the one of its
``invoke_agent`` span, handed to its worker by AcquireRun; a step records its trace id, so
an auditor goes from the record to the trace. Rows that exist when this runs were not
traced: they keep "".

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("traceparent", sa.String(length=55), nullable=False, server_default="")
        )
    with op.batch_alter_table("runtime_attempts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("traceparent", sa.String(length=55), nullable=False, server_default="")
        )
    with op.batch_alter_table("runtime_steps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("trace_id", sa.String(length=32), nullable=False, server_default="")
        )


def downgrade() -> None:
    for table, column in (
        ("runtime_steps", "trace_id"),
        ("runtime_attempts", "traceparent"),
        ("runtime_runs", "traceparent"),
    ):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(column)
