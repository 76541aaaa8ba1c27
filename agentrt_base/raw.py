"""Hand-written SQL on the driver's own connection, for the few statements of the hot path.

SQLAlchemy's execution machinery costs far more CPU than the driver call beneath it
(``shared/PERFORMANCE.md``: a single-row insert is 42 µs raw, 99 µs Core, 296 µs ORM). BeginStep
and EndStep run half a dozen statements each inside the one SQLite writer thread, so there
that difference *is* the throughput. Those statements are written here as plain SQL and run on
the DBAPI connection (``sqlite3`` or ``psycopg``) inside the transaction the writer opened;
everything else goes through SQLAlchemy.

Values are passed in the form SQLAlchemy would store them: timestamps go through the
:class:`~agentrt_base.db.UTCDateTime` processors of the dialect, so a row written here is
byte-for-byte what the ORM would have written and reads back the same through either path.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect

from agentrt_base.db import UTCDateTime

_NAMED = re.compile(r"(?<![:\w]):(\w+)")


class Statement:
    """One SQL text written with ``:name`` parameters, rendered once per driver paramstyle.

    ``psycopg`` gets ``%(name)s``. ``sqlite3`` gets positional ``?`` and the values in
    order: it binds a named parameter by building a string of its name and looking it up in
    the mapping, which for a step's 43 columns cost twice the insert itself. Text that
    differs between the engines beyond that (``FOR UPDATE``) is given per dialect.
    """

    def __init__(self, sql: str, *, postgresql: str | None = None) -> None:
        self._sql = {"sqlite": sql, "postgresql": postgresql if postgresql is not None else sql}
        self._rendered: dict[str, str] = {}
        #: SQLite: the parameter names in the order of the ``?`` that replaced them.
        self.names: tuple[str, ...] = tuple(_NAMED.findall(sql))
        # itemgetter picks them in C; with one name it answers the value, not a 1-tuple.
        if len(self.names) > 1:
            self._pick: Callable[[Mapping[str, Any]], Sequence[Any]] = operator.itemgetter(
                *self.names
            )
        else:
            self._pick = lambda params: [params[name] for name in self.names]

    def render(self, dialect_name: str) -> str:
        text = self._rendered.get(dialect_name)
        if text is None:
            text = self._sql[dialect_name]
            if dialect_name == "postgresql":
                text = _NAMED.sub(r"%(\1)s", text.replace("%", "%%"))
            else:
                text = _NAMED.sub("?", text)
            self._rendered[dialect_name] = text
        return text

    def positional(self, params: Mapping[str, Any]) -> Sequence[Any]:
        """The values of ``params`` in the order of the SQLite text's ``?``."""
        return self._pick(params)


