"""The fence rule: whether a worker's write still comes from the run's current lease.

Every write a worker makes carries a fence (attempt id, lease epoch). It counts only while
that attempt is the run's current one, at that epoch, with its lease unexpired; otherwise
the write bounces with LEASE_LOST and changes nothing. This is the one statement of the rule:
``store/fencing.fenced`` (the ORM writes) and ``step_rules`` (BeginStep, EndStep) both ask
it. Pure: it reads what was read, nothing else.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from agentrt_base.errors import AgentrtError, InvalidArgument, LeaseLost


class FenceView(Protocol):
    """What the rule reads of a run and the attempt a fence names."""

    @property
    def current_attempt_id(self) -> str: ...
    @property
    def lease_epoch(self) -> int: ...
    @property
    def lease_expire_time(self) -> dt.datetime: ...
    @property
    def attempt_status(self) -> str: ...
    @property
    def run_status(self) -> str: ...


def fence_error(
    attempt_id: str, lease_epoch: int, view: FenceView | None, now: dt.datetime
) -> AgentrtError | None:
    """The error a write with fence (``attempt_id``, ``lease_epoch``) gets, or None if it
    holds; ``view``: the run and attempt as read (None: no such attempt).

    INVALID_ARGUMENT for no fence; LEASE_LOST (ABORTED) for an unknown, ended, superseded or
    expired one.
    """
    if not attempt_id or lease_epoch <= 0:
        return InvalidArgument.for_field("fence", "required: attempt_id and lease_epoch")
    if view is None:
        return LeaseLost(f"attempt {attempt_id} does not exist", metadata={"attempt_status": ""})
    metadata = {"attempt_status": view.attempt_status, "run_status": view.run_status}
    if view.current_attempt_id != attempt_id or view.lease_epoch != lease_epoch:
        return LeaseLost(
            f"the lease of attempt {attempt_id} (epoch {lease_epoch}) is no longer held: "
            f"the attempt is {view.attempt_status}, the run is {view.run_status}",
            metadata=metadata,
        )
    if view.lease_expire_time < now:
        # Expired but not yet reaped: the run may be handed to another worker any moment,
        # so this worker's writes must already bounce.
        return LeaseLost(
            f"the lease of attempt {attempt_id} expired at {view.lease_expire_time}",
            metadata=metadata,
        )
    return None
