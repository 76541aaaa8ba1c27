"""Applying a lifecycle transition to a stored run: the one function that does it.

It asks :mod:`runtime_service.lifecycle` whether the transition is legal, ends the active
attempt when the transition says so, writes the run's new state, and appends the events,
all in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_core.completion import CheckResult
from agentrt_core.proto_json import enum_value
from runtime_service import events, lifecycle, notify, step_events
from runtime_service.lifecycle import Actor, RunStatus, Trigger
from runtime_service.observations import (
    AttemptEnded,
    AttemptTrace,
    RunMoved,
    StepRecorded,
    observe,
)
from runtime_service.records import attempt_of, step_of
from runtime_service.store.ledger import InputRow, StepRow, TurnRow
from runtime_service.store.tables import AttemptRow, RunRow

#: What the next attempt's reason is when a transition puts a run back in the queue.
_NEXT_REASON = {
    Trigger.RETRY: "RETRY_AFTER_ERROR",
    Trigger.LOSE: "WORKER_LOST",
    Trigger.RESOLVE_APPROVAL: "RESUMED_AFTER_APPROVAL",
    Trigger.RESUME: "RESUMED_AFTER_PAUSE",
}


def chain_of(run: RunRow) -> events.Chain:
    return events.Chain(run.thread_id, run.id, run.last_event_sequence, run.last_event_hash)


def append_run_event(session: Session, run: RunRow, attributes: object, now: dt.datetime) -> None:
    """Append one event to the run's chain and keep the run row's chain head in step."""
    chain = chain_of(run)
    events.append(session.connection(), chain, attributes, now)  # type: ignore[arg-type]
    run.last_event_sequence, run.last_event_hash = chain.last_sequence, chain.last_hash
    notify.wake(session, notify.run_key(run.id), notify.thread_key(run.thread_id))


def usage_of(run: RunRow) -> message_pb2.Usage:
    return message_pb2.Usage(
        input_tokens=run.input_tokens, output_tokens=run.output_tokens, cost_usd=run.cost_usd
    )


def end_attempt(
    session: Session,
    run: RunRow,
    attempt: AttemptRow,
    status: str,
    now: dt.datetime,
    *,
    error_class: str = "",
    error_message: str = "",
    retryable: bool = False,
) -> None:
    """End the run's active attempt with ``status`` and record ``attempt.ended``."""
    attempt.status = status
    attempt.end_time = now
    # Always stored (not only with an error): a repeated FinishAttempt is recognised by it.
    attempt.retryable = retryable
    if error_class or error_message:
        attempt.error_class = error_class
        attempt.error_message = error_message
    run.current_attempt_id = ""
    _close_attempt_work(session, run, attempt, status, now)
    observe(session, AttemptEnded(attempt_trace(run, attempt), attempt_of(attempt)))
    append_run_event(
        session,
        run,
        event_pb2.AttemptEndedAttributes(
            attempt_id=attempt.id,
            status=enum_value(enum_pb2.AttemptStatus, "ATTEMPT_STATUS_", status),
            error=message_pb2.AttemptError(
                error_class=enum_value(enum_pb2.ErrorClass, "ERROR_CLASS_", error_class),
                message=error_message,
                retryable=retryable,
            )
            if error_class or error_message
            else None,
            usage=message_pb2.Usage(
                input_tokens=attempt.input_tokens,
                output_tokens=attempt.output_tokens,
                cost_usd=attempt.cost_usd,
            ),
            result_summary=attempt.result_summary,
            output_ref=attempt.output_ref,
        ),
        now,
    )


def attempt_trace(run: RunRow, attempt: AttemptRow) -> AttemptTrace:
    """What the spans of ``attempt`` say of it (``observations.AttemptTrace``)."""
    return AttemptTrace(
        attempt.id,
        attempt.number,
        attempt.traceparent,
        run.traceparent,
        run.id,
        run.thread_id,
        run.namespace,
        run.agent_id,
        run.agent_version_label,
        run.agent_digest,
    )


def _close_attempt_work(
    session: Session, run: RunRow, attempt: AttemptRow, status: str, now: dt.datetime
) -> None:
    """Steps still STARTED end CANCELLED and an open turn ends (INTERRUPTED unless the attempt
    succeeded): nothing of an ended attempt stays open."""
    for step in session.scalars(
        sa.select(StepRow).where(StepRow.attempt_id == attempt.id, StepRow.status == "STARTED")
    ):
        step.status, step.end_time = "CANCELLED", now
        step.error_class, step.error_message = "CANCELLED", f"the attempt ended {status}"
        record = step_of(step)
        # The same step.ended as EndStep records (step_events: one mapping of a step to it).
        append_run_event(session, run, step_events.ended(record), now)
        observe(session, StepRecorded.ended_step(run.agent_id, record))
    for turn in session.scalars(
        sa.select(TurnRow).where(TurnRow.attempt_id == attempt.id, TurnRow.status == "OPEN")
    ):
        turn.status = "ENDED" if status == "SUCCEEDED" else "INTERRUPTED"
        turn.end_time = now
        append_run_event(
            session,
            run,
            event_pb2.TurnEndedAttributes(
                turn_id=turn.id, status=enum_value(enum_pb2.TurnStatus, "TURN_STATUS_", turn.status)
            ),
            now,
        )


