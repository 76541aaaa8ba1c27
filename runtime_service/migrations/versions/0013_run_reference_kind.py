"""A run keeps the kind of its agent reference (issue 17, item 11).

The registry's ``Resolution`` records how a reference resolved: its kind (a tag followed, a
version label pinned, a digest), the tag and the tag event sequence. A run kept the tag and
the sequence but not the kind, so ``Run.agent`` could not say whether ``coding_agent@x`` was
pinned by label or by digest without re-parsing the reference. The column is added, and filled
for existing runs from what they recorded, in the order the registry reads a reference
(``agentrt_core.refs``): a followed tag is TAG; a reference that is a digest, or names one after
``@``, is DIGEST; anything else that resolved is a version LABEL.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("agent_reference_kind", sa.String(16), nullable=False, server_default="")
        )
    op.execute(
        "UPDATE runtime_runs SET agent_reference_kind = CASE"
        " WHEN agent_resolved_via_tag <> '' THEN 'TAG'"
        " WHEN agent_requested_ref LIKE 'sha256:%' OR agent_requested_ref LIKE '%@sha256:%'"
        " THEN 'DIGEST'"
        " ELSE 'LABEL' END"
    )


def downgrade() -> None:
    with op.batch_alter_table("runtime_runs", schema=None) as batch_op:
        batch_op.drop_column("agent_reference_kind")
