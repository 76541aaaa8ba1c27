"""What the runtime did, told to whoever watches it (the metrics), once it is committed.

The places that change a run record what they did in the transaction's ``session.info``
(:func:`observe`): the one transition function (``store/transitions.apply``) every run move,
the start of an attempt, the reaper each action. ``Runtime.write`` hands the list to its
:class:`Observer` after the commit and only then, so a rolled-back transaction is never
counted and a committed one always is (in the replica that committed it). Observations are
plain values: the domain knows nothing of Prometheus.
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


Observation = RunMoved | AttemptStarted | ReaperAction


class Observer(Protocol):
    def observed(self, observations: Sequence[Observation]) -> None: ...


def observe(session: Session, observation: Observation) -> None:
    """Record ``observation`` in the caller's transaction, for after its commit."""
    observed = session.info.get(OBSERVED)
    if observed is not None:  # None: a transaction nobody will report (a test's, a script's)
        observed.append(observation)
