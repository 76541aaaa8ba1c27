"""The registry records who published and who moved a tag as the authenticated principal,
and the verified claims of a publish made with an OIDC token.

Until now the publisher (Provenance.publisher) and a tag move's actor were names the caller
gave. The principal the server authenticated is now stored beside them: the names callers give
stay as display labels, in the columns they were always in, so nothing recorded is
reinterpreted. Rows written before this revision keep an empty principal (nobody was recorded)
and no verified provenance.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_PUBLISHED = ("registry_components", "registry_agent_versions")


def upgrade() -> None:
    for table in _PUBLISHED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("principal", sa.String(200), nullable=False, server_default="")
            )
            batch_op.add_column(sa.Column("verified_provenance_json", sa.Text(), nullable=True))
    with op.batch_alter_table("registry_tags", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("updated_by_principal", sa.String(200), nullable=False, server_default="")
        )
    with op.batch_alter_table("registry_tag_events", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("principal", sa.String(200), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("registry_tag_events", schema=None) as batch_op:
        batch_op.drop_column("principal")
    with op.batch_alter_table("registry_tags", schema=None) as batch_op:
        batch_op.drop_column("updated_by_principal")
    for table in reversed(_PUBLISHED):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("verified_provenance_json")
            batch_op.drop_column("principal")
