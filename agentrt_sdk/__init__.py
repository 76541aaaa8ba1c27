"""The agentrt Python SDK: a client for backends and operators, and a worker library.

- :class:`AgentrtClient` (asyncio) and :class:`Client` (synchronous facade): the registry,
  threads, runs, inputs, approvals, blobs, audit and watching.
- Errors are typed exceptions built from the ``google.rpc`` details (:mod:`agentrt_sdk.errors`).
- :class:`Worker` runs agent logic under leases (:mod:`agentrt_sdk.worker`), handing it an
  :class:`Attempt`; :class:`ModelRetryPolicy` says how it retries a failing model.
- Model adapters: :mod:`agentrt_sdk.models`.
"""

from agentrt_sdk.attempt import Attempt, AttemptStopped
from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.errors import (
    AbortedError,
    AgentrtError,
    AlreadyExistsError,
    BudgetExceededError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    FailedStepLimitError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from agentrt_sdk.retry import ModelRetryPolicy, RetriesExhausted
from agentrt_sdk.sync import Client
from agentrt_sdk.transport import RetryPolicy
from agentrt_sdk.worker import Result, Worker

__all__ = [
    "AbortedError",
    "AgentrtClient",
    "AgentrtError",
    "AlreadyExistsError",
    "Attempt",
    "AttemptStopped",
    "BudgetExceededError",
    "CancelledError",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FailedStepLimitError",
    "InternalError",
    "InvalidArgumentError",
    "LeaseLostError",
    "ModelRetryPolicy",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ResourceExhaustedError",
    "Result",
    "RetriesExhausted",
    "RetryPolicy",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "Worker",
]
