"""The runtime's domain records: what its services return, as plain values.

The rules (``step_rules``) build and read these; the storage layer (``store/steps.py``)
reads them from and writes them to the database; the services return them; the transport
(``proto_map``) maps them to messages. None of those needs the others' types: a record is not
an ORM row and never goes near a session, so the transport never imports the store.

Besides the step (below), a record holds the fields of its row that the API serves (and the
few its callers read besides): a row's bookkeeping (request ids, lease token hashes, queue
columns) stays in the store. Each is built from a row by its one ``*_of`` function, which
reads the row's attributes by the record's field names (``tests/unit/test_records.py`` checks
that every field is a column of its table).

:class:`Step` keeps its fields as plain instance attributes (a step's events, usage rows,
statements and answer read 30-odd of them; an ORM row's instrumented attributes cost ~0.5 us
a read, these what a dict lookup does). Its fields are exactly the ``runtime_steps``
columns; ``store/steps.py`` refuses to import if they ever differ, so a column added to the
table and not here (or the other way round) fails at once, not silently on one path.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar


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
    #: The trace of the step's span: its attempt's ("" when untraced).
    trace_id: str

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
    "trace_id": "",
}


R = TypeVar("R")


def _reader(kind: type[R]) -> Callable[[Any], R]:
    """The function building a ``kind`` from anything with its fields as attributes (an ORM
    row): one getter call and the dataclass's constructor, no Python loop.

    A loaded row's values are read from its ``__dict__`` (where the ORM keeps them): reading
    them as attributes went through the ORM's instrumentation, ~0.35 us a field, and made
    ``run_of`` cost more than mapping the run to its message. A field missing there (not
    loaded, or expired) is read as an attribute, as the ORM answers it.
    """
    names = [f.name for f in fields(kind)]  # type: ignore[arg-type]
    loaded, get = operator.itemgetter(*names), operator.attrgetter(*names)

    def of(row: Any) -> R:
        try:
            return kind(*loaded(row.__dict__))
        except KeyError:
            return kind(*get(row))

    return of


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


INPUT_FIELDS: tuple[str, ...] = tuple(Input.__annotations__)
input_of = _reader(Input)


@dataclass(frozen=True, slots=True)
class Thread:
    id: str
    namespace: str
    title: str
    metadata_json: str
    concurrency_policy: str
    create_time: dt.datetime


thread_of = _reader(Thread)


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    thread_id: str
    role: str
    content: str
    data_json: str
    run_id: str
    create_time: dt.datetime


message_of = _reader(Message)


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the API serves it (and its event chain's head, which a bundle records)."""

    id: str
    thread_id: str
    namespace: str
    agent_requested_ref: str
    agent_digest: str
    agent_id: str
    agent_version_label: str
    agent_resolved_via_tag: str
    agent_tag_event_sequence: int
    agent_reference_kind: str
    agent_resolve_time: dt.datetime
    goal_json: str
    amendments_json: str
    input_revision: int
    max_steps: int
    max_model_tokens: int
    max_cost_usd: float
    deadline_time: dt.datetime | None
    priority: int
    max_attempts: int
    parent_run_id: str
    derived_from_run_id: str
    permission_ceiling: str
    concurrency_policy: str
    labels_json: str
    runtime_version: str
    status: str
    terminal_reason: str
    terminal_message: str
    cancel_requested: bool
    pause_requested: bool
    latest_checkpoint_id: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    #: Every step's per-run sequence (the API's ``step_count``).
    last_step_sequence: int
    attempt_count: int
    current_attempt_id: str
    result_summary: str
    output_ref: str
    create_time: dt.datetime
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    update_time: dt.datetime
    last_event_sequence: int
    last_event_hash: str
    creator_principal: str
    traceparent: str


run_of = _reader(Run)


@dataclass(frozen=True, slots=True)
class Attempt:
    id: str
    run_id: str
    number: int
    reason: str
    worker_id: str
    lease_epoch: int
    resume_from_checkpoint_id: str
    status: str
    start_time: dt.datetime
    end_time: dt.datetime | None
    lease_expire_time: dt.datetime
    error_class: str
    error_message: str
    retryable: bool
    input_tokens: int
    output_tokens: int
    cost_usd: float
    result_summary: str
    output_ref: str
    worker_principal: str
    traceparent: str


attempt_of = _reader(Attempt)


@dataclass(frozen=True, slots=True)
class Turn:
    id: str
    run_id: str
    attempt_id: str
    number: int
    status: str
    start_time: dt.datetime
    end_time: dt.datetime | None


turn_of = _reader(Turn)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    id: str
    run_id: str
    attempt_id: str
    step_id: str
    state_ref: str
    after_sequence: int
    create_time: dt.datetime


checkpoint_of = _reader(Checkpoint)


@dataclass(frozen=True, slots=True)
class Artifact:
    id: str
    run_id: str
    thread_id: str
    attempt_id: str
    step_id: str
    name: str
    blob_digest: str
    media_type: str
    size: int
    labels_json: str
    create_time: dt.datetime


artifact_of = _reader(Artifact)


@dataclass(frozen=True, slots=True)
class Blob:
    """Stored content's header (the bytes are read apart, in chunks)."""

    digest: str
    size: int
    media_type: str
    create_time: dt.datetime


blob_of = _reader(Blob)


# -- what an audit bundle records of the registry ----------------------------------------------


@dataclass(frozen=True)
class BundledAgent:
    """The agent version a bundle records, as the registry stored it (its JSON parsed, never
    rebuilt from the domain model: the bundle carries what was published)."""

    agent_id: str
    version_label: str
    digest: str
    description: str
    definition: Any
    closure: Any
    publish_time: dt.datetime
    provenance: Any
    principal: str
    #: The OIDC token's verified claims, for a version published with one.
    verified_provenance: Any | None


@dataclass(frozen=True)
class BundledComponent:
    """A component the bundled agent version pins, as the registry stored it."""

    kind: str
    name: str
    version: str
    description: str
    spec: Any
    digest: str
    schema_digest: str | None
