"""Reading steps (ListSteps, GetStep): the rows as :class:`~runtime_service.records.Step`."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_core.errors import NotFound
from agentrt_core.paging import PageRequest, cut_page, page_request
from runtime_service.records import Step, step_of
from runtime_service.store.ledger import StepRow
from runtime_service.store.tables import RunRow


@dataclass(frozen=True)
class StepsPage:
    run_id: str
    attempt_id: str
    turn_id: str
    page: PageRequest
    filters: dict[str, str]


def steps_page(
    run_id: str, attempt_id: str, turn_id: str, page_size: int, page_token: str
) -> StepsPage:
    """A ListSteps request, its page token checked (by sequence, within these filters)."""
    filters = {"run_id": run_id, "attempt_id": attempt_id, "turn_id": turn_id}
    page = page_request(page_size, page_token, filters, key=(int,))
    return StepsPage(run_id, attempt_id, turn_id, page, filters)


def list_steps(session: Session, request: StepsPage) -> tuple[list[Step], str]:
    if session.get(RunRow, request.run_id) is None:
        raise NotFound("run", request.run_id)
    stmt = sa.select(StepRow).where(StepRow.run_id == request.run_id)
    if request.attempt_id:
        stmt = stmt.where(StepRow.attempt_id == request.attempt_id)
    if request.turn_id:
        stmt = stmt.where(StepRow.turn_id == request.turn_id)
    page = request.page
    if page.after is not None:
        stmt = stmt.where(StepRow.sequence > page.after[0])
    rows = session.scalars(stmt.order_by(StepRow.sequence).limit(page.size + 1)).all()
    steps = [step_of(row) for row in rows]
    return cut_page(steps, page.size, request.filters, lambda s: [s.sequence])


def row(session: Session, step_id: str) -> StepRow | None:
    """A step's row by id (the one lookup every write that names a step starts from)."""
    return session.get(StepRow, step_id)


def get_step(session: Session, step_id: str) -> Step:
    row = session.get(StepRow, step_id)
    if row is None:
        raise NotFound("step", step_id)
    return step_of(row)
