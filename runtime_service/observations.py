"""What the runtime did, told to whoever watches it (the metrics), once it is committed.

The places that change a run record what they did in the transaction's ``session.info``
(:func:`observe`): the one transition function (``store/transitions.apply``) every run move,
the start of an attempt, the reaper each action, a checkpoint, an approval's decision.
``Runtime.write`` hands the list to its :class:`Observer` after the commit and only then, so
a rolled-back transaction is never counted and a committed one always is (in the replica
that committed it). Steps written by the step path are told by ``services/steps.py`` when it
settles them, after their commit, in the server, wherever they were written. Observations
are plain values: the domain knows nothing of Prometheus.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

from sqlalchemy.orm import Session

from runtime_service.records import Attempt, Step

#: Where a transaction's observations wait for its commit.
OBSERVED: Final = "agentrt.observed"


@dataclass(frozen=True, slots=True)
class RunMoved:
    """A run changed status (``lifecycle``'s names); ``ended`` when it reached a terminal
    one, with how long it lived (created → ended)."""

    namespace: str
    agent_id: str
    previous: str
    status: str
    trigger: str
    ended: bool
    lifetime: dt.timedelta | None
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """A worker acquired a run: its attempt ``number`` began for ``reason``; for the first,
    ``waited`` is how long the run was queued (created → acquired). ``trace`` says what the
    attempt's and its steps' spans need to know of it."""

    namespace: str
    agent_id: str
    reason: str
    number: int
    waited: dt.timedelta | None
    trace: AttemptTrace | None = None


@dataclass(frozen=True, slots=True)
class AttemptTrace:
    """An attempt as its spans describe it (``runtime_service.ledger_spans``): its trace
    context and what its ``invoke_agent`` span and its steps' spans say of it."""

    attempt_id: str
    number: int
    traceparent: str
    #: The run's own ``traceparent``: the parent of the attempt's span ("" : it is a root).
    run_traceparent: str
    run_id: str
    thread_id: str
    namespace: str
    agent_id: str
    agent_version: str
    agent_digest: str


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """An attempt ended (``attempt``: its record, with its status, times and error), by its
    worker, by the reaper or by a takeover: once, in the transaction that ended it."""

    trace: AttemptTrace
    attempt: Attempt


@dataclass(frozen=True, slots=True)
class ReaperAction:
    """The reaper ended something itself: ``kind`` is ``deadline`` (a run past its
    deadline), ``stop_forced`` (a cancel or pause the worker did not acknowledge in time) or
    ``lease_expired`` (a worker that stopped heartbeating: its attempt is LOST)."""

    namespace: str
    agent_id: str
    kind: str


class StepRecorded(NamedTuple):
    """A step was begun (``begun``: recorded by BeginStep, or a checkpoint's by
    WriteCheckpoint) and/or ended (``ended``: by EndStep, an approval by its decision, or born
    ended, as a denied tool call and a checkpoint are), once: a repeated call with the same
    key is not observed again. For a MODEL_CALL, the model chosen and why
    (``candidate_reason``), and at its end the tokens and cost the worker reported.

    A named tuple, not a frozen dataclass like the others: the server makes one for every
    step it begins and every step it ends, on the event loop, and a frozen dataclass's
    ``__init__`` (a ``object.__setattr__`` a field) costs several times a tuple's."""

    agent_id: str
    type: str
    status: str
    begun: bool
    ended: bool
    candidate_reason: str = ""
    provider: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: The step as the ledger holds it once ``ended`` (its span is made from it).
    step: Step | None = None

    @classmethod
    def of(cls, agent_id: str, step: Step, *, begun: bool) -> StepRecorded:
        """The observation of ``step`` (of agent ``agent_id``): ``begun`` by this write, or
        ended by it (a step born ended is both)."""
        ended = not begun or step.end_time is not None
        return cls(
            agent_id,
            step.type,
            step.status,
            begun,
            ended,
            step.candidate_reason,
            step.provider,
            step.reported_model_id or step.requested_model_id,
            step.input_tokens,
            step.output_tokens,
            step.cost_usd,
            step if ended else None,
        )

    @classmethod
    def ended_step(cls, agent_id: str, step: Step) -> StepRecorded:
        """The observation of ``step`` ended by this write (begun by an earlier one)."""
        return cls.of(agent_id, step, begun=False)


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    """A person decided an approval (``decision`` APPROVE or DENY) ``waited`` after the
    step asked for it."""

    namespace: str
    agent_id: str
    decision: str
    waited: dt.timedelta


Observation = (
    RunMoved | AttemptStarted | AttemptEnded | ReaperAction | StepRecorded | ApprovalResolved
)


class Observer(Protocol):
    def observed(self, observations: Sequence[Observation]) -> None: ...


class Observers:
    """Several observers told in turn (the metrics, the spans)."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    def observed(self, observations: Sequence[Observation]) -> None:
        for observer in self._observers:
            observer.observed(observations)


def observe(session: Session, observation: Observation) -> None:
    """Record ``observation`` in the caller's transaction, for after its commit."""
    observed = session.info.get(OBSERVED)
    if observed is not None:  # None: a transaction nobody will report (a test's, a script's)
        observed.append(observation)
