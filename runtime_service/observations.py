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
from typing import Final, Protocol

from sqlalchemy.orm import Session

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


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """A worker acquired a run: its attempt ``number`` began for ``reason``; for the first,
    ``waited`` is how long the run was queued (created → acquired)."""

    namespace: str
    agent_id: str
    reason: str
    number: int
    waited: dt.timedelta | None


@dataclass(frozen=True, slots=True)
class ReaperAction:
    """The reaper ended something itself: ``kind`` is ``deadline`` (a run past its
    deadline), ``stop_forced`` (a cancel or pause the worker did not acknowledge in time) or
    ``lease_expired`` (a worker that stopped heartbeating: its attempt is LOST)."""

    namespace: str
    agent_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class StepRecorded:
    """A step was begun (``begun``: recorded by BeginStep, or a checkpoint's by
    WriteCheckpoint) and/or ended (``ended``: by EndStep, an approval by its decision, or born
    ended, as a denied tool call and a checkpoint are), once: a repeated call with the same
    key is not observed again. For a MODEL_CALL, the model chosen and why
    (``candidate_reason``), and at its end the tokens and cost the worker reported."""

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


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    """A person decided an approval (``decision`` APPROVE or DENY) ``waited`` after the
    step asked for it."""

    namespace: str
    agent_id: str
    decision: str
    waited: dt.timedelta


Observation = RunMoved | AttemptStarted | ReaperAction | StepRecorded | ApprovalResolved


class Observer(Protocol):
    def observed(self, observations: Sequence[Observation]) -> None: ...


def observe(session: Session, observation: Observation) -> None:
    """Record ``observation`` in the caller's transaction, for after its commit."""
    observed = session.info.get(OBSERVED)
    if observed is not None:  # None: a transaction nobody will report (a test's, a script's)
        observed.append(observation)