class RawTx:
    """The driver connection of one open write transaction, and what to wake after commit.

    Built by :class:`~agentrt_base.db.Database` for a ``write_raw`` job; the job must not
    commit, roll back or keep the connection.
    """

    #: Whether reads through it return rows (not so for a :class:`DeferredTx`).
    can_read = True

    def __init__(self, dialect: Dialect, connection: Any) -> None:
        self.dialect_name = dialect.name
        self._sqlite = dialect.name == "sqlite"
        self._conn = connection
        self._to_db, self._from_db = _time_processors(dialect)
        self._last_time: dt.datetime | None = None
        self._last_stored: Any = None
        #: Keys to wake once the transaction commits (see ``runtime_service.notify``).
        self.wake: list[str] = []

    def execute(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """Run one statement; returns the driver's cursor."""
        if self._sqlite:
            return self._conn.execute(statement.render("sqlite"), statement.positional(params))
        return self._conn.execute(statement.render(self.dialect_name), params)

    def one(self, statement: Statement, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """The first row of a query (a tuple in select-list order), or None."""
        row: Sequence[Any] | None = self.execute(statement, params).fetchone()
        return row

    def execute_many(self, statement: Statement, rows: Iterable[Mapping[str, Any]]) -> None:
        sql = statement.render(self.dialect_name)
        if self._sqlite:
            self._conn.executemany(sql, [statement.positional(row) for row in rows])
        else:
            with self._conn.cursor() as cursor:
                cursor.executemany(sql, list(rows))

    def pipeline(self) -> contextlib.AbstractContextManager[Any]:
        """Send the statements of the block without waiting for each answer (psycopg's pipeline
        mode: one round trip, synchronised when a result is fetched and at the end); a no-op on
        SQLite, which has no round trips."""
        # psycopg's own context manager, or a shared no-op: a generator-based one cost 0.7 us
        # a block (timeit; a shared nullcontext 0.1), and the step path opens 4.5 a pair.
        if self.dialect_name != "postgresql":
            return _NO_PIPELINE
        pipeline: contextlib.AbstractContextManager[Any] = self._conn.pipeline()
        return pipeline

    def time(self, value: dt.datetime | None) -> Any:
        """A timestamp as this dialect stores it (a step stores one instant several times:
        the last conversion is kept)."""
        if value is not self._last_time:
            self._last_time, self._last_stored = value, self._to_db(value)
        return self._last_stored

    def read_time(self, value: Any) -> dt.datetime | None:
        """A stored timestamp as the aware UTC datetime the ORM would have returned."""
        result: dt.datetime | None = self._from_db(value)
        return result


#: One job's deferred writes: (statement, parameters or rows, many), in the job's order.
Writes = list[tuple[Statement, Any, bool]]
#: The pipeline of a transaction without round trips to save (reusable: it keeps no state).
_NO_PIPELINE: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


class DeferredTx(RawTx):
    """A RawTx whose writes are kept to be sent later, all at once (:func:`send_deferred`):
    for a writer that reads everything a batch needs first and then sends every write of the
    batch in one pipelined round trip with its commit (``runtime_service.step_process`` on
    PostgreSQL). One per job of the batch; a job given one must not read through it
    (:meth:`one` refuses)."""

    can_read = False

    def __init__(self, dialect: Dialect, batch: list[Writes]) -> None:
        super().__init__(dialect, None)
        self._writes: Writes = []
        batch.append(self._writes)

    def execute(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        self._writes.append((statement, params, False))
        return None

    def execute_many(self, statement: Statement, rows: Iterable[Mapping[str, Any]]) -> None:
        self._writes.append((statement, list(rows), True))

    def one(self, statement: Statement, params: Mapping[str, Any]) -> Sequence[Any] | None:
        raise RuntimeError("a deferred transaction cannot read: its writes are not sent yet")

    def pipeline(self) -> contextlib.AbstractContextManager[Any]:
        return _NO_PIPELINE  # everything is sent later, in one pipeline


def send_deferred(tx: RawTx, batch: list[Writes]) -> None:
    """Send a batch's deferred writes on ``tx`` (the real transaction): one ``executemany``
    per statement, with the rows of every job in job order.

    The statements go in an order that keeps each job's own order (a topological order of
    "comes next in some job", ties to the statement seen first); when the jobs disagree (A
    then B in one, B then A in another) every write goes in plain job order instead. What
    the caller must ensure: writes of different jobs do not depend on each other's order
    beyond a statement's own rows (the step writer's jobs each write their own run).
    """
    order = _statement_order(batch)
    if order is None:
        for writes in batch:
            for statement, params, many in writes:
                if many:
                    tx.execute_many(statement, params)
                else:
                    tx.execute(statement, params)
        return
    rows: dict[Statement, list[Any]] = {statement: [] for statement in order}
    for writes in batch:
        for statement, params, many in writes:
            if many:
                rows[statement].extend(params)
            else:
                rows[statement].append(params)
    for statement in order:
        if len(rows[statement]) == 1:
            tx.execute(statement, rows[statement][0])
        elif rows[statement]:
            tx.execute_many(statement, rows[statement])


def _statement_order(batch: list[Writes]) -> list[Statement] | None:
    """The batch's statements in an order consistent with every job's, or None (a cycle)."""
    seen: dict[Statement, int] = {}  # first appearance
    after: dict[Statement, set[Statement]] = {}
    for writes in batch:
        previous: Statement | None = None
        for statement, _, _ in writes:
            seen.setdefault(statement, len(seen))
            after.setdefault(statement, set())
            if previous is not None and previous is not statement:
                after[previous].add(statement)
            previous = statement
    waiting = {statement: 0 for statement in seen}
    for targets in after.values():
        for target in targets:
            waiting[target] += 1
    ready = sorted((s for s, n in waiting.items() if n == 0), key=seen.__getitem__)
    order: list[Statement] = []
    while ready:
        statement = ready.pop(0)
        order.append(statement)
        for target in sorted(after[statement], key=seen.__getitem__):
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
                ready.sort(key=seen.__getitem__)
    return order if len(order) == len(seen) else None


_PROCESSORS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}


def _sqlite_time(value: dt.datetime | None) -> str | None:
    """SQLAlchemy's SQLite storage form (``YYYY-MM-DD HH:MM:SS.ffffff``, in UTC), by the
    C-coded ``isoformat`` instead of its Python formatter."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime given to a UTC column")
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _sqlite_read_time(value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)


def _time_processors(dialect: Dialect) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    if dialect.name == "sqlite":
        return _sqlite_time, _sqlite_read_time
    found = _PROCESSORS.get(dialect.name)
    if found is None:
        # The dialect's own implementation of the type: the generic one lacks the driver's
        # conversions.
        kind = UTCDateTime().dialect_impl(dialect)
        to_db = kind.bind_processor(dialect) or (lambda v: v)
        from_db = kind.result_processor(dialect, None) or (lambda v: v)
        found = _PROCESSORS[dialect.name] = (to_db, from_db)
    return found
