"""A failed statement's parameters (callers' content) never reach the log.

SQLAlchemy writes a failed statement's parameters into its exception's text, and the server
logs that text (a database failure as a warning, anything else with its traceback). The
engines are built with ``hide_parameters``; this checks what such a log record would hold,
on both engines, for a data error and an integrity error carrying a caller's content.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.db import Database

SECRET = "tell-no-one-7f3a"


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    yield from _probe(database_url)


@pytest.fixture
def postgres(postgres_session_url: str) -> Iterator[Database]:
    yield from _probe(postgres_session_url)


def _probe(url: str) -> Iterator[Database]:
    db = Database(url)
    with db.write_engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS logging_probe")
        conn.exec_driver_sql("CREATE TABLE logging_probe (id INTEGER PRIMARY KEY, body TEXT)")
        conn.exec_driver_sql("INSERT INTO logging_probe (id, body) VALUES (1, 'first')")
    try:
        yield db
    finally:
        with db.write_engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE logging_probe")
        db.dispose()


def _logged(caplog: pytest.LogCaptureFixture, exc: BaseException) -> str:
    """What the server's log would hold for ``exc``: its text and its traceback."""
    caplog.clear()
    logging.getLogger("agentrt.errors").error("unhandled error", exc_info=exc)
    logging.getLogger("agentrt.errors").warning("database failure: %s", exc)
    return caplog.text


def _insert(body: str, id_: int = 2) -> Callable[[Session], None]:
    def write(session: Session) -> None:
        session.execute(
            sa.text("INSERT INTO logging_probe (id, body) VALUES (:id, :body)"),
            {"id": id_, "body": body},
        )

    return write


def test_an_integrity_error_does_not_log_the_callers_content(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(sa.exc.IntegrityError) as info:
        database.write_sync(_insert(f"goal: {SECRET}", id_=1))
    text = _logged(caplog, info.value)
    assert "INSERT INTO logging_probe" in text  # the record still says what failed
    assert SECRET not in text


@pytest.mark.postgres
def test_a_postgresql_data_error_does_not_log_the_callers_content(
    postgres: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A NUL byte is a data error on PostgreSQL only (SQLite stores any text)."""
    with pytest.raises(sa.exc.DataError) as info:
        postgres.write_sync(_insert(f"a\x00{SECRET}"))
    text = _logged(caplog, info.value)
    assert "INSERT INTO logging_probe" in text
    assert SECRET not in text
