"""The registry: components, agent versions with their resolved closures, tags and tag history.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import agentrt_base.db

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_agents",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("create_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_tag_sequence", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_registry_agents")),
    )
    op.create_table(
        "registry_components",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("anonymous", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("schema_digest", sa.String(length=71), nullable=True),
        sa.Column("publish_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("provenance_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_registry_components")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_registry_components_name_version")),
    )
    with op.batch_alter_table("registry_components", schema=None) as batch_op:
        batch_op.create_index("ix_registry_components_kind_name", ["kind", "name"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_registry_components_schema_digest"), ["schema_digest"], unique=False
        )

    op.create_table(
        "registry_agent_versions",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("version_label", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("definition_json", sa.Text(), nullable=False),
        sa.Column("closure_json", sa.Text(), nullable=False),
        sa.Column("publish_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("provenance_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["registry_agents.agent_id"],
            name=op.f("fk_registry_agent_versions_agent_id_registry_agents"),
        ),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_registry_agent_versions")),
        sa.UniqueConstraint(
            "agent_id",
            "version_label",
            name=op.f("uq_registry_agent_versions_agent_id_version_label"),
        ),
    )
    with op.batch_alter_table("registry_agent_versions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_registry_agent_versions_agent_id_publish_time",
            ["agent_id", "publish_time"],
            unique=False,
        )

    op.create_table(
        "registry_tag_events",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("from_digest", sa.String(length=71), nullable=False),
        sa.Column("to_digest", sa.String(length=71), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("provenance_json", sa.Text(), nullable=False),
        sa.Column("event_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["registry_agents.agent_id"],
            name=op.f("fk_registry_tag_events_agent_id_registry_agents"),
        ),
        sa.PrimaryKeyConstraint("agent_id", "sequence", name=op.f("pk_registry_tag_events")),
    )
    with op.batch_alter_table("registry_tag_events", schema=None) as batch_op:
        batch_op.create_index("ix_registry_tag_events_to_digest", ["to_digest"], unique=False)

    op.create_table(
        "registry_closure_entries",
        sa.Column("agent_digest", sa.String(length=71), nullable=False),
        sa.Column("slot", sa.String(length=80), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("component_digest", sa.String(length=71), nullable=False),
        sa.Column("schema_digest", sa.String(length=71), nullable=True),
        sa.Column("requested_ref", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_digest"],
            ["registry_agent_versions.digest"],
            name=op.f("fk_registry_closure_entries_agent_digest_registry_agent_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["component_digest"],
            ["registry_components.digest"],
            name=op.f("fk_registry_closure_entries_component_digest_registry_components"),
        ),
        sa.PrimaryKeyConstraint("agent_digest", "slot", name=op.f("pk_registry_closure_entries")),
    )
    with op.batch_alter_table("registry_closure_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_registry_closure_entries_component_digest"),
            ["component_digest"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_registry_closure_entries_schema_digest"), ["schema_digest"], unique=False
        )

    op.create_table(
        "registry_tags",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("update_time", agentrt_base.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=200), nullable=False),
        sa.Column("event_sequence", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["registry_agents.agent_id"],
            name=op.f("fk_registry_tags_agent_id_registry_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["digest"],
            ["registry_agent_versions.digest"],
            name=op.f("fk_registry_tags_digest_registry_agent_versions"),
        ),
        sa.PrimaryKeyConstraint("agent_id", "name", name=op.f("pk_registry_tags")),
    )
    with op.batch_alter_table("registry_tags", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_registry_tags_digest"), ["digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("registry_tags", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_registry_tags_digest"))

    op.drop_table("registry_tags")
    with op.batch_alter_table("registry_closure_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_registry_closure_entries_schema_digest"))
        batch_op.drop_index(batch_op.f("ix_registry_closure_entries_component_digest"))

    op.drop_table("registry_closure_entries")
    with op.batch_alter_table("registry_tag_events", schema=None) as batch_op:
        batch_op.drop_index("ix_registry_tag_events_to_digest")

    op.drop_table("registry_tag_events")
    with op.batch_alter_table("registry_agent_versions", schema=None) as batch_op:
        batch_op.drop_index("ix_registry_agent_versions_agent_id_publish_time")

    op.drop_table("registry_agent_versions")
    with op.batch_alter_table("registry_components", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_registry_components_schema_digest"))
        batch_op.drop_index("ix_registry_components_kind_name")

    op.drop_table("registry_components")
    op.drop_table("registry_agents")
