"""The recorded actor is the authenticated principal (issue 16, item 3).

Who created a run, which principal acquired each attempt (its worker's identity), who
resolved an approval and who sent an input were until now only the names callers gave, which
anyone could forge. Each now also stores the authenticated principal of the call
(``agentrt_base.auth.caller_name``: "anonymous" when the server authenticates nobody) beside
the caller's label, which stays as a display label. Rows written before this revision keep an
empty principal: nobody was authenticated when they were recorded, and the ledger does not
pretend otherwise. (Amendments keep theirs in the run's amendments JSON; no column.)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

#: (table, column) pairs this revision adds, each a String(200) defaulting to "".
_COLUMNS = (
    ("runtime_runs", "creator_principal"),
    ("runtime_attempts", "worker_principal"),
    ("runtime_steps", "approver_principal"),
    ("runtime_inputs", "sender_principal"),
)


def upgrade() -> None:
    for table, column in _COLUMNS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column(column, sa.String(200), nullable=False, server_default="")
            )


def downgrade() -> None:
    for table, column in reversed(_COLUMNS):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(column)
