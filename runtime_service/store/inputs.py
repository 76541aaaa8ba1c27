"""Inputs as stored: steers and follow-ups received, waiting, and handed over exactly once."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core import audit_rows
from agentrt_core.ids import new_id
from agentrt_core.proto_json import enum_value
from runtime_service.store import transitions
from runtime_service.store.ledger import InputRow
from runtime_service.store.tables import RunRow

_PENDING = (
    sa.select(InputRow)
    .where(
        InputRow.run_id == sa.bindparam("run_id"),
        InputRow.status == "PENDING",
        InputRow.kind.in_(sa.bindparam("kinds", expanding=True)),
    )
    .order_by(InputRow.create_time, InputRow.id)
)


def by_request(session: Session, request_key: str) -> InputRow | None:
    """The input an earlier SendInput stored under this (scoped) request id, if any."""
    return session.scalar(sa.select(InputRow).where(InputRow.request_id == request_key))


def receive(
    session: Session,
    run: RunRow,
    kind: str,
    content: str,
    data_json: str,
    sender: str,
    principal: str,
    request_key: str | None,
    now: dt.datetime,
) -> InputRow:
    """Store a new PENDING input of ``run`` (locked by the caller; ``data_json`` is its
    structured data, serialised) sent by ``principal`` (``sender``: the caller's label), and
    record ``input.received``."""
    item = InputRow(
        id=new_id("inp"),
        run_id=run.id,
        kind=kind,
        content=content,
        data_json=data_json,
        sender=sender[:200],
        sender_principal=principal,
        create_time=now,
        status="PENDING",
        delivered_step_id="",
        delivered_turn_id="",
        deliver_time=None,
        request_id=request_key,
    )
    session.add(item)
    run.update_time = now
    transitions.append_run_event(
        session,
        run,
        event_pb2.InputReceivedAttributes(
            input_id=item.id,
            kind=enum_value(enum_pb2.InputKind, "INPUT_KIND_", kind),
            sender=item.sender,
            sender_principal=principal,
            content_digest=audit_rows.content_digest(content),
            data_digest=audit_rows.data_digest(data_json),
        ),
        now,
    )
    return item


def pending(session: Session, run: RunRow, kinds: tuple[str, ...]) -> list[InputRow]:
    """The run's inputs of ``kinds`` still waiting, oldest first (the order they are taken in)."""
    # Prebuilt, and run without autoflush: the turn its caller has just added and not flushed
    # yet cannot be an input anyway, so there is nothing to write before reading.
    with session.no_autoflush:
        return list(session.scalars(_PENDING, {"run_id": run.id, "kinds": list(kinds)}))


def delivered_to_turn(session: Session, turn_id: str) -> list[InputRow]:
    """The inputs a turn took in when it started."""
    return list(session.scalars(sa.select(InputRow).where(InputRow.delivered_turn_id == turn_id)))


def deliver(
    session: Session,
    run: RunRow,
    inputs: list[InputRow],
    now: dt.datetime,
    *,
    turn_id: str,
    step_id: str = "",
) -> None:
    """Hand inputs over exactly once: each is marked DELIVERED in the same transaction that
    records the consuming turn or step, so a retried call cannot deliver it twice."""
    for item in inputs:
        item.status = "DELIVERED"
        item.delivered_turn_id = turn_id
        item.delivered_step_id = step_id
        item.deliver_time = now
        transitions.append_run_event(
            session, run, consumed_event(item.id, item.kind, turn_id=turn_id, step_id=step_id), now
        )


def consumed_event(
    input_id: str, kind: str, *, turn_id: str, step_id: str = ""
) -> event_pb2.InputConsumedAttributes:
    """``input.consumed``: an input handed to a turn, or to a step (steers: ``store/steps``)."""
    return event_pb2.InputConsumedAttributes(
        input_id=input_id,
        kind=enum_value(enum_pb2.InputKind, "INPUT_KIND_", kind),
        step_id=step_id,
        turn_id=turn_id,
    )
