"""Turns: BeginTurn and EndTurn, and the inputs a new turn takes in.

A turn is one exchange of the agent with its inputs: it opens with the follow-ups and steers
waiting for it (delivered exactly once, in the transaction that opens it) and ends when the
worker says so with no step left open.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_core import reasons
from agentrt_core.errors import FailedPrecondition, NotFound
from runtime_service.fence import FenceClaim
from runtime_service.records import Input, Turn, input_of, turn_of
from runtime_service.services.context import Runtime
from runtime_service.store import inputs, turns
from runtime_service.store.fencing import fenced
from runtime_service.store.ledger import InputRow, TurnRow


class TurnsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def begin_turn(self, fence: FenceClaim, request_id: str) -> tuple[Turn, list[Input]]:
        def write(session: Session) -> tuple[TurnRow, list[InputRow]]:
            run, attempt = fenced(session, fence)
            if request_id:
                earlier = turns.by_request(session, attempt, request_id)
                if earlier is not None:
                    return earlier, inputs.delivered_to_turn(session, earlier.id)
            if turns.open_turn(session, attempt) is not None:
                raise FailedPrecondition(
                    "a turn of this attempt is still open: end it first", reason=reasons.TURN_OPEN
                )
            return turns.start(session, run, attempt, utcnow(), request_id)

        turn, delivered = await self._rt.write(write)
        return turn_of(turn), [input_of(i) for i in delivered]

    async def end_turn(
        self, fence: FenceClaim, turn_id: str
    ) -> tuple[Turn, Turn | None, list[Input]]:
        def write(session: Session) -> tuple[TurnRow, TurnRow | None, list[InputRow]]:
            run, attempt = fenced(session, fence)
            turn = turns.get(session, turn_id)
            if turn is None or turn.run_id != run.id:
                raise NotFound("turn", turn_id)
            if turn.attempt_id != attempt.id:
                raise FailedPrecondition(
                    "the turn belongs to another attempt", reason=reasons.TURN_NOT_OPEN
                )
            if turn.status != "OPEN":
                # Ended already (a retried EndTurn): answer what the first call did.
                following = turns.following(session, turn)
                delivered = inputs.delivered_to_turn(session, following.id) if following else []
                return turn, following, delivered
            started = turns.started_steps(session, turn)
            if started:
                raise FailedPrecondition(
                    f"{started} step(s) of the turn are still STARTED: end them first",
                    reason=reasons.STEPS_OPEN,
                )
            now = utcnow()
            turns.end(session, run, turn, now)
            if not inputs.pending(session, run, turns.INPUT_KINDS):
                return turn, None, []
            following_turn, delivered = turns.start(session, run, attempt, now, "")
            return turn, following_turn, delivered

        ended, following, delivered = await self._rt.write(write)
        return (
            turn_of(ended),
            turn_of(following) if following is not None else None,
            [input_of(i) for i in delivered],
        )
