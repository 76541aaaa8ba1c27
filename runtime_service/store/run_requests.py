"""What a client asks of a run, written: the run itself (``run.created``), a stop or a pause
asked of a running run, a pause withdrawn, an amendment of its goal. Each writes the run row
and appends its event in the caller's transaction; whether the request is allowed is the
caller's to decide. Moves between statuses go through :func:`transitions.apply` instead."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2

# The run.created and run.amended events carry the run's own view of its binding, goal,
# budget and amendment: the same mapping GetRun answers with.
from agentrt_core import audit_rows, event_chain
from agentrt_core.ids import new_id
from agentrt_core.model import AgentVersion, Resolution
from agentrt_core.proto_json import enum_value
from runtime_service import __version__, notify, proto_map
from runtime_service.lifecycle import RunStatus
from runtime_service.records import run_of
from runtime_service.step_rules import dumps
from runtime_service.store import transitions
from runtime_service.store.tables import EventRow, RunRow


@dataclass(frozen=True)
class NewRun:
    """A run as CreateRun decided it: validated, defaults applied, agent resolved, and the
    run it waits behind (thread policy ENQUEUE or INTERRUPT) chosen."""

    thread_id: str
    namespace: str
    request_id: str | None
    agent_ref: str
    version: AgentVersion
    resolution: Resolution
    goal: dict[str, Any]
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
    labels: dict[str, str]
    blocked_by_run_id: str
    #: The authenticated principal of the CreateRun call.
    creator_principal: str
    #: The W3C trace context the run was created in ("" when untraced).
    traceparent: str = ""


def create(session: Session, new: NewRun, now: dt.datetime) -> RunRow:
    """Insert the run, QUEUED, and record ``run.created``; a run nothing blocks is work for
    the workers waiting in AcquireRun (woken after commit)."""
    run = RunRow(
        id=new_id("run"),
        thread_id=new.thread_id,
        namespace=new.namespace,
        request_id=new.request_id,
        agent_requested_ref=new.agent_ref,
        agent_digest=new.version.digest,
        agent_id=new.version.agent_id,
        agent_version_label=new.version.version_label,
        agent_resolved_via_tag=new.resolution.tag,
        agent_tag_event_sequence=new.resolution.tag_event_sequence,
        agent_reference_kind=new.resolution.kind.value,
        agent_resolve_time=new.resolution.resolve_time,
        goal_json=dumps(new.goal),
        amendments_json="[]",
        input_revision=1,
        max_steps=new.max_steps,
        max_model_tokens=new.max_model_tokens,
        max_cost_usd=new.max_cost_usd,
        deadline_time=new.deadline_time,
        priority=new.priority,
        max_attempts=new.max_attempts,
        parent_run_id=new.parent_run_id,
        derived_from_run_id=new.derived_from_run_id,
        permission_ceiling=new.permission_ceiling,
        concurrency_policy=new.concurrency_policy,
        labels_json=dumps(new.labels),
        runtime_version=__version__,
        status=RunStatus.QUEUED.value,
        terminal_reason="",
        terminal_message="",
        cancel_requested=False,
        pause_requested=False,
        stop_reason="",
        stop_deadline_time=None,
        blocked_by_run_id=new.blocked_by_run_id,
        next_attempt_reason="INITIAL",
        latest_checkpoint_id="",
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        step_count=0,
        last_step_sequence=0,
        turn_count=0,
        attempt_count=0,
        current_attempt_id="",
        lease_epoch=0,
        result_summary="",
        output_ref="",
        create_time=now,
        start_time=None,
        end_time=None,
        update_time=now,
        last_event_sequence=0,
        last_event_hash="",
        creator_principal=new.creator_principal,
        traceparent=new.traceparent,
    )
    session.add(run)
    session.flush()
    record = run_of(run)
    transitions.append_run_event(
        session,
        run,
        event_pb2.RunCreatedAttributes(
            agent=proto_map.binding(record),
            goal=proto_map.goal(record),
            budget=proto_map.budget(record),
            deadline_time=proto_map.timestamp(run.deadline_time),
            priority=run.priority,
            max_attempts=run.max_attempts,
            permission_ceiling=enum_value(
                enum_pb2.PermissionCeiling, "PERMISSION_CEILING_", run.permission_ceiling
            ),
            concurrency_policy=enum_value(
                enum_pb2.ConcurrencyPolicy, "CONCURRENCY_POLICY_", run.concurrency_policy
            ),
            parent_run_id=run.parent_run_id,
            derived_from_run_id=run.derived_from_run_id,
            runtime_version=run.runtime_version,
            creator_principal=run.creator_principal,
            labels=new.labels,
            record_format=audit_rows.RECORD_FORMAT,
        ),
        now,
    )
    if not new.blocked_by_run_id:
        notify.wake(session, notify.WORK)
    return run


def request_stop(
    session: Session,
    run: RunRow,
    now: dt.datetime,
    *,
    stop_reason: str,
    deadline: dt.datetime,
    actor: str,
    principal: str,
    reason: str,
) -> None:
    """Ask the worker of a RUNNING run (locked) to stop by ``deadline``, and record
    ``run.cancel_requested`` (``actor``: the caller's label; ``principal``: who asked, empty
    when the runtime did)."""
    run.cancel_requested = True
    run.pause_requested = False  # a cancel overrides a pause not yet acknowledged
    run.stop_reason = stop_reason
    run.stop_deadline_time = deadline
    run.update_time = now
    transitions.append_run_event(
        session,
        run,
        event_pb2.RunCancelRequestedAttributes(
            actor=actor, reason=reason, actor_principal=principal
        ),
        now,
    )


def stop_reason_given(session: Session, run: RunRow) -> str:
    """The reason the caller gave when it asked the run (RUNNING, locked) to stop: that of
    its latest ``run.cancel_requested``, or ``run.pause_requested`` while a pause is asked;
    empty if none was given. Read back from the ledger, which recorded it once, when the
    stop it asked for happens (the worker acknowledges, or the runtime forces it)."""
    event_type = event_chain.event_type_name(
        event_pb2.RunPauseRequestedAttributes()
        if run.pause_requested
        else event_pb2.RunCancelRequestedAttributes()
    )
    attributes = session.scalars(
        sa.select(EventRow.attributes_json)
        .where(
            EventRow.thread_id == run.thread_id,
            EventRow.run_id == run.id,
            EventRow.event_type == event_type,
        )
        .order_by(EventRow.sequence.desc())
        .limit(1)
    ).first()
    return str(json.loads(attributes).get("reason", "")) if attributes else ""


def request_pause(
    session: Session,
    run: RunRow,
    now: dt.datetime,
    *,
    deadline: dt.datetime,
    actor: str,
    principal: str,
    reason: str,
) -> None:
    """Ask the worker of a RUNNING run (locked) to pause by ``deadline``, and record
    ``run.pause_requested``."""
    run.pause_requested = True
    run.stop_deadline_time = deadline
    run.update_time = now
    transitions.append_run_event(
        session,
        run,
        event_pb2.RunPauseRequestedAttributes(
            actor=actor, reason=reason, actor_principal=principal
        ),
        now,
    )


def withdraw_pause(
    session: Session, run: RunRow, now: dt.datetime, *, actor: str, principal: str, reason: str
) -> None:
    """Withdraw a pause asked of a RUNNING run (locked) not yet paused, and record
    ``run.resume_requested``."""
    run.pause_requested = False
    run.stop_deadline_time = None
    run.update_time = now
    transitions.append_run_event(
        session,
        run,
        event_pb2.RunResumeRequestedAttributes(
            actor=actor, reason=reason, actor_principal=principal
        ),
        now,
    )


def has_amendment(run: RunRow, request_id: str) -> bool:
    """Whether an amendment with ``request_id`` is already stored on the run."""
    return any(a.get("request_id") == request_id for a in json.loads(run.amendments_json))


def amend(
    session: Session,
    run: RunRow,
    amendment: dict[str, Any],
    *,
    actor: str,
    principal: str,
    request_id: str,
    now: dt.datetime,
) -> None:
    """Add ``amendment`` to the run (locked) as its next input revision, and record
    ``run.amended``."""
    run.input_revision += 1
    record = {
        **amendment,
        "input_revision": run.input_revision,
        "actor": actor,
        "create_time": event_chain.format_time(now),
        "actor_principal": principal,
    }
    # The request id is kept in the amendment's stored record (the proto mapping ignores
    # it), so a retry of the AmendRun is recognised (has_amendment).
    if request_id:
        record["request_id"] = request_id
    run.amendments_json = dumps([*json.loads(run.amendments_json), record])
    run.update_time = now
    transitions.append_run_event(
        session,
        run,
        event_pb2.RunAmendedAttributes(amendment=proto_map.amendment(record)),
        now,
    )
