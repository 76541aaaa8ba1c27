"""The step path: request -> read -> decide -> apply -> answer, for BeginStep and EndStep.

One engine, whoever runs it: the server (``services/steps.py``, on a write transaction of
its own) and the step writer process (``step_writer``, in its batches) call
:meth:`StepEngine.begin` and :meth:`StepEngine.end`, which read the views
(``store/step_states.py``), ask the rules (``step_decide``) and apply the decision
(``store/steps.py``). What differs between them is only where the views come from.

A decision that ends the run or the attempt (:class:`~runtime_service.step_rules.StopOnBudget`,
:class:`~runtime_service.step_rules.StopOnFailedSteps`) writes no step: the answer carries it
(:attr:`Begun.budget_stop`, :attr:`Begun.failed_steps_stop`) and the server applies it
through the run lifecycle (``store/transitions.apply``, the one place runs change status),
in a transaction that asks the rule again under the run's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrt_base.db import utcnow
from agentrt_base.raw import RawTx
from agentrt_core.errors import AgentrtError
from agentrt_core.ids import new_id
from agentrt_core.resolution import BoundDefinition
from runtime_service.fence import FenceClaim
from runtime_service.records import Input, Step
from runtime_service.step_decide import decide_begin, decide_end
from runtime_service.step_rules import (
    End,
    Record,
    Refuse,
    Reuse,
    StepEnd,
    StepRequest,
    StopOnBudget,
    StopOnFailedSteps,
    Unchanged,
    check_step_request,
)
from runtime_service.store import steps as store
from runtime_service.store.step_states import StepStates
from runtime_service.store.steps import NeedsRead


@dataclass(slots=True)
class BudgetStop:
    """A BeginStep found the run's budget used up: the run is to end FAILED."""

    fence: FenceClaim
    estimated_tokens: int


@dataclass(slots=True)
class Begun:
    """What a BeginStep answers: the step (new, or ``existing`` for a repeated key), the
    steers it consumed and the run's agent; or ``error`` (after anything it recorded)."""

    step: Step | None = None
    existing: bool = False
    steers: list[Input] = field(default_factory=list)
    agent_digest: str = ""
    error: AgentrtError | None = None
    budget_stop: BudgetStop | None = None
    #: The attempt's steps failed too often in a row: it is to end FAILED.
    failed_steps_stop: FenceClaim | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt by its constructor: a slots dataclass's own pickling sets each field
        # through a Python loop, and the server loads one of these per BeginStep.
        fields = (self.step, self.existing, self.steers, self.agent_digest, self.error)
        return (Begun, (*fields, self.budget_stop, self.failed_steps_stop))


@dataclass(slots=True)
class Ended:
    """What an EndStep answers: the step, or ``error``. ``agent_digest`` (the run's agent) is
    set only when this call ended the step, not for a repeated EndStep answered unchanged:
    what the metrics count once."""

    step: Step | None = None
    error: AgentrtError | None = None
    agent_digest: str = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ended, (self.step, self.error, self.agent_digest))  # (as Begun's)


class StepEngine:
    """BeginStep and EndStep on a write transaction. ``definition`` finds a run's bound
    definition by agent digest; ``states`` gives the views (fresh reads by default)."""

    def __init__(
        self,
        definition: Callable[[str], BoundDefinition],
        states: StepStates | None = None,
    ) -> None:
        self._definition = definition
        self.states = states if states is not None else StepStates()

    def begin(self, tx: RawTx, req: StepRequest) -> Begun:
        """Raises :class:`NeedsRead` (having written nothing) when ``tx`` defers its writes
        and the call needs a read it cannot make."""
        try:
            check_step_request(req)
        except AgentrtError as error:
            return Begun(error=error)
        view = self.states.begin(tx, req)
        if view is None:
            raise NeedsRead(req.attempt_id)
        run = view.run
        bound = self._definition(run.agent_digest) if run is not None else None
        decision = decide_begin(view, bound, req, utcnow(), new_id("stp"))
        if isinstance(decision, Refuse):
            return Begun(error=decision.error)
        assert run is not None  # (decided on a run)
        if isinstance(decision, StopOnBudget):
            return Begun(
                error=decision.error,
                budget_stop=BudgetStop(req.fence, req.estimate),
            )
        if isinstance(decision, StopOnFailedSteps):
            return Begun(error=decision.error, failed_steps_stop=req.fence)
        if isinstance(decision, Reuse):
            step, steers = store.load_reused(tx, decision.step_id, decision.with_steers, view.keyed)
            return Begun(step, True, steers, run.agent_digest)
        assert isinstance(decision, Record)
        steers = store.apply_record(tx, run, decision)
        self.states.wrote(run, decision.step)
        return Begun(decision.step, False, steers, run.agent_digest, decision.error)

    def end(self, tx: RawTx, fence: FenceClaim, step_id: str, outcome: StepEnd) -> Ended:
        view = self.states.end(tx, fence.attempt_id, step_id, outcome.output_ref)
        if view is None:
            raise NeedsRead(fence.attempt_id)
        decision = decide_end(view, fence, step_id, outcome, utcnow())
        if isinstance(decision, Refuse):
            return Ended(error=decision.error)
        if isinstance(decision, Unchanged):
            return Ended(decision.step)
        assert isinstance(decision, End) and view.run is not None
        store.apply_end(tx, view.run, decision)
        self.states.wrote(view.run, decision.step)
        return Ended(decision.step, agent_digest=view.run.agent_digest)
