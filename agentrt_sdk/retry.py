"""How a worker calls a failing model again: with backoff, and not for ever.

A provider that is down answers at once, so a worker that retries at once records a failed
step as fast as the network allows (issue 27: 2,508 in 44 s). :class:`ModelRetryPolicy`
spaces the retries of one call out with the SDK's one backoff rule
(:meth:`agentrt_sdk.transport.RetryPolicy.delay`: exponential, full jitter, capped, never
shorter than the provider's ``retry_after``) and gives up after ``per_call.attempts`` tries
of one call or ``maximum_retries_per_attempt`` retries in the whole attempt; the attempt then
fails with a :class:`RetriesExhausted` that says so.

The runtime has its own, higher bound for workers that do not back off
(``FAILED_STEP_LIMIT``, docs/lifecycle.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrt_sdk.models.base import ModelError
from agentrt_sdk.transport import RetryPolicy


def _per_call() -> RetryPolicy:
    # Up to 0.5, 1, 2, 4, 8 s before retries 1 to 5: a provider down for good costs the
    # attempt about 8 s on average, one that blinks costs a second.
    return RetryPolicy(attempts=6, initial_backoff=0.5, max_backoff=30.0)


@dataclass(frozen=True)
class ModelRetryPolicy:
    """When :meth:`Attempt.generate <agentrt_sdk.attempt.Attempt.generate>` tries a failed
    model call again, and when it gives up.

    Attributes:
        per_call: tries one model call gets (``attempts``, the first included; a fallback to
            another candidate is a try too, made at once) and the backoff before each retry
            of the same candidate.
        maximum_retries_per_attempt: retries all the model calls of one attempt get together.
    """

    per_call: RetryPolicy = field(default_factory=_per_call)
    maximum_retries_per_attempt: int = 20

    def __post_init__(self) -> None:
        if self.per_call.attempts < 1 or self.maximum_retries_per_attempt < 0:
            raise ValueError(
                "ModelRetryPolicy: per_call.attempts >= 1, maximum_retries_per_attempt >= 0"
            )

    def limit_reached(self, tries: int, retries_in_attempt: int) -> str:
        """Which limit a call that failed ``tries`` times, in an attempt that has made
        ``retries_in_attempt`` retries, has reached ("": none)."""
        if tries >= self.per_call.attempts:
            return f"per_call.attempts is {self.per_call.attempts}"
        if retries_in_attempt >= self.maximum_retries_per_attempt:
            return (
                f"maximum_retries_per_attempt is {self.maximum_retries_per_attempt}, all used"
                " in this attempt"
            )
        return ""


class RetriesExhausted(ModelError):
    """A model call failed and the worker's :class:`ModelRetryPolicy` allows no more tries:
    the attempt fails with this (retryable, so the run gets another attempt if it has one
    left, and with the last failure's error class)."""

    def __init__(self, last: ModelError, tries: int, seconds: float, limit: str) -> None:
        super().__init__(
            last.error_class,
            f"gave up on the model call after {tries} tries in {seconds:.1f} s (ModelRetryPolicy"
            f" {limit}); the last failed with {last.error_class_name}: {last.message}",
            retryable=True,
        )
        self.last = last
        self.tries = tries
