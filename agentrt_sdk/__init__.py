"""The agentrt Python SDK: a client for backends and operators, and a worker library.

- :class:`AgentrtClient` (asyncio) and :class:`Client` (synchronous facade): the registry,
  threads, runs, inputs, approvals, blobs, audit and watching.
- Errors are typed exceptions built from the ``google.rpc`` details (:mod:`agentrt_sdk.errors`).
- :class:`Worker` runs agent logic under leases (:mod:`agentrt_sdk.worker`).
- Model adapters: :mod:`agentrt_sdk.models`.
"""

from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.errors import (
    AbortedError,
    AgentrtError,
    AlreadyExistsError,
    BudgetExceededError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
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
from agentrt_sdk.sync import Client
from agentrt_sdk.transport import RetryPolicy

__all__ = [
    "AbortedError",
    "AgentrtClient",
    "AgentrtError",
    "AlreadyExistsError",
    "BudgetExceededError",
    "CancelledError",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ResourceExhaustedError",
    "RetryPolicy",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
]
