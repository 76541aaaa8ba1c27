"""Workers' side of the lifecycle: acquire under a lease, heartbeat, finish; and the reaper.

The fence is ``(attempt_id, lease_epoch, lease_token)`` (the rule: ``runtime_service.fence``).
A write is accepted only while the run's ``current_attempt_id`` and ``lease_epoch`` still
equal it and the token is the one AcquireRun handed out (checked under the run's row lock),
so a worker that lost its lease, whose attempt the runtime ended, or anyone who merely read
the attempt's id and epoch, changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy.orm import Session

from agentrt_base.access import Visibility
from agentrt_base.auth import caller_name
from agentrt_base.db import utcnow
from agentrt_base.db_failures import database_failure
from agentrt_core import reasons
from agentrt_core.completion import CheckResult, Outcome, evaluate
from agentrt_core.errors import FailedPrecondition, InvalidArgument
from runtime_service import lifecycle, notify
from runtime_service.fence import FenceClaim, new_lease_token, token_holds
from runtime_service.lifecycle import Actor, RunStatus, Trigger
from runtime_service.observations import ReaperAction, observe
from runtime_service.records import Attempt, Checkpoint, Run, attempt_of, checkpoint_of, run_of
from runtime_service.services.bound import BoundAgents
from runtime_service.services.context import Runtime
from runtime_service.store import attempts, blobs, leases, run_requests, transitions
from runtime_service.store import completion as completion_store
from runtime_service.store.fencing import fenced
from runtime_service.store.runs import active_attempt
from runtime_service.store.tables import AttemptRow, RunRow

log = logging.getLogger("agentrt.leases")

OUTCOMES = (
    "SUCCEEDED_COMPLETE_RUN",
    "FAILED_RETRYABLE",
    "FAILED_PERMANENT",
    "CANCELLED",
    "PAUSED",
    "WAITING_APPROVAL",
)


def _repeated_status(outcome: str) -> tuple[str, ...]:
    """The attempt statuses a FinishAttempt with ``outcome`` can have left behind (for
    recognising it repeated): a completion claim the completion checks refuted ended the
    attempt FAILED (and its run COMPLETION_CHECKS_FAILED: see ``finish``)."""
    if outcome == "SUCCEEDED_COMPLETE_RUN":
        return ("SUCCEEDED", "FAILED")
    return (_OUTCOME_STATUS[outcome],)


#: The attempt status each outcome leaves behind (for recognising a repeated FinishAttempt).
_OUTCOME_STATUS = {
    "SUCCEEDED_COMPLETE_RUN": "SUCCEEDED",
    "FAILED_RETRYABLE": "FAILED",
    "FAILED_PERMANENT": "FAILED",
    "CANCELLED": "CANCELLED",
    "PAUSED": "PAUSED",
    "WAITING_APPROVAL": "ENDED_FOR_APPROVAL",
}


@dataclass(frozen=True)
class Acquired:
    run: Run
    attempt: Attempt
    agent_json: bytes
    tool_names: list[str]
    skill_names: list[str]
    completion_checks: list[str]
    #: The checks among them the runtime evaluates itself.
    runtime_checks: list[str]
    #: The checkpoint the attempt resumes from (the run's latest), if any.
    checkpoint: Checkpoint | None = None
    #: The attempt's secret lease token, for the worker alone (kept nowhere but its hash).
    lease_token: str = field(default="", repr=False)


@dataclass(frozen=True)
class HeartbeatResult:
    lease_expire_time: dt.datetime
    cancel_requested: bool
    pause_requested: bool
    deadline_time: dt.datetime | None
    input_revision: int


class LeasesService:
    def __init__(self, runtime: Runtime, bound: BoundAgents) -> None:
        self._rt = runtime
        self._bound = bound

    def _ttl(self, requested: dt.timedelta | None) -> dt.timedelta:
        s = self._rt.settings
        if requested is None or requested <= dt.timedelta(0):
            return s.default_lease_ttl
        # Clamped to the server's bounds, as the contract says (AcquireRunRequest.lease_ttl).
        return min(max(requested, s.min_lease_ttl), s.max_lease_ttl)

    async def acquire(
        self,
        worker_id: str,
        agent_ids: list[str],
        labels: dict[str, str],
        lease_ttl: dt.timedelta | None,
        wait: dt.timedelta | None,
        visible: Visibility,
    ) -> Acquired | None:
        """Hand the highest-priority, oldest eligible run ``visible`` admits (the worker's
        namespaces and agent scopes) to ``worker_id``, waiting up to ``wait`` for one to
        appear; None if none did."""
        if not worker_id or len(worker_id) > 200:
            raise InvalidArgument.for_field("worker_id", "required, at most 200 characters")
        ttl = self._ttl(lease_ttl)
        s = self._rt.settings
        if wait is None or wait < dt.timedelta(0):
            wait = s.default_wait
        wait = min(wait, s.max_wait)
        # The attempt's worker is the call's principal; worker_id is only its label.
        principal = caller_name()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait.total_seconds()
        while True:
            # Subscribe before looking, so a run queued between the look and the sleep wakes us.
            with self._rt.notifier.subscribe([notify.WORK]) as woken:
                acquired = await self._rt.write(
                    lambda session: self._try_acquire(
                        session, worker_id, principal, agent_ids, labels, visible, ttl
                    )
                )
                if acquired is not None:
                    return acquired
                remaining = deadline - loop.time()
                if remaining <= 0 or not await self._rt.notifier.sleep(woken, remaining):
                    return None

    def _try_acquire(
        self,
        session: Session,
        worker_id: str,
        principal: str,
        agent_ids: list[str],
        labels: dict[str, str],
        visible: Visibility,
        ttl: dt.timedelta,
    ) -> Acquired | None:
        run = leases.lock_next_queued(session, agent_ids, labels, visible, utcnow())
        if run is None:
            return None
        # Fix: stamp the attempt after the look-up, not before it: a run released by another
        # run's end (ENQUEUE) must not appear to start before that run ended.
        now = utcnow()
        token, stored_hash = new_lease_token()
        attempt = attempts.start(
            session, run, worker_id, principal, ttl, now, stored_hash, start_trace=self._rt.traces
        )
        transitions.apply(
            session,
            run,
            Trigger.ACQUIRE,
            Actor.WORKER,
            now,
            message=f"acquired by {worker_id}",
            principal=principal,
        )
        attempts.record_started(session, run, attempt, now)
        # Other acquirers may have skipped the rows this transaction locked and gone to
        # sleep; wake them after commit so they look again at what is still queued.
        notify.wake(session, notify.WORK)
        bound = self._bound.get(session, run.agent_digest)
        checkpoint = attempts.resume_checkpoint(session, run)
        return Acquired(
            run_of(run),
            attempt_of(attempt),
            bound.json,
            bound.tool_names,
            bound.skill_names,
            bound.definition.completion_checks,
            bound.definition.runtime_checks,
            checkpoint_of(checkpoint) if checkpoint is not None else None,
            token,
        )

    async def heartbeat(self, fence: FenceClaim) -> HeartbeatResult:
        def write(session: Session) -> HeartbeatResult:
            run, attempt = fenced(session, fence)
            return HeartbeatResult(
                leases.renew(attempt, utcnow()),
                run.cancel_requested,
                run.pause_requested,
                run.deadline_time,
                run.input_revision,
            )

        return await self._rt.write(write)

    async def finish(
        self,
        fence: FenceClaim,
        outcome: str,
        *,
        error_class: str = "",
        error_message: str = "",
        result_summary: str = "",
        output_ref: str = "",
    ) -> tuple[Run, Attempt]:
        if outcome not in OUTCOMES:
            raise InvalidArgument.for_field("outcome", "required: one of " + ", ".join(OUTCOMES))
        if len(result_summary.encode()) > 64 * 1024:
            raise InvalidArgument.for_field("result_summary", "larger than 65536 bytes")
        principal = caller_name()

        def write(session: Session) -> tuple[RunRow, AttemptRow]:
            attempt = attempts.get(session, fence.attempt_id)
            if (
                attempt is not None
                and attempt.lease_epoch == fence.lease_epoch
                # (Its worker's only: the attempt id and epoch are public.)
                and token_holds(fence, attempt.lease_token_hash)
                and attempt.status in _repeated_status(outcome)
                and attempt.end_time is not None
                # Fix: only *this* request again. An attempt the runtime ended (a stop forced
                # after the grace period, a deadline) has the runtime's error, not the worker's,
                # so the worker's late FinishAttempt bounces with LEASE_LOST; so does
                # FAILED_PERMANENT after FAILED_RETRYABLE (both leave status FAILED).
                and (attempt.error_class, attempt.error_message) == (error_class, error_message)
                and (attempt.result_summary, attempt.output_ref) == (result_summary, output_ref)
                # retryable is always stored, so it tells FAILED_RETRYABLE from FAILED_PERMANENT
                and attempt.retryable == (outcome == "FAILED_RETRYABLE")
            ):
                # The same FinishAttempt again (a retry after a lost response): same answer.
                run = attempts.run_of(session, attempt)
                if (
                    attempt.status != "FAILED"
                    or outcome != "SUCCEEDED_COMPLETE_RUN"
                    or (run.terminal_reason == "COMPLETION_CHECKS_FAILED")
                ):
                    return run, attempt
            run, attempt = fenced(session, fence)
            if output_ref:
                # Fix (issue 25): the result was stored unchecked, so a worker could make a
                # run's output (and its hash-chained run.ended) a blob only another namespace
                # holds, or no blob at all. The same rule as every other blob reference.
                blobs.require(session, run.namespace, output_ref, "output_ref")
            now = utcnow()
            checks: list[CheckResult] = []
            if outcome == "SUCCEEDED_COMPLETE_RUN":
                trigger, checks = self._check_complete(session, run, attempt)
            else:
                trigger = self._trigger_for(session, run, attempt, outcome)
            attempts.record_result(
                run, attempt, result_summary, output_ref, completes_run=trigger is Trigger.COMPLETE
            )
            stops = trigger in (Trigger.CANCEL, Trigger.INTERRUPT, Trigger.PAUSE)
            failed_on_stop = outcome.startswith("FAILED") and stops
            message = error_message or result_summary
            if stops:
                # The run stops because it was asked to: the asker's reason says why (the
                # worker's own words stay on the attempt).
                message = run_requests.stop_reason_given(session, run) or message
            elif trigger is Trigger.FAIL_CHECKS:
                # The worker's claim stands refuted by the ledger: the run's message says
                # why (each failed check's detail); the attempt keeps no error of the
                # worker's, so a repeated claim is recognised as the same request.
                message = "completion checks failed: " + "; ".join(
                    f"{r.check.name} ({r.detail})" for r in checks if r.outcome is Outcome.FAILED
                )
            transitions.apply(
                session,
                run,
                trigger,
                Actor.WORKER,
                now,
                attempt=attempt,
                attempt_status="FAILED" if failed_on_stop else None,
                message=message,
                error_class=error_class,
                error_message=error_message,
                retryable=outcome == "FAILED_RETRYABLE",
                principal=principal,
                completion_checks=checks,
            )
            return run, attempt

        run, attempt = await self._rt.write(write)
        return run_of(run), attempt_of(attempt)

    def _trigger_for(
        self, session: Session, run: RunRow, attempt: AttemptRow, outcome: str
    ) -> Trigger:
        """The transition a FinishAttempt other than SUCCEEDED_COMPLETE_RUN makes."""
        if outcome == "FAILED_RETRYABLE" and (run.cancel_requested or run.pause_requested):
            # The run was asked to stop: a retryable failure on the way out must not re-queue
            # it (that would undo the cancel); it stops as asked, the attempt FAILED. (A
            # permanent failure stands as reported: the run FAILED.)
            if run.pause_requested:
                return Trigger.PAUSE
            if run.stop_reason == "INTERRUPTED_BY_NEW_RUN":
                return Trigger.INTERRUPT
            return Trigger.CANCEL
        if outcome == "FAILED_PERMANENT":
            return Trigger.FAIL
        if outcome == "FAILED_RETRYABLE":
            return lifecycle.after_failed_attempt(run.attempt_count, run.max_attempts)
        if outcome == "CANCELLED":
            if not run.cancel_requested:
                raise FailedPrecondition(
                    "no cancel was requested for this run", reason=reasons.NO_STOP_REQUESTED
                )
            return (
                Trigger.INTERRUPT if run.stop_reason == "INTERRUPTED_BY_NEW_RUN" else Trigger.CANCEL
            )
        if outcome == "PAUSED":
            if not run.pause_requested:
                raise FailedPrecondition(
                    "no pause was requested for this run", reason=reasons.NO_STOP_REQUESTED
                )
            return Trigger.PAUSE
        if not attempts.approvals_waiting(session, attempt.id):
            raise FailedPrecondition(
                "the attempt has no approval step waiting for a decision",
                reason=reasons.NO_APPROVAL_PENDING,
            )
        return Trigger.WAIT_APPROVAL

    def _check_complete(
        self, session: Session, run: RunRow, attempt: AttemptRow
    ) -> tuple[Trigger, list[CheckResult]]:
        """A completion claim: refused while steps are open or inputs undelivered; then every
        check of the completion policy is decided from the ledger (``completion``): all
        passed, the run completes; one failed for good, it fails (COMPLETION_CHECKS_FAILED);
        else the claim is refused (COMPLETION_CHECKS_MISSING), changing nothing."""
        open_steps = attempts.open_steps(session, attempt.id)
        if open_steps:
            raise FailedPrecondition(
                f"{open_steps} step(s) are still STARTED: end them first", reason=reasons.STEPS_OPEN
            )
        pending = attempts.pending_inputs(session, run.id)
        if pending:
            raise FailedPrecondition(
                f"{pending} input(s) were sent and not yet delivered: begin a turn to read them",
                reason=reasons.INPUTS_PENDING,
            )
        checks = self._bound.get(session, run.agent_digest).definition.completion
        results = evaluate(checks, completion_store.read_facts(session, run.id, checks))
        if any(r.outcome is Outcome.FAILED for r in results):
            return Trigger.FAIL_CHECKS, results
        missing = [r for r in results if r.outcome is Outcome.MISSING]
        if missing:
            names = [r.check.name for r in missing]
            raise FailedPrecondition(
                "the completion policy's checks have not all passed; missing: " + ", ".join(names),
                reason=reasons.COMPLETION_CHECKS_MISSING,
                metadata={"missing_checks": ",".join(names)},
                violations=[
                    ("COMPLETION_CHECK", r.check.name, f"not attested: {r.detail}") for r in missing
                ],
            )
        return Trigger.COMPLETE, results

    # -- the reaper --------------------------------------------------------------------------

    async def reap_once(self) -> int:
        """End expired leases, overdue cancels/pauses and runs past their deadline.

        Safe in every replica at once: each run is handled in its own short transaction
        under its row lock, re-checked after locking, and skipped if another replica holds it.
        """
        now = utcnow()
        due = await self._rt.read(lambda session: leases.due_runs(session, now))
        for run_id in due:
            await self._rt.write(partial(self._reap, run_id=run_id))
        return len(due)

    def _reap(self, session: Session, *, run_id: str) -> None:
        run = leases.lock_unless_held(session, run_id)
        if run is None:
            return  # another replica is on it
        now = utcnow()
        status = RunStatus(run.status)
        if status.terminal:
            return
        attempt = active_attempt(session, run)
        if run.deadline_time is not None and run.deadline_time < now:
            self._bump(run, attempt)
            observe(session, ReaperAction(run.namespace, run.agent_id, "deadline"))
            transitions.apply(
                session,
                run,
                Trigger.TIME_OUT,
                Actor.RUNTIME,
                now,
                attempt=attempt if status is RunStatus.RUNNING else None,
                message="deadline_time passed",
                error_class="CANCELLED",
                error_message="the run's deadline passed",
            )
            return
        if status is not RunStatus.RUNNING or attempt is None:
            return
        stop_requested = run.cancel_requested or run.pause_requested
        lease_expired = attempt.lease_expire_time < now
        stop_overdue = run.stop_deadline_time is not None and run.stop_deadline_time < now
        if stop_requested and (lease_expired or stop_overdue):
            # A run asked to stop ends as asked even when its worker vanished: re-queueing a
            # cancelled run because its lease ran out would undo the cancel.
            self._bump(run, attempt)
            observe(session, ReaperAction(run.namespace, run.agent_id, "stop_forced"))
            if run.pause_requested:
                trigger = Trigger.PAUSE
            elif run.stop_reason == "INTERRUPTED_BY_NEW_RUN":
                trigger = Trigger.INTERRUPT
            else:
                trigger = Trigger.CANCEL
            # Say which happened: the worker may still have been heartbeating past the grace
            # period, or its lease may simply have run out first.
            why = (
                "the worker did not stop within the grace period"
                if stop_overdue
                else "the worker's lease expired before it stopped"
            )
            transitions.apply(
                session,
                run,
                trigger,
                Actor.RUNTIME,
                now,
                attempt=attempt,
                message=run_requests.stop_reason_given(session, run) or why,
                error_class="CANCELLED",
                error_message=f"stopped by the runtime: {why}",
            )
            return
        if lease_expired:
            self._bump(run, attempt)
            observe(session, ReaperAction(run.namespace, run.agent_id, "lease_expired"))
            trigger = lifecycle.after_failed_attempt(run.attempt_count, run.max_attempts, lost=True)
            transitions.apply(
                session,
                run,
                trigger,
                Actor.RUNTIME,
                now,
                attempt=attempt,
                message="the worker's lease expired",
                attempt_status="LOST",
                error_class="LEASE_LOST",
                error_message="lease expired",
            )

    @staticmethod
    def _bump(run: RunRow, attempt: AttemptRow | None) -> None:
        # Ending an attempt for the worker: bump the epoch so its late writes bounce even if
        # they carry the right attempt id.
        if attempt is not None:
            leases.bump_epoch(run)

    async def run_reaper(self, stop: asyncio.Event) -> None:
        """Reap every ``reaper_interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.reap_once()
            except Exception as exc:
                if database_failure(exc) is not None:
                    # The database is down, full, frozen: health says so; one line is enough.
                    first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
                    log.warning("reaper pass failed (%s); retrying", first_line)
                else:
                    log.exception("reaper pass failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._rt.settings.reaper_interval)
