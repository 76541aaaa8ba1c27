"""Turns: BeginTurn and EndTurn, and the inputs a new turn takes in.

A turn is one exchange of the agent with its inputs: it opens with the follow-ups and steers
waiting for it (delivered exactly once, in the transaction that opens it) and ends when the
worker says so with no step left open.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_base.db import utcnow
from agentrt_base.errors import FailedPrecondition, NotFound
from agentrt_base.ids import new_id
from runtime_service.services.context import Runtime
from runtime_service.store import transitions
from runtime_service.store.fencing import fenced
from runtime_service.store.ledger import InputRow, StepRow, TurnRow
from runtime_service.store.tables import AttemptRow, RunRow


def open_turn(session: Session, attempt: AttemptRow) -> TurnRow | None:
    return session.scalar(
        sa.select(TurnRow).where(TurnRow.attempt_id == attempt.id, TurnRow.status == "OPEN")
    )


_PENDING_INPUTS = (
    sa.select(InputRow)
    .where(
        InputRow.run_id == sa.bindparam("run_id"),
        InputRow.status == "PENDING",
        InputRow.kind.in_(sa.bindparam("kinds", expanding=True)),
    )
    .order_by(InputRow.create_time, InputRow.id)
)


def _pending_inputs(session: Session, run: RunRow, kinds: tuple[str, ...]) -> list[InputRow]:
    # Prebuilt and run without autoflush: BeginStep asks this on every model call, and the
    # pending step it has not flushed yet cannot be an input anyway.
    with session.no_autoflush:
        return list(session.scalars(_PENDING_INPUTS, {"run_id": run.id, "kinds": list(kinds)}))


def _deliver(
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
            session,
            run,
            event_pb2.InputConsumedAttributes(
                input_id=item.id,
                kind=enum_pb2.InputKind.Value(f"INPUT_KIND_{item.kind}"),
                step_id=step_id,
                turn_id=turn_id,
            ),
            now,
        )


def _start_turn(
    session: Session, run: RunRow, attempt: AttemptRow, now: dt.datetime, request_id: str
) -> tuple[TurnRow, list[InputRow]]:
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
    inputs = _pending_inputs(session, run, ("FOLLOW_UP", "STEER"))
    transitions.append_run_event(
        session,
        run,
        event_pb2.TurnStartedAttributes(
            turn_id=turn.id,
            attempt_id=attempt.id,
            number=turn.number,
            input_ids=[i.id for i in inputs],
        ),
        now,
    )
    _deliver(session, run, inputs, now, turn_id=turn.id)
    return turn, inputs


class TurnsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def begin_turn(
        self, attempt_id: str, lease_epoch: int, request_id: str
    ) -> tuple[TurnRow, list[InputRow]]:
        def write(session: Session) -> tuple[TurnRow, list[InputRow]]:
            run, attempt = fenced(session, attempt_id, lease_epoch)
            if request_id:
                earlier = session.scalar(
                    sa.select(TurnRow).where(
                        TurnRow.attempt_id == attempt.id, TurnRow.request_id == request_id
                    )
                )
                if earlier is not None:
                    delivered = list(
                        session.scalars(
                            sa.select(InputRow).where(InputRow.delivered_turn_id == earlier.id)
                        )
                    )
                    return earlier, delivered
            if open_turn(session, attempt) is not None:
                raise FailedPrecondition(
                    "a turn of this attempt is still open: end it first", reason="TURN_OPEN"
                )
            return _start_turn(session, run, attempt, utcnow(), request_id)

        return await self._rt.write(write)

    async def end_turn(
        self, attempt_id: str, lease_epoch: int, turn_id: str
    ) -> tuple[TurnRow, TurnRow | None, list[InputRow]]:
        def write(session: Session) -> tuple[TurnRow, TurnRow | None, list[InputRow]]:
            run, attempt = fenced(session, attempt_id, lease_epoch)
            turn = session.get(TurnRow, turn_id)
            if turn is None or turn.run_id != run.id:
                raise NotFound("turn", turn_id)
            if turn.attempt_id != attempt.id:
                raise FailedPrecondition(
                    "the turn belongs to another attempt", reason="TURN_NOT_OPEN"
                )
            if turn.status != "OPEN":
                following = session.scalar(
                    sa.select(TurnRow).where(
                        TurnRow.run_id == run.id, TurnRow.number == turn.number + 1
                    )
                )
                delivered = (
                    list(
                        session.scalars(
                            sa.select(InputRow).where(InputRow.delivered_turn_id == following.id)
                        )
                    )
                    if following
                    else []
                )
                return turn, following, delivered
            started = session.scalar(
                sa.select(sa.func.count())
                .select_from(StepRow)
                .where(StepRow.turn_id == turn.id, StepRow.status == "STARTED")
            )
            if started:
                raise FailedPrecondition(
                    f"{started} step(s) of the turn are still STARTED: end them first",
                    reason="STEPS_OPEN",
                )
            now = utcnow()
            turn.status, turn.end_time = "ENDED", now
            transitions.append_run_event(
                session,
                run,
                event_pb2.TurnEndedAttributes(turn_id=turn.id, status=enum_pb2.TURN_STATUS_ENDED),
                now,
            )
            if not _pending_inputs(session, run, ("FOLLOW_UP", "STEER")):
                return turn, None, []
            following_turn, delivered = _start_turn(session, run, attempt, now, "")
            return turn, following_turn, delivered

        return await self._rt.write(write)
