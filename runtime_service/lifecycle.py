"""The run state machine, in one place and pure: which status a trigger may move a run to,
who may pull that trigger, and what the run's terminal reason becomes.

Storage applies a transition through :func:`runtime_service.store.transitions.apply`,
which asks this module first; ``docs/lifecycle.md`` is this table written out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agentrt_core import reasons
from agentrt_core.errors import FailedPrecondition


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT}
)


class Trigger(StrEnum):
    ACQUIRE = "ACQUIRE"  # a worker takes the run: attempt N starts
    COMPLETE = "COMPLETE"  # the worker reached the goal
    FAIL_CHECKS = "FAIL_CHECKS"  # the worker claimed the goal; a completion check failed for good
    FAIL = "FAIL"  # the worker reports a failure it will not retry
    RETRY = "RETRY"  # the worker failed retryably and attempts remain
    EXHAUST = "EXHAUST"  # an attempt failed or was lost and no attempts remain
    LOSE = "LOSE"  # the lease expired (worker gone) and attempts remain
    WAIT_APPROVAL = "WAIT_APPROVAL"  # a step needs a human decision; the attempt ends
    RESOLVE_APPROVAL = "RESOLVE_APPROVAL"  # the decision was recorded; a new attempt may start
    PAUSE = "PAUSE"  # stop without ending (a queued run at once; a running one when acknowledged)
    RESUME = "RESUME"  # a paused run is queued again
    CANCEL = "CANCEL"  # the client cancels (a queued run at once; a running one when acknowledged)
    INTERRUPT = "INTERRUPT"  # a new run in the thread (policy INTERRUPT) ends this one
    TIME_OUT = "TIME_OUT"  # deadline_time passed
    BUDGET = "BUDGET"  # a budget would be exceeded


class Actor(StrEnum):
    CLIENT = "client"
    WORKER = "worker"
    RUNTIME = "runtime"


class TerminalReason(StrEnum):
    COMPLETED_BY_WORKER = "COMPLETED_BY_WORKER"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    CANCELLED_BY_USER = "CANCELLED_BY_USER"
    INTERRUPTED_BY_NEW_RUN = "INTERRUPTED_BY_NEW_RUN"
    WORKER_REPORTED_FAILURE = "WORKER_REPORTED_FAILURE"
    COMPLETION_CHECKS_FAILED = "COMPLETION_CHECKS_FAILED"


@dataclass(frozen=True)
class Transition:
    source: RunStatus
    trigger: Trigger
    target: RunStatus
    actors: frozenset[Actor]
    #: Set exactly when ``target`` is terminal.
    reason: TerminalReason | None
    #: The attempt status an active attempt ends with, when the transition ends one.
    attempt_end: str | None
    description: str


def _t(
    source: RunStatus,
    trigger: Trigger,
    target: RunStatus,
    actors: set[Actor],
    reason: TerminalReason | None,
    attempt_end: str | None,
    description: str,
) -> Transition:
    return Transition(source, trigger, target, frozenset(actors), reason, attempt_end, description)


Q, R, W, P = RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING_APPROVAL, RunStatus.PAUSED
C, F, X, T = RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT
CLIENT, WORKER, RUNTIME = Actor.CLIENT, Actor.WORKER, Actor.RUNTIME
TR = TerminalReason

#: Every legal transition. Anything not listed is refused with FAILED_PRECONDITION.
TRANSITIONS: tuple[Transition, ...] = (
    _t(Q, Trigger.ACQUIRE, R, {WORKER}, None, None, "AcquireRun hands the run to a worker"),
    _t(Q, Trigger.CANCEL, X, {CLIENT}, TR.CANCELLED_BY_USER, None, "CancelRun on a queued run"),
    _t(
        Q,
        Trigger.INTERRUPT,
        X,
        {RUNTIME},
        TR.INTERRUPTED_BY_NEW_RUN,
        None,
        "a new run in the thread with policy INTERRUPT",
    ),
    _t(Q, Trigger.PAUSE, P, {CLIENT}, None, None, "PauseRun on a queued run"),
    _t(Q, Trigger.TIME_OUT, T, {RUNTIME}, TR.DEADLINE_EXCEEDED, None, "deadline passed"),
    _t(
        R,
        Trigger.COMPLETE,
        C,
        {WORKER},
        TR.COMPLETED_BY_WORKER,
        "SUCCEEDED",
        "FinishAttempt(SUCCEEDED_COMPLETE_RUN), completion checks satisfied",
    ),
    _t(
        R,
        Trigger.FAIL_CHECKS,
        F,
        {WORKER},
        TR.COMPLETION_CHECKS_FAILED,
        "FAILED",
        "FinishAttempt(SUCCEEDED_COMPLETE_RUN), a completion check failed for good",
    ),
    _t(
        R,
        Trigger.FAIL,
        F,
        {WORKER},
        TR.WORKER_REPORTED_FAILURE,
        "FAILED",
        "FinishAttempt(FAILED_PERMANENT)",
    ),
    _t(
        R,
        Trigger.RETRY,
        Q,
        {WORKER, RUNTIME},
        None,
        "FAILED",
        "FinishAttempt(FAILED_RETRYABLE), or the attempt's steps failed too often in a row;"
        " attempts left",
    ),
    _t(
        R,
        Trigger.EXHAUST,
        F,
        {WORKER, RUNTIME},
        TR.ATTEMPTS_EXHAUSTED,
        "FAILED",
        "a retryable failure or a lost lease with no attempts left",
    ),
    _t(R, Trigger.LOSE, Q, {RUNTIME}, None, "LOST", "the lease expired; attempts left"),
    _t(
        R,
        Trigger.WAIT_APPROVAL,
        W,
        {WORKER},
        None,
        "ENDED_FOR_APPROVAL",
        "FinishAttempt(WAITING_APPROVAL) after an approval step",
    ),
    _t(
        R,
        Trigger.PAUSE,
        P,
        {WORKER, RUNTIME},
        None,
        "PAUSED",
        "pause acknowledged by the worker, or forced after the grace period",
    ),
    _t(
        R,
        Trigger.CANCEL,
        X,
        {WORKER, RUNTIME},
        TR.CANCELLED_BY_USER,
        "CANCELLED",
        "cancel acknowledged by the worker, or forced after the grace period",
    ),
    _t(
        R,
        Trigger.INTERRUPT,
        X,
        {WORKER, RUNTIME},
        TR.INTERRUPTED_BY_NEW_RUN,
        "CANCELLED",
        "interrupt acknowledged by the worker, or forced after the grace period",
    ),
    _t(R, Trigger.TIME_OUT, T, {RUNTIME}, TR.DEADLINE_EXCEEDED, "CANCELLED", "deadline passed"),
    _t(
        R,
        Trigger.BUDGET,
        F,
        {RUNTIME},
        TR.BUDGET_EXCEEDED,
        "FAILED",
        "a step would exceed a budget",
    ),
    _t(
        W,
        Trigger.RESOLVE_APPROVAL,
        Q,
        {CLIENT},
        None,
        None,
        "ResolveApproval; the next attempt resumes at the approval step",
    ),
    _t(W, Trigger.CANCEL, X, {CLIENT}, TR.CANCELLED_BY_USER, None, "CancelRun while waiting"),
    _t(
        W,
        Trigger.INTERRUPT,
        X,
        {RUNTIME},
        TR.INTERRUPTED_BY_NEW_RUN,
        None,
        "a new run in the thread with policy INTERRUPT",
    ),
    _t(W, Trigger.TIME_OUT, T, {RUNTIME}, TR.DEADLINE_EXCEEDED, None, "deadline passed"),
    _t(P, Trigger.RESUME, Q, {CLIENT}, None, None, "ResumeRun"),
    _t(P, Trigger.CANCEL, X, {CLIENT}, TR.CANCELLED_BY_USER, None, "CancelRun while paused"),
    _t(
        P,
        Trigger.INTERRUPT,
        X,
        {RUNTIME},
        TR.INTERRUPTED_BY_NEW_RUN,
        None,
        "a new run in the thread with policy INTERRUPT",
    ),
    _t(P, Trigger.TIME_OUT, T, {RUNTIME}, TR.DEADLINE_EXCEEDED, None, "deadline passed"),
)

_BY_KEY = {(t.source, t.trigger): t for t in TRANSITIONS}


def after_failed_attempt(attempt_count: int, max_attempts: int, *, lost: bool = False) -> Trigger:
    """What a running run's attempt that failed retryably (``lost``: whose lease expired)
    leads to: another attempt while the run has attempts left, else the run FAILED."""
    if attempt_count >= max_attempts:
        return Trigger.EXHAUST
    return Trigger.LOSE if lost else Trigger.RETRY


def require_live(current: RunStatus, refused: str, trigger: Trigger | None = None) -> None:
    """Refuse what an ended run cannot do (``refused``: what, in words: "it takes no more
    input") with the contract's one reason for it, ``RUN_ENDED`` ("an operation needs a
    non-terminal run"), metadata naming the status (and ``trigger``, for a transition)."""
    if not current.terminal:
        return
    metadata = {"current_status": current.value}
    if trigger is not None:
        metadata["trigger"] = trigger.value
    raise FailedPrecondition(
        f"run is {current.value} (it has ended): {refused}",
        reason=reasons.RUN_ENDED,
        metadata=metadata,
    )


def transition(current: RunStatus, trigger: Trigger, actor: Actor) -> Transition:
    """The transition ``trigger`` makes from ``current``.

    Raises:
        FailedPrecondition: the run has ended (reason ``RUN_ENDED``); the transition is not
            legal (reason ``ILLEGAL_TRANSITION``, metadata naming the current status and the
            trigger), or ``actor`` may not pull it.
    """
    require_live(current, f"{trigger.value.lower().replace('_', ' ')} is not possible", trigger)
    found = _BY_KEY.get((current, trigger))
    if found is None:
        raise FailedPrecondition(
            f"run is {current.value}: {trigger.value.lower().replace('_', ' ')} is not "
            "possible from this status",
            reason=reasons.ILLEGAL_TRANSITION,
            metadata={"current_status": current.value, "trigger": trigger.value},
        )
    if actor not in found.actors:
        raise FailedPrecondition(
            f"{trigger.value} from {current.value} is not the {actor.value}'s to make",
            reason=reasons.ILLEGAL_TRANSITION,
            metadata={"current_status": current.value, "trigger": trigger.value},
        )
    return found


class ClientAsk(StrEnum):
    """How a client's CancelRun, PauseRun or ResumeRun acts on a run (:func:`client_ask`)."""

    UNCHANGED = "UNCHANGED"  # the run already is, or is becoming, what was asked
    REQUEST = "REQUEST"  # a running run: the request is recorded; its worker (or the reaper
    # after the grace period) makes the transition (docs/lifecycle.md, section 4)
    WITHDRAW = "WITHDRAW"  # a resume while the pause is only requested: the request goes
    TRANSITION = "TRANSITION"  # the client's own transition, now (``transition`` may refuse)


def client_ask(
    current: RunStatus, trigger: Trigger, *, cancel_requested: bool, pause_requested: bool
) -> ClientAsk:
    """What a client's ``trigger`` (CANCEL, PAUSE or RESUME) does to a run in ``current``
    with the stop requests it holds. A client never moves a RUNNING run itself.

    Raises:
        FailedPrecondition: a pause of a run whose cancel is pending (ILLEGAL_TRANSITION).
    """
    running = current is RunStatus.RUNNING
    if trigger is Trigger.CANCEL:
        if current is RunStatus.CANCELLED or (running and cancel_requested):
            return ClientAsk.UNCHANGED  # cancelling a CANCELLED run returns it (contract)
        return ClientAsk.REQUEST if running else ClientAsk.TRANSITION
    if trigger is Trigger.PAUSE:
        if current is RunStatus.PAUSED or (running and pause_requested):
            return ClientAsk.UNCHANGED  # already paused, or pausing: asking again changes nothing
        if running and cancel_requested:
            raise FailedPrecondition(
                "run is RUNNING with a cancel pending: it cannot be paused",
                reason=reasons.ILLEGAL_TRANSITION,
                metadata={"current_status": current.value},
            )
        return ClientAsk.REQUEST if running else ClientAsk.TRANSITION
    if trigger is Trigger.RESUME and running and pause_requested:
        return ClientAsk.WITHDRAW  # not yet paused: withdrawing the request is the resume
    return ClientAsk.TRANSITION


def can(current: RunStatus, trigger: Trigger) -> bool:
    return (current, trigger) in _BY_KEY
