"""The SQLite group-commit writer: jobs queued together share one transaction, each in its
own savepoint, ORM jobs and plain-SQL jobs alike; a refused job changes nothing, the others
commit; nothing is answered before the commit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from agentrt_base import db_engines
from agentrt_base.db_engines import WriterLock
from agentrt_base.group_commit import GroupCommitWriter, run_raw_batch_sqlite
from agentrt_base.raw import RawTx, Statement

_INSERT = Statement("INSERT INTO items (name) VALUES (:name)")


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    sqlite_engine = db_engines.sqlite_engine(
        sa.make_url(f"sqlite:///{tmp_path / 'group.db'}"), pool_size=2, immediate=True
    )
    with sqlite_engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE items (name TEXT PRIMARY KEY, n INTEGER DEFAULT 0)")
    yield sqlite_engine
    sqlite_engine.dispose()


def _names(sqlite_engine: sa.Engine) -> list[str]:
    with sqlite_engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT name FROM items ORDER BY name")]


def _orm(name: str) -> Any:
    def job(session: Session) -> str:
        session.execute(sa.text("INSERT INTO items (name) VALUES (:n)"), {"n": name})
        return name

    return job


def _raw(name: str) -> Any:
    def job(tx: RawTx) -> str:
        tx.execute(_INSERT, {"name": name})
        return name

    return job


def _write(writer: GroupCommitWriter, fn: Any, *, raw: bool = False) -> Any:
    async def submit() -> Any:
        return await writer.submit(fn, raw=raw)

    return asyncio.run(submit())


def _batched(writer: GroupCommitWriter, jobs: list[tuple[Any, bool]]) -> list[Any]:
    """Submit ``jobs`` while the writer is held up, so they are taken as one batch; return
    what each answered (a value, or the exception it raised)."""

    async def submit() -> list[Any]:
        entered, release = threading.Event(), threading.Event()

        def hold(session: Session) -> None:
            entered.set()
            release.wait(10)

        first = writer.submit(hold)
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        futures = [writer.submit(fn, raw=raw) for fn, raw in jobs]
        release.set()
        await first
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(submit())


def test_a_batch_mixes_orm_and_plain_sql_jobs_and_a_refused_one_changes_nothing(
    sqlite_engine: sa.Engine,
) -> None:
    writer = GroupCommitWriter(sqlite_engine)
    try:
        answers = _batched(
            writer,
            [
                (_orm("a"), False),
                (_raw("b"), True),
                (_raw("a"), True),  # duplicate key: refused
                (_orm("b"), False),  # duplicate key: refused
                (_orm("c"), False),
                (_raw("d"), True),
            ],
        )
        results = [
            "refused"
            if isinstance(a, sa.exc.IntegrityError)
            # the driver's own error for a plain-SQL job
            else type(a).__name__
            if isinstance(a, Exception)
            else a
            for a in answers
        ]
        assert results == ["a", "b", "IntegrityError", "refused", "c", "d"]
        assert _names(sqlite_engine) == ["a", "b", "c", "d"]
    finally:
        writer.close()


def test_a_lone_refused_job_rolls_back_and_the_writer_goes_on(sqlite_engine: sa.Engine) -> None:
    writer = GroupCommitWriter(sqlite_engine)
    try:
        assert _write(writer, _raw("x"), raw=True) == "x"

        def half_then_fail(session: Session) -> None:
            session.execute(sa.text("INSERT INTO items (name) VALUES ('half')"))
            raise ValueError("refused")

        with pytest.raises(ValueError):
            _write(writer, half_then_fail)
        assert _write(writer, _orm("y")) == "y"
        assert _names(sqlite_engine) == ["x", "y"]
    finally:
        writer.close()


class _Base(DeclarativeBase):
    pass


class _Item(_Base):
    __tablename__ = "items"
    name: Mapped[str] = mapped_column(primary_key=True)
    n: Mapped[int]


_BUMP = Statement("UPDATE items SET n = n + 1 WHERE name = :name")


def test_an_orm_job_sees_what_a_plain_sql_job_before_it_in_the_batch_wrote(
    sqlite_engine: sa.Engine,
) -> None:
    """Each ORM job has a Session of its own: had the batch shared one, the second job
    would get the object the first loaded from the identity map, without the raw update."""
    writer = GroupCommitWriter(sqlite_engine)
    try:
        _write(writer, _raw("a"), raw=True)

        def read_n(session: Session) -> int:
            item = session.get(_Item, "a")
            assert item is not None
            return item.n

        def bump(tx: RawTx) -> None:
            tx.execute(_BUMP, {"name": "a"})

        answers = _batched(writer, [(read_n, False), (bump, True), (read_n, False)])
        assert answers == [0, None, 1]
    finally:
        writer.close()


def test_a_waiter_that_gives_up_does_not_stop_the_writer(sqlite_engine: sa.Engine) -> None:
    """A job whose caller was cancelled while it was queued does not run; one cancelled while
    its batch ran is committed but not answered; the writer goes on either way."""
    writer = GroupCommitWriter(sqlite_engine)

    async def scenario() -> list[str]:
        entered, release = threading.Event(), threading.Event()

        def hold(session: Session) -> None:
            session.execute(sa.text("INSERT INTO items (name) VALUES ('held')"))
            entered.set()
            release.wait(10)

        held = writer.submit(hold)
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        held.cancel()  # while its batch runs
        queued = writer.submit(_raw("never"), raw=True)
        queued.cancel()  # before it runs
        release.set()
        return [
            await writer.submit(_orm("after")),
            await writer.submit(_raw("z"), raw=True),
        ]

    try:
        assert asyncio.run(scenario()) == ["after", "z"]
        assert _names(sqlite_engine) == ["after", "held", "z"]
    finally:
        writer.close()


def test_a_raw_batch_is_all_or_nothing_and_holds_the_writer_lock(
    sqlite_engine: sa.Engine, tmp_path: Path
) -> None:
    """The step writer process's batch (plain SQL straight on sqlite3, under the WriterLock):
    every job commits together, or, if one raises, none does and the error propagates;
    another holder of the lock waits for the whole batch."""
    lock = WriterLock(str(tmp_path / "group.db-agentrt-writer.lock"))
    other = WriterLock(lock.path)
    held_during_batch: list[bool] = []
    probe_threads: list[threading.Thread] = []

    def probe(tx: RawTx) -> str:
        taken = threading.Event()

        def try_take() -> None:
            with other:
                taken.set()

        thread = threading.Thread(target=try_take)
        thread.start()
        probe_threads.append(thread)
        held_during_batch.append(not taken.wait(0.2))
        tx.execute(_INSERT, {"name": "probe"})
        return "probe"

    raw = sqlite_engine.raw_connection()
    try:
        with lock:
            results = run_raw_batch_sqlite(
                sqlite_engine.dialect, raw.driver_connection, [_raw("a"), probe, _raw("b")]
            )
        assert results == ["a", "probe", "b"]
        with pytest.raises(sqlite3.IntegrityError), lock:
            run_raw_batch_sqlite(
                sqlite_engine.dialect, raw.driver_connection, [_raw("c"), _raw("a")]
            )
        assert not raw.driver_connection.in_transaction
    finally:
        raw.close()
    for thread in probe_threads:
        thread.join(5)
    assert _names(sqlite_engine) == ["a", "b", "probe"]
    assert held_during_batch == [True]
    lock.close()
    other.close()
