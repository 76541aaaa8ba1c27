"""The step path's domain records: a step and an input as plain values.

The rules (``step_rules``) build and read these; the storage layer (``store/steps.py``)
reads them from and writes them to the database; the transport (``proto_map``) maps them to
messages. None of those needs the others' types: a record is not an ORM row and never goes
near a session.

:class:`Step` keeps its fields as plain instance attributes (a step's events, usage rows,
statements and answer read 30-odd of them; an ORM row's instrumented attributes cost ~0.5 us
a read, these what a dict lookup does). Its fields are exactly the ``runtime_steps``
columns; ``store/steps.py`` refuses to import if they ever differ, so a column added to the
table and not here (or the other way round) fails at once, not silently on one path.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any


class Step:
    """One step's fields. Build with :func:`new_step` (every field given), never by hand."""

    id: str
    run_id: str
    attempt_id: str
    turn_id: str
    sequence: int
    type: str
    #: What the step does, for people reading the ledger ("search docs", "apply patch").
    #: Defaults to the tool's or the completion check's name (``step_rules``).
    operation: str
    status: str
    idempotency_key: str
    input_ref: str
    output_ref: str
    summary: str
    start_time: dt.datetime
    end_time: dt.datetime | None
    error_class: str
    error_message: str
    retryable: bool
    retry_of_step_id: str
    side_effect: bool
    input_tokens: int
    output_tokens: int
    cost_usd: float
    input_revision: int
    consumed_input_ids_json: str
    tool_name: str
    tool_arguments_json: str
    approval_decision: str
    #: The approver's display label, as the caller gave it.
    approver: str
    #: The authenticated principal that resolved the approval (set by ResolveApproval, in
    #: the server process; a step's own writer is its attempt's worker_principal).
    approver_principal: str
    approval_comment: str
    approval_time: dt.datetime | None
    approval_step_id: str
    completion_check: str
    model_policy_digest: str
    candidate_name: str
    candidate_reason: str
    provider: str
    requested_model_id: str
    parameters_json: str
    reported_model_id: str
    system_prompt_digest: str
    context_digest: str
    skills_json: str
    tools_json: str
    #: MODEL_CALL with reason FALLBACK_AFTER_ERROR: the attempt's failed MODEL_CALL step the
    #: fallback follows (read from the ledger, never from the request).
    fallback_from_step_id: str

    def values(self) -> dict[str, Any]:
        """Every field by name (the record's own dict: read it, do not change it)."""
        return self.__dict__

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt around the unpickled dict itself (no copy, no Python loop): the server
        # loads every step the step writer process records. Pickled with the batch it
        # answers, the field names are written once per batch, not per step.
        return (_step_of_dict, (self.__dict__,))

    def __repr__(self) -> str:
        return f"Step({self.id!r}, {self.type}, {self.status}, sequence={self.sequence})"


#: The fields of a step, in declaration order.
STEP_FIELDS: tuple[str, ...] = tuple(Step.__annotations__)


def _step_of_dict(values: dict[str, Any]) -> Step:
    step = Step.__new__(Step)
    step.__dict__ = values
    return step


def new_step(values: dict[str, Any]) -> Step:
    """A step holding ``values``, which must be every field (``STEP_FIELDS``)."""
    step = Step.__new__(Step)
    step.__dict__.update(values)
    return step


def step_of(row: Any) -> Step:
    """The record of anything with a step's fields as attributes (an ORM row, say)."""
    return new_step({name: getattr(row, name) for name in STEP_FIELDS})


#: Every field a new step leaves at its default (``bench/audit_bench.py`` starts from it too).
BLANK_STEP: dict[str, Any] = {
    "turn_id": "",
    "operation": "",
    "idempotency_key": "",
    "input_ref": "",
    "output_ref": "",
    "summary": "",
    "end_time": None,
    "error_class": "",
    "error_message": "",
    "retryable": False,
    "retry_of_step_id": "",
    "side_effect": False,
    "input_tokens": 0,
    "output_tokens": 0,
    "cost_usd": 0.0,
    "consumed_input_ids_json": "[]",
    "tool_name": "",
    "tool_arguments_json": "{}",
    "approval_decision": "",
    "approver": "",
    "approver_principal": "",
    "approval_comment": "",
    "approval_time": None,
    "approval_step_id": "",
    "completion_check": "",
    "model_policy_digest": "",
    "candidate_name": "",
    "candidate_reason": "",
    "provider": "",
    "requested_model_id": "",
    "parameters_json": "{}",
    "reported_model_id": "",
    "system_prompt_digest": "",
    "context_digest": "",
    "skills_json": "[]",
    "tools_json": "[]",
    "fallback_from_step_id": "",
}


@dataclass(frozen=True, slots=True)
class Input:
    """An input (steer or follow-up) sent to a run."""

    id: str
    run_id: str
    kind: str
    content: str
    data_json: str
    sender: str
    create_time: dt.datetime
    status: str
    delivered_step_id: str
    delivered_turn_id: str
    deliver_time: dt.datetime | None
    #: The authenticated principal that sent it (``sender`` is the caller's label).
    sender_principal: str

    @staticmethod
    def of(row: Any) -> Input:
        return Input(*(getattr(row, name) for name in INPUT_FIELDS))


INPUT_FIELDS: tuple[str, ...] = tuple(Input.__annotations__)
