"""Migration 0013 fills the reference kind of the runs recorded before it (both engines)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from agentrt_base.db import Database
from runtime_service import migrate

DIGEST = "sha256:" + "ab" * 32


def _row(table: sa.Table, **given: Any) -> dict[str, Any]:
    """``given``, and a plain value for every other column that needs one."""
    now = dt.datetime(2026, 1, 2, 3, 4, 5)
    row = dict(given)
    for column in table.columns:
        if column.name in row or column.nullable or column.server_default is not None:
            continue
        python = column.type.python_type
        row[column.name] = {str: "", int: 0, float: 0.0, bool: False, dt.datetime: now}[python]
    return row


def test_existing_runs_get_the_kind_their_reference_was_read_as(
    empty_database_url: str,
) -> None:
    database = Database(empty_database_url)
    try:
        migrate.upgrade(database, "0012")
        runs = {
            "run_tag": ("coding_agent:prod", "prod"),
            "run_label": ("coding_agent@agent_v7", ""),
            "run_name_digest": (f"coding_agent@{DIGEST}", ""),
            "run_digest": (DIGEST, ""),
        }
        with database.write_engine.begin() as conn:
            meta = sa.MetaData()
            threads = sa.Table("runtime_threads", meta, autoload_with=conn)
            table = sa.Table("runtime_runs", meta, autoload_with=conn)
            conn.execute(sa.insert(threads), [_row(threads, id="thr_1")])
            conn.execute(
                sa.insert(table),
                [
                    _row(
                        table,
                        id=run_id,
                        thread_id="thr_1",
                        agent_requested_ref=ref,
                        agent_resolved_via_tag=tag,
                        agent_digest=DIGEST,
                    )
                    for run_id, (ref, tag) in runs.items()
                ],
            )
        migrate.upgrade(database)
        with database.write_engine.connect() as conn:
            kinds = dict(
                conn.execute(sa.text("SELECT id, agent_reference_kind FROM runtime_runs")).all()
            )
        assert kinds == {
            "run_tag": "TAG",
            "run_label": "LABEL",
            "run_name_digest": "DIGEST",
            "run_digest": "DIGEST",
        }
    finally:
        database.dispose()
