"""Migrations apply on both engines from empty and yield exactly the models' schema."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from agentrt_base.db import Database
from runtime_service import migrate
from runtime_service.schema import metadata
from runtime_service.store import steps as step_store


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


def test_the_step_paths_look_ups_are_served_by_their_partial_indexes(
    empty_database_url: str,
) -> None:
    """BeginStep looks a repeated idempotency key up in a partial index (keyed steps only),
    and a model call's previous model call in another (model calls only): its statement must
    repeat each index's condition for SQLite to use it."""
    database = Database(empty_database_url)
    try:
        migrate.upgrade(database)
        dialect = database.write_engine.dialect.name
        statement = step_store._BEGIN[True, True]  # keyed, a model call
        params = {"attempt_id": "a", "turn_id": "t", "key": "k", "input_ref": "", "retry_of": ""}
        raw = database.write_engine.raw_connection()
        try:
            cursor = raw.cursor()
            if dialect == "sqlite":
                cursor.execute(
                    "EXPLAIN QUERY PLAN " + statement.render(dialect), statement.positional(params)
                )
            else:
                cursor.execute("SET enable_seqscan = off")
                cursor.execute("EXPLAIN " + statement.render(dialect), params)
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
        finally:
            raw.close()
        assert "ix_runtime_steps_run_id_idempotency_key" in plan, plan
        assert "ix_runtime_steps_attempt_id_model_calls" in plan, plan
    finally:
        database.dispose()


def test_component_lookup_by_version_is_served_by_the_partial_unique_index(
    empty_database_url: str,
) -> None:
    """name@version is unique among named components only (anonymous inline prompts share
    the empty name and version); the look-up by version must still use that index, which
    on SQLite means its condition is spelled exactly as the query renders `~anonymous`."""
    import sqlalchemy as sa

    from registry.store import ComponentRow

    database = Database(empty_database_url)
    try:
        migrate.upgrade(database)
        c = ComponentRow
        query = sa.select(c.digest).where(c.name == "tool", c.version == "1", ~c.anonymous)
        with database.write_engine.connect() as conn:
            if database.is_sqlite:
                compiled = query.compile(conn)
                plan = conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + str(compiled), tuple(compiled.params.values())
                ).all()
            else:
                conn.exec_driver_sql("SET enable_seqscan = off")
                compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
                plan = conn.exec_driver_sql("EXPLAIN " + str(compiled)).all()
        text = " ".join(str(row[-1]) for row in plan)
        assert "ix_registry_components_name_version" in text, text
    finally:
        database.dispose()
