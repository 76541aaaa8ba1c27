"""The runtime's records and the rows they are read from (``runtime_service.records``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, cast

import pytest
import sqlalchemy as sa

from runtime_service import records
from runtime_service.store.ledger import ArtifactRow, BlobRow, CheckpointRow, InputRow, TurnRow
from runtime_service.store.tables import AttemptRow, MessageRow, RunRow, ThreadRow

#: Each record, its one conversion, and the table it is read from.
KINDS: list[tuple[type[Any], Any, type[Any]]] = [
    (records.Thread, records.thread_of, ThreadRow),
    (records.Message, records.message_of, MessageRow),
    (records.Run, records.run_of, RunRow),
    (records.Attempt, records.attempt_of, AttemptRow),
    (records.Turn, records.turn_of, TurnRow),
    (records.Checkpoint, records.checkpoint_of, CheckpointRow),
    (records.Artifact, records.artifact_of, ArtifactRow),
    (records.Blob, records.blob_of, BlobRow),
    (records.Input, records.input_of, InputRow),
]


def _columns(table: type[Any]) -> dict[str, sa.Column[Any]]:
    return {c.key: c for c in cast(sa.Table, table.__table__).columns}


@pytest.mark.parametrize(("kind", "of", "table"), KINDS, ids=lambda k: getattr(k, "__name__", ""))
def test_every_field_of_a_record_is_a_column_of_its_table(
    kind: type[Any], of: Any, table: type[Any]
) -> None:
    """A column renamed, or a field misspelt, fails here rather than on one call's path."""
    missing = [f.name for f in dataclasses.fields(kind) if f.name not in _columns(table)]
    assert not missing, f"{kind.__name__} fields {table.__tablename__} does not have: {missing}"


def _sample(column: sa.Column[Any]) -> Any:
    # (The time columns are a TypeDecorator: what it stores is its ``impl``'s.)
    python = getattr(column.type, "impl", column.type).python_type
    return {
        str: f"v-{column.key}",
        int: len(column.key),
        float: len(column.key) / 4,
        bool: True,
        dt.datetime: dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    }[python]


@pytest.mark.parametrize(("kind", "of", "table"), KINDS, ids=lambda k: getattr(k, "__name__", ""))
def test_a_record_holds_its_rows_values(kind: type[Any], of: Any, table: type[Any]) -> None:
    columns = _columns(table)
    row = table(**{name: _sample(column) for name, column in columns.items()})
    record = of(row)
    assert isinstance(record, kind)
    assert dataclasses.asdict(record) == {
        f.name: getattr(row, f.name) for f in dataclasses.fields(kind)
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        # A record is a value: nobody changes what a service answered.
        setattr(record, dataclasses.fields(kind)[0].name, "changed")


def test_a_field_the_row_has_not_loaded_is_read_as_an_attribute() -> None:
    """A new row's unset columns are not in its ``__dict__``: the record asks the row, as
    reading the attribute would (None, for a column nobody set)."""
    row = ThreadRow(id="thr_1", namespace="default", title="t", metadata_json="{}")
    record = records.thread_of(row)
    assert (record.id, record.concurrency_policy, record.create_time) == ("thr_1", None, None)
