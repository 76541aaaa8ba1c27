"""The fence rule: whether a worker's write still comes from the run's current lease.

Every write a worker makes carries a fence (attempt id, lease epoch, lease token). It counts
only while that attempt is the run's current one, at that epoch, with its lease unexpired,
and presented with the secret token AcquireRun handed to that attempt's worker; otherwise the
write bounces with LEASE_LOST and changes nothing. The attempt id and the epoch are public
(ListAttempts and ``attempt.started`` show them); the token is what proves the write is the
worker's, so a wrong token is answered exactly as a stale fence is, telling a stranger
nothing. This is the one statement of the rule: ``store/fencing.fenced`` (the ORM writes)
and ``step_decide`` (BeginStep, EndStep) both ask it. Pure: it reads what was read, nothing
else.
"""

from __future__ import annotations

import datetime as dt
import hmac
import secrets
from dataclasses import dataclass
from typing import Protocol

from agentrt_base.auth import token_hash  # one way to keep a secret: its SHA-256
from agentrt_core.errors import AgentrtError, InvalidArgument, LeaseLost

#: Bytes of randomness in a lease token (256 bits; the issue asks for at least 128).
TOKEN_BYTES = 32


@dataclass(frozen=True, slots=True)
class FenceClaim:
    """The fence a write presents."""

    attempt_id: str
    lease_epoch: int
    lease_token: str = ""

    def __repr__(self) -> str:
        # Never the token (a claim may end up in a log line or a traceback).
        return f"FenceClaim({self.attempt_id!r}, {self.lease_epoch})"


def new_lease_token() -> tuple[str, str]:
    """A new attempt's lease token and the hash the server keeps of it."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    return token, token_hash(token)


def token_holds(claim: FenceClaim, stored_hash: str) -> bool:
    """Whether ``claim`` presents the token whose hash the attempt keeps (an attempt from
    before tokens keeps "", matched by no token only). ``compare_digest``: the comparison
    takes the same time wherever the two differ."""
    presented = token_hash(claim.lease_token) if claim.lease_token else ""
    return hmac.compare_digest(presented, stored_hash)


class FenceView(Protocol):
    """What the rule reads of a run and the attempt a fence names."""

    @property
    def current_attempt_id(self) -> str: ...
    @property
    def lease_epoch(self) -> int: ...
    @property
    def lease_expire_time(self) -> dt.datetime: ...
    @property
    def lease_token_hash(self) -> str: ...
    @property
    def attempt_status(self) -> str: ...
    @property
    def run_status(self) -> str: ...


def fence_error(claim: FenceClaim, view: FenceView | None, now: dt.datetime) -> AgentrtError | None:
    """The error a write presenting ``claim`` gets, or None if its fence holds; ``view``: the
    run and attempt as read (None: no such attempt).

    INVALID_ARGUMENT for no fence; LEASE_LOST (ABORTED) for an unknown, ended, superseded or
    expired one, or one whose token is not the attempt's.
    """
    attempt_id, lease_epoch = claim.attempt_id, claim.lease_epoch
    if not attempt_id or lease_epoch <= 0:
        return InvalidArgument.for_field("fence", "required: attempt_id and lease_epoch")
    if view is None:
        return LeaseLost(f"attempt {attempt_id} does not exist", metadata={"attempt_status": ""})
    metadata = {"attempt_status": view.attempt_status, "run_status": view.run_status}
    # A wrong token gets the stale fence's answer, word for word: whoever sent it learns
    # nothing a read would not tell them.
    if (
        view.current_attempt_id != attempt_id
        or view.lease_epoch != lease_epoch
        or not token_holds(claim, view.lease_token_hash)
    ):
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
