"""Apply the Alembic migrations to a database (``agentrt db upgrade`` and server start)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from agentrt_base.db import Database
from agentrt_base.installation import ensure_installation

log = logging.getLogger("agentrt.migrate")

_SCRIPT_LOCATION = str(Path(__file__).parent / "migrations")

#: Arbitrary constant key of the PostgreSQL advisory lock that serialises migrations, so
#: replicas started together do not race each other through the same DDL.
_MIGRATION_LOCK_KEY = 0x61676E7472740001


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", _SCRIPT_LOCATION)
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(database: Database) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with database.write_engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(database: Database, revision: str = "head") -> str:
    """Migrate to ``revision`` in one transaction and return the installation id.

    On SQLite the transaction starts with ``BEGIN IMMEDIATE`` (see :mod:`agentrt_base.db`), on
    PostgreSQL it takes an advisory lock: either way two processes migrating at once take
    turns, and the second finds nothing left to do.
    """
    config = _config()
    with database.write_engine.begin() as conn:
        if not database.is_sqlite:
            # A migration may wait for another replica's and rewrite large tables: the
            # server's per-statement deadlines are for calls, not for this.
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            conn.exec_driver_sql("SET LOCAL lock_timeout = 0")
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})")
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return database.write_sync(ensure_installation)
