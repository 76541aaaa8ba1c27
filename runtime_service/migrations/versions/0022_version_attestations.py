"""Attestations attached to agent versions (issue 31, item 4).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_attestations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("agent_digest", sa.String(length=71), nullable=False),
        sa.Column("predicate_type", sa.String(length=500), nullable=False),
        sa.Column("principal", sa.String(length=200), nullable=False),
        sa.Column("key_id", sa.String(length=250), nullable=False),
        sa.Column("verified_json", sa.Text(), nullable=True),
        sa.Column("envelope_digest", sa.String(length=71), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("attach_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("log_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_attestations")),
        sa.UniqueConstraint(
            "agent_digest",
            "envelope_digest",
            name=op.f("uq_registry_attestations_agent_digest_envelope_digest"),
        ),
    )
    op.create_index(
        op.f("ix_registry_attestations_agent_digest"),
        "registry_attestations",
        ["agent_digest"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_registry_attestations_agent_digest"), table_name="registry_attestations")
    op.drop_table("registry_attestations")
