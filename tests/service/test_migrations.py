"""Migrations apply on both engines from empty and yield exactly the models' schema."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from agentrt_base.db import Database
from runtime_service import migrate
from runtime_service.schema import metadata


def test_upgrade_from_empty_reaches_head_and_matches_models(empty_database_url: str) -> None:
    database = Database(empty_database_url)
    try:
        assert migrate.current_revision(database) is None
        installation = migrate.upgrade(database)
        assert installation.startswith("ins_")
        assert migrate.current_revision(database) == migrate.head_revision()
        with database.write_engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == [], f"migrations and models disagree: {diff}"
        # A second upgrade (a restart, another replica) changes nothing and keeps the id.
        assert migrate.upgrade(database) == installation
    finally:
        database.dispose()


def test_upgrade_applies_every_revision_in_order(empty_database_url: str) -> None:
    """Step through the history one revision at a time, as a long-lived install would."""
    database = Database(empty_database_url)
    try:
        script = migrate.ScriptDirectory.from_config(migrate._config())
        revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
        for revision in revisions:
            migrate.upgrade(database, revision)
            assert migrate.current_revision(database) == revision
    finally:
        database.dispose()
