"""Turns as stored: opened with the inputs waiting for them, ended, and looked up."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_core.ids import new_id
from runtime_service.store import inputs, transitions
from runtime_service.store.ledger import InputRow, StepRow, TurnRow
from runtime_service.store.tables import AttemptRow, RunRow

#: The kinds of input a new turn takes in (all that wait for it: follow-ups and steers).
INPUT_KINDS = ("FOLLOW_UP", "STEER")


def get(session: Session, turn_id: str) -> TurnRow | None:
    return session.get(TurnRow, turn_id)


def open_turn(session: Session, attempt: AttemptRow) -> TurnRow | None:
    """The attempt's open turn, if it has one (an attempt has at most one at a time)."""
    return session.scalar(
        sa.select(TurnRow).where(TurnRow.attempt_id == attempt.id, TurnRow.status == "OPEN")
    )


def by_request(session: Session, attempt: AttemptRow, request_id: str) -> TurnRow | None:
    """The turn an earlier BeginTurn of this attempt opened under ``request_id``, if any."""
    return session.scalar(
        sa.select(TurnRow).where(TurnRow.attempt_id == attempt.id, TurnRow.request_id == request_id)
    )


def following(session: Session, turn: TurnRow) -> TurnRow | None:
    """The run's turn after ``turn``, if one was opened."""
    return session.scalar(
        sa.select(TurnRow).where(TurnRow.run_id == turn.run_id, TurnRow.number == turn.number + 1)
    )


def started_steps(session: Session, turn: TurnRow) -> int:
    """How many of the turn's steps are still STARTED."""
    return int(
        session.scalar(
            sa.select(sa.func.count())
            .select_from(StepRow)
            .where(StepRow.turn_id == turn.id, StepRow.status == "STARTED")
        )
        or 0
    )


def start(
    session: Session, run: RunRow, attempt: AttemptRow, now: dt.datetime, request_id: str
) -> tuple[TurnRow, list[InputRow]]:
    """Open the run's next turn in ``attempt``, record ``turn.started``, and deliver it the
    inputs waiting (:data:`INPUT_KINDS`), which it returns with the turn."""
    run.turn_count += 1
    turn = TurnRow(
        id=new_id("trn"),
        run_id=run.id,
        attempt_id=attempt.id,
        number=run.turn_count,
        status="OPEN",
        start_time=now,
        end_time=None,
        request_id=request_id,
    )
    session.add(turn)
    waiting = inputs.pending(session, run, INPUT_KINDS)
    transitions.append_run_event(
        session,
        run,
        event_pb2.TurnStartedAttributes(
            turn_id=turn.id,
            attempt_id=attempt.id,
            number=turn.number,
            input_ids=[i.id for i in waiting],
        ),
        now,
    )
    inputs.deliver(session, run, waiting, now, turn_id=turn.id)
    return turn, waiting


def end(session: Session, run: RunRow, turn: TurnRow, now: dt.datetime) -> None:
    """End the open ``turn`` and record ``turn.ended``."""
    turn.status, turn.end_time = "ENDED", now
    transitions.append_run_event(
        session,
        run,
        event_pb2.TurnEndedAttributes(turn_id=turn.id, status=enum_pb2.TURN_STATUS_ENDED),
        now,
    )
