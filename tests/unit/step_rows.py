"""A step record as the step path builds one (every column set), for the unit tests of what
is made from steps: their events and their Step messages."""

from __future__ import annotations

import datetime as dt
from typing import Any

from runtime_service import records
from runtime_service.records import BLANK_STEP, Step


def new_step(start_time: dt.datetime, **values: Any) -> Step:
    """A started model call of run ``run_01`` (sequence 7), with ``values`` over it."""
    return records.new_step(
        {
            **BLANK_STEP,
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
