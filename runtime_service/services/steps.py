"""Steps: BeginStep and EndStep through the step engine, and the reads of steps.

The engine (``step_engine``) decides and records a step in one write transaction; this
service runs it in-process and settles what it answers, whether it ran here or in the step
writer process: the errors the engine's decisions carry are raised after their commit (a
denial the ledger keeps, say), and a budget found used up ends the run through the run
lifecycle.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_core import reasons
from agentrt_core.errors import Aborted, AgentrtError
from agentrt_core.resolution import BoundDefinition
from runtime_service import lifecycle
from runtime_service.fence import FenceClaim
from runtime_service.lifecycle import Actor, Trigger
from runtime_service.observations import StepRecorded
from runtime_service.records import Step
from runtime_service.services.bound import BoundAgents
from runtime_service.services.context import Runtime
from runtime_service.step_engine import Begun, BudgetStop, Ended, StepEngine
from runtime_service.step_rules import (
    StepEnd,
    StepRequest,
    budget_error,
    failed_step_limit_error,
)
from runtime_service.store import leases, step_reads, transitions
from runtime_service.store.fencing import fenced


class StepsService:
    def __init__(self, runtime: Runtime, bound: BoundAgents) -> None:
        self._rt = runtime
        self._bound = bound
        self._engine = StepEngine(self._definition_now)

    def _definition_now(self, digest: str) -> BoundDefinition:
        """A run's bound definition, for the engine (on the writer's thread)."""
        return self._bound.definition_now(self._rt.database, digest)

    async def definition(self, digest: str) -> BoundDefinition:
        cached = self._bound.cached(digest)
        if cached is None:
            cached = await self._rt.read(lambda session: self._bound.get(session, digest))
        return cached.definition

    async def begin_step(self, req: StepRequest) -> Begun:
        """BeginStep in this process (see :meth:`settle_begin` for what it raises)."""
        begun: Begun = await self._rt.write_raw(lambda tx: self._engine.begin(tx, req))
        return await self.settle_begin(begun)

    async def settle_begin(self, begun: Begun) -> Begun:
        """Raise the error a BeginStep answers (after what it recorded was committed); end the
        run first if its budget is used up."""
        if begun.step is not None and not begun.existing and self._rt.observer is not None:
            digest = begun.agent_digest
            agent_id = self._cached_agent_id(digest) or await self._agent_id(digest)
            self._observe(begun.step, agent_id, begun=True)
        if begun.budget_stop is not None:
            raise await self._stop_on_budget(begun.budget_stop)
        if begun.failed_steps_stop is not None:
            raise await self._stop_on_failed_steps(begun.failed_steps_stop)
        if begun.error is not None:
            raise begun.error
        return begun

    async def end_step(self, fence: FenceClaim, step_id: str, outcome: StepEnd) -> Step:
        """EndStep in this process: ``outcome`` as built, and so checked, by ``step_end``."""
        ended: Ended = await self._rt.write_raw(
            lambda tx: self._engine.end(tx, fence, step_id, outcome)
        )
        return await self.settle_end(ended)

    async def settle_end(self, ended: Ended) -> Step:
        if ended.error is not None:
            raise ended.error
        assert ended.step is not None
        if ended.agent_digest and self._rt.observer is not None:
            digest = ended.agent_digest
            agent_id = self._cached_agent_id(digest) or await self._agent_id(digest)
            self._observe(ended.step, agent_id, begun=False)
        return ended.step

    def _cached_agent_id(self, digest: str) -> str:
        """The agent id of a definition the cache holds ("" when it does not): the common
        case (the run's BeginStep needed it), answered without making a coroutine."""
        cached = self._bound.cached(digest)
        return cached.definition.agent_id if cached is not None else ""

    async def _agent_id(self, digest: str) -> str:
        return (await self.definition(digest)).agent_id

    def _observe(self, step: Step, agent_id: str, *, begun: bool) -> None:
        """Tell the observer about a step this call began or ended (committed, wherever it
        was written: both paths settle here, in the server). A step born ended (a denied tool
        call) is begun and ended at once."""
        assert self._rt.observer is not None
        self._rt.observer.observed([StepRecorded.of(agent_id, step, begun=begun)])

    async def _stop_on_budget(self, stop: BudgetStop) -> AgentrtError:
        """End the run FAILED (BUDGET_EXCEEDED) through the run lifecycle; return the error
        the BeginStep answers. The budget rule is asked again under the run's lock: what was
        read to decide may have changed since (an amended budget)."""

        def write(session: Session) -> AgentrtError:
            run, attempt = fenced(session, stop.fence)
            exceeded = budget_error(run, stop.estimated_tokens)
            if exceeded is None:
                return Aborted(
                    "the run's budget changed while the step was being begun: begin it again",
                    reason=reasons.BUDGET_CHANGED,
                )
            transitions.apply(
                session,
                run,
                Trigger.BUDGET,
                Actor.RUNTIME,
                utcnow(),
                attempt=attempt,
                message=exceeded.message,
                error_class="BUDGET_EXCEEDED",
                error_message=exceeded.message,
            )
            return exceeded

        error: AgentrtError = await self._rt.write(write)
        return error

    async def _stop_on_failed_steps(self, fence: FenceClaim) -> AgentrtError:
        """End the attempt FAILED (retryable: the run gets another attempt if it has one
        left) through the run lifecycle; return the error the BeginStep answers. The rule is
        asked again under the run's lock (a step of the attempt may have succeeded since)."""

        def write(session: Session) -> AgentrtError:
            run, attempt = fenced(session, fence)
            looping = failed_step_limit_error(attempt.failed_in_a_row)
            if looping is None:
                return Aborted(
                    "a step of the attempt succeeded while this one was being begun: begin it"
                    " again",
                    reason=reasons.ABORTED,
                )
            # The runtime ends the attempt for the worker: its fence must stop holding
            # although the run is queued again with the same current attempt.
            leases.bump_epoch(run)
            transitions.apply(
                session,
                run,
                lifecycle.after_failed_attempt(run.attempt_count, run.max_attempts),
                Actor.RUNTIME,
                utcnow(),
                attempt=attempt,
                message=looping.message,
                error_class="WORKER_ERROR",
                error_message=looping.message,
                retryable=True,
            )
            return looping

        error: AgentrtError = await self._rt.write(write)
        return error

    # -- reads -----------------------------------------------------------------------------

    async def list_steps(
        self, run_id: str, attempt_id: str, turn_id: str, page_size: int, page_token: str
    ) -> tuple[list[Step], str]:
        page = step_reads.steps_page(run_id, attempt_id, turn_id, page_size, page_token)
        return await self._rt.read(lambda session: step_reads.list_steps(session, page))

    async def get_step(self, step_id: str) -> Step:
        return await self._rt.read(lambda session: step_reads.get_step(session, step_id))
