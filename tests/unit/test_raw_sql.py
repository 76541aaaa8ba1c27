"""The plain-SQL helpers store what SQLAlchemy stores and render each driver's paramstyle."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy.dialects import sqlite

from agentrt_base.db import UTCDateTime
from agentrt_base.raw import Statement, _sqlite_read_time, _sqlite_time
from agentrt_core.event_chain import format_time

_TIMES = [
    dt.datetime(2026, 11, 29, 13, 12, 18, 183701, tzinfo=dt.UTC),
    dt.datetime(2026, 11, 29, 13, 12, 18, tzinfo=dt.UTC),  # no microseconds
    dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2026, 3, 1, 1, 30, 5, 7, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    dt.datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
]


@pytest.mark.parametrize("value", _TIMES)
def test_sqlite_times_are_stored_and_read_as_sqlalchemy_does(value: dt.datetime) -> None:
    dialect = sqlite.dialect()
    kind = UTCDateTime().dialect_impl(dialect)
    to_db = kind.bind_processor(dialect)
    from_db = kind.result_processor(dialect, None)
    assert to_db is not None and from_db is not None
    stored = to_db(value)
    assert _sqlite_time(value) == stored
    assert _sqlite_read_time(stored) == from_db(stored) == value


def test_naive_times_are_refused_as_by_the_orm() -> None:
    with pytest.raises(ValueError, match="naive"):
        _sqlite_time(dt.datetime(2026, 1, 1))  # naive on purpose


@pytest.mark.parametrize("value", _TIMES)
def test_event_times_keep_their_hashed_spelling(value: dt.datetime) -> None:
    # The event hash covers this string: it must not change for the same instant.
    assert format_time(value) == value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_statements_render_each_drivers_paramstyle() -> None:
    statement = Statement("SELECT a FROM t WHERE b = :b AND c LIKE 'x%' AND d = :d_2 OR :b = ''")
    assert (
        statement.render("sqlite")
        == "SELECT a FROM t WHERE b = ? AND c LIKE 'x%' AND d = ? OR ? = ''"
    )
    assert list(statement.positional({"d_2": 2, "b": 1})) == [1, 2, 1]
    # One name and none: still a sequence of values, not the bare value.
    assert list(Statement("SELECT 1 WHERE x = :x").positional({"x": 5})) == [5]
    assert list(Statement("SELECT 1").positional({})) == []
    assert (
        statement.render("postgresql")
        == "SELECT a FROM t WHERE b = %(b)s AND c LIKE 'x%%' AND d = %(d_2)s OR %(b)s = ''"
    )
    locked = Statement("SELECT 1 WHERE x = :x", postgresql="SELECT 1 WHERE x = :x FOR UPDATE")
    assert locked.render("sqlite") == "SELECT 1 WHERE x = ?"
    assert locked.render("postgresql") == "SELECT 1 WHERE x = %(x)s FOR UPDATE"