def apply(
    session: Session,
    run: RunRow,
    trigger: Trigger,
    actor: Actor,
    now: dt.datetime,
    *,
    message: str = "",
    attempt: AttemptRow | None = None,
    error_class: str = "",
    error_message: str = "",
    retryable: bool = False,
    attempt_status: str | None = None,
    principal: str = "",
    completion_checks: Sequence[CheckResult] = (),
) -> lifecycle.Transition:
    """Move ``run`` (loaded FOR UPDATE by the caller) by ``trigger``; refuse if illegal.

    ``attempt`` is the run's active attempt, required when the transition ends one;
    ``attempt_status`` overrides the status the table gives it (a lease lost on the last
    attempt fails the run, but the attempt itself was LOST, not FAILED). ``principal`` is
    the authenticated principal whose call moves the run, recorded in the event; a client's
    or a worker's move must name one, the runtime's own moves have none.
    ``completion_checks``: what the completion policy's checks were found to be, recorded
    on the ``run.ended`` of a completion claim.
    """
    if (actor is Actor.RUNTIME) == bool(principal):
        raise AssertionError(f"{actor.value} move with principal {principal!r}")
    current = RunStatus(run.status)
    t = lifecycle.transition(current, trigger, actor)
    if t.attempt_end is not None:
        if attempt is None or attempt.id != run.current_attempt_id:
            raise AssertionError(f"{trigger} from {current} needs the run's active attempt")
        end_attempt(
            session,
            run,
            attempt,
            attempt_status or t.attempt_end,
            now,
            error_class=error_class,
            error_message=error_message,
            retryable=retryable,
        )
    run.status = t.target.value
    run.update_time = now
    observe(
        session,
        RunMoved(
            run.namespace,
            run.agent_id,
            current.value,
            t.target.value,
            trigger.value,
            ended=t.reason is not None,
            lifetime=now - run.create_time if t.reason is not None else None,
            run_id=run.id,
        ),
    )
    if t.target is RunStatus.RUNNING and run.start_time is None:
        run.start_time = now
    if t.target is not RunStatus.RUNNING:
        run.cancel_requested = run.pause_requested = False
        run.stop_deadline_time = None
        run.stop_reason = ""
    if t.target is RunStatus.QUEUED:
        # Fix: a run that never had an attempt (paused and resumed while queued) still gets
        # INITIAL for its first one ("the run's first attempt", enum.proto).
        if run.attempt_count:
            run.next_attempt_reason = _NEXT_REASON.get(trigger, run.next_attempt_reason)
        notify.wake(session, notify.WORK)
    if t.reason is not None:
        run.terminal_reason = t.reason.value
        run.terminal_message = message
        run.end_time = now
        append_run_event(
            session,
            run,
            event_pb2.RunEndedAttributes(
                status=enum_value(enum_pb2.RunStatus, "RUN_STATUS_", t.target.value),
                terminal_reason=enum_value(
                    enum_pb2.TerminalReason, "TERMINAL_REASON_", t.reason.value
                ),
                terminal_message=message,
                usage=usage_of(run),
                output_ref=run.output_ref,
                actor_principal=principal,
                result_summary=run.result_summary,
                completion_checks=[_check_result(r) for r in completion_checks],
            ),
            now,
        )
        _release_waiters(session, run)
        # Input nobody will read any more is marked so, rather than left looking pending.
        session.execute(
            sa.update(InputRow)
            .where(InputRow.run_id == run.id, InputRow.status == "PENDING")
            .values(status="DISCARDED")
            .execution_options(synchronize_session=False)
        )
    else:
        append_run_event(
            session,
            run,
            event_pb2.RunStatusChangedAttributes(
                previous_status=enum_value(enum_pb2.RunStatus, "RUN_STATUS_", current.value),
                status=enum_value(enum_pb2.RunStatus, "RUN_STATUS_", t.target.value),
                actor=actor.value,
                reason=message or t.description,
                actor_principal=principal,
            ),
            now,
        )
    return t


def _release_waiters(session: Session, run: RunRow) -> None:
    """Runs queued behind this one (thread policy ENQUEUE) become eligible now it has ended.

    Fix: a waiter is released only if no *other* earlier run of its thread is still active
    (an ENQUEUE run waits for every earlier run, not only the one it was queued behind: that
    one may itself have been waiting, or have run beside others under ALLOW); otherwise it
    now waits for the latest such run.
    """
    active = [s.value for s in RunStatus if not s.terminal]
    waiters = session.scalars(
        sa.select(RunRow).where(RunRow.blocked_by_run_id == run.id).order_by(RunRow.create_time)
    ).all()
    released = False
    for waiter in waiters:
        earlier = session.scalar(
            sa.select(RunRow.id)
            .where(
                RunRow.thread_id == waiter.thread_id,
                RunRow.id.not_in([run.id, waiter.id]),
                RunRow.status.in_(active),
                RunRow.create_time < waiter.create_time,
            )
            .order_by(RunRow.create_time.desc())
            .limit(1)
        )
        waiter.blocked_by_run_id = earlier or ""
        released = released or not earlier
    if released:
        notify.wake(session, notify.WORK)


def _check_result(result: CheckResult) -> message_pb2.CompletionCheckResult:
    return message_pb2.CompletionCheckResult(
        name=result.check.name,
        condition=result.check.condition,
        passed=result.passed,
        step_ids=result.step_ids,
        artifact_ids=result.artifact_ids,
        attested_by=result.attested_by,
        detail=result.detail,
    )
