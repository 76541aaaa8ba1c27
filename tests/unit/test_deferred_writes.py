"""How a PostgreSQL step batch's deferred writes are sent (``agentrt_base.raw``): one
``executemany`` per statement, in an order every job agrees with, else in plain job order."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects import postgresql

from agentrt_base.raw import DeferredTx, RawTx, Statement, Writes, send_deferred

INSERT_STEP = Statement("INSERT INTO s (id) VALUES (:id)")
END_STEP = Statement("UPDATE s SET status = :status WHERE id = :id")
EVENT = Statement("INSERT INTO e (id) VALUES (:id)")
USAGE = Statement("INSERT INTO u (id) VALUES (:id)")
ADVANCE = Statement("UPDATE r SET n = :n WHERE id = :id")
NAMES = {INSERT_STEP: "step+", END_STEP: "step=", EVENT: "event", USAGE: "usage", ADVANCE: "run"}


class Recorder(RawTx):
    def __init__(self) -> None:
        super().__init__(postgresql.dialect(), None)
        self.sent: list[tuple[str, list[Any]]] = []

    def execute(self, statement: Statement, params: Any) -> Any:
        self.sent.append((NAMES[statement], [params["id"]]))

    def execute_many(self, statement: Statement, rows: Any) -> None:
        self.sent.append((NAMES[statement], [r["id"] for r in rows]))


def begin(batch: list[Writes], job: str) -> None:
    tx = DeferredTx(postgresql.dialect(), batch)
    tx.execute(INSERT_STEP, {"id": job})
    tx.execute(EVENT, {"id": job})
    tx.execute_many(USAGE, [{"id": job + ".1"}, {"id": job + ".2"}])
    tx.execute(ADVANCE, {"id": job, "n": 1})


def end(batch: list[Writes], job: str) -> None:
    tx = DeferredTx(postgresql.dialect(), batch)
    tx.execute(END_STEP, {"id": job, "status": "SUCCEEDED"})
    tx.execute(EVENT, {"id": job})
    tx.execute_many(USAGE, [{"id": job + ".1"}])


def test_each_statement_goes_once_with_every_jobs_rows_in_an_order_each_job_keeps() -> None:
    batch: list[Writes] = []
    end(batch, "c")
    begin(batch, "a")
    end(batch, "d")
    begin(batch, "b")
    tx = Recorder()
    send_deferred(tx, batch)
    assert tx.sent == [
        ("step=", ["c", "d"]),
        ("step+", ["a", "b"]),
        ("event", ["c", "a", "d", "b"]),
        ("usage", ["c.1", "a.1", "a.2", "d.1", "b.1", "b.2"]),
        ("run", ["a", "b"]),
    ]
    # Within every job, its statements still go in the order it ran them.
    position = {name: i for i, (name, _) in enumerate(tx.sent)}
    assert position["step+"] < position["event"] < position["usage"] < position["run"]
    assert position["step="] < position["event"]


def test_jobs_that_disagree_on_the_order_are_sent_one_after_the_other() -> None:
    batch: list[Writes] = []
    first = DeferredTx(postgresql.dialect(), batch)
    first.execute(EVENT, {"id": "x"})
    first.execute(USAGE, {"id": "x"})
    second = DeferredTx(postgresql.dialect(), batch)
    second.execute(USAGE, {"id": "y"})
    second.execute(EVENT, {"id": "y"})
    tx = Recorder()
    send_deferred(tx, batch)
    assert tx.sent == [("event", ["x"]), ("usage", ["x"]), ("usage", ["y"]), ("event", ["y"])]


def test_a_deferred_transaction_refuses_to_read() -> None:
    tx = DeferredTx(postgresql.dialect(), [])
    with pytest.raises(RuntimeError):
        tx.one(EVENT, {"id": "x"})
