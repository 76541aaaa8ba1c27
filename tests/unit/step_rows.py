"""A step record as the step path builds one (every column set), for the unit tests of what
is made from steps: their events and their Step messages."""

from __future__ import annotations

import datetime as dt
from typing import Any

from runtime_service.services.steps import blank_step
from runtime_service.store.ledger import StepRow
from runtime_service.store.step_sql import detached_step


def new_step(start_time: dt.datetime, **values: Any) -> StepRow:
    """A started model call of run ``run_01`` (sequence 7), with ``values`` over it."""
    return detached_step(
        {
            **blank_step(),
            "id": "stp_01",
            "run_id": "run_01",
            "attempt_id": "att_01",
            "sequence": 7,
            "type": "MODEL_CALL",
            "status": "STARTED",
            "start_time": start_time,
            "input_revision": 0,
            **values,
        }
    )
