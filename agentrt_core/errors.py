"""Domain errors shared by the registry and the runtime.

Domain and storage code raise these; they never import gRPC. The transport maps each class to a
canonical status code with ``google.rpc`` details in exactly one place
(:mod:`agentrt_base.error_status`), so what a caller sees for a given failure is the same for
every RPC.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrt_core import reasons

#: The ``google.rpc.ErrorInfo.domain`` of every error agentrt reports.
ERROR_DOMAIN = "agentrt"


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request, named by its path (``definition.tools[2]``)."""

    field: str
    description: str


class AgentrtError(Exception):
    """Base of every error a caller can cause; carries an ``ErrorInfo`` reason and metadata."""

    #: Machine-readable reason (``google.rpc.ErrorInfo.reason``), UPPER_SNAKE_CASE.
    reason: str = reasons.ERROR

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole (the step writer process sends refusals to the server): the default
        # rebuilds from ``args`` alone, which subclasses with other constructors refuse.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[AgentrtError], args: tuple[Any, ...], state: dict[str, Any]) -> AgentrtError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InvalidArgument(AgentrtError):
    """The request is malformed; ``violations`` name each bad field (``BadRequest``)."""

    reason = reasons.INVALID_ARGUMENT

    def __init__(
        self,
        message: str,
        violations: Iterable[FieldViolation] = (),
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.violations: list[FieldViolation] = list(violations)

    @classmethod
    def for_field(cls, field_path: str, description: str) -> InvalidArgument:
        """Shorthand for the common case of one bad field."""
        return cls(f"{field_path}: {description}", [FieldViolation(field_path, description)])


class OutOfRange(InvalidArgument):
    """A position past the end of what exists now (a log index or size beyond the log's):
    well formed, and may be valid later (AIP-193: OUT_OF_RANGE, with BadRequest)."""

    reason = reasons.OUT_OF_RANGE

    def __init__(self, field_path: str, description: str) -> None:
        super().__init__(f"{field_path}: {description}", [FieldViolation(field_path, description)])


class NotFound(AgentrtError):
    """A named resource does not exist; ``resource_type``/``resource_name`` say which."""

    reason = reasons.NOT_FOUND

    def __init__(self, resource_type: str, resource_name: str, message: str | None = None) -> None:
        super().__init__(message or f"{resource_type} {resource_name!r} not found")
        self.resource_type = resource_type
        self.resource_name = resource_name


class AlreadyExists(AgentrtError):
    """Creating something whose identity is taken by different content."""

    reason = reasons.ALREADY_EXISTS

    def __init__(
        self,
        resource_type: str,
        resource_name: str,
        message: str | None = None,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            message or f"{resource_type} {resource_name!r} already exists",
            reason=reason,
            metadata=metadata,
        )
        self.resource_type = resource_type
        self.resource_name = resource_name


class FailedPrecondition(AgentrtError):
    """The system is not in the state the request needs (an illegal transition, say).

    ``violations`` are ``(type, subject, description)`` triples, sent as
    ``google.rpc.PreconditionFailure`` (e.g. one per missing completion check).
    """

    reason = reasons.FAILED_PRECONDITION

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        violations: Iterable[tuple[str, str, str]] = (),
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.violations: list[tuple[str, str, str]] = list(violations)


class Aborted(AgentrtError):
    """A concurrency conflict: a lost compare-and-swap or a stale lease fence."""

    reason = reasons.ABORTED


class LeaseLost(Aborted):
    """A worker wrote with a fence that is no longer current; nothing was changed."""

    reason = reasons.LEASE_LOST


class ResourceExhausted(AgentrtError):
    """A budget or a size limit would be exceeded, or a caller is over one of its limits.

    ``retry_delay`` (seconds), when known, is how long the caller should wait before trying
    again (sent as ``google.rpc.RetryInfo``): a rate limit knows when its next token comes; a
    budget that will never grow back leaves it None.
    """

    reason = reasons.RESOURCE_EXHAUSTED

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.retry_delay = retry_delay


class PermissionDenied(AgentrtError):
    """The caller (or the agent acting through a worker) may not do this."""

    reason = reasons.PERMISSION_DENIED


class Unauthenticated(AgentrtError):
    """The caller did not prove who it is."""

    reason = reasons.UNAUTHENTICATED


class Unavailable(AgentrtError):
    """The server cannot serve the call right now; the caller may retry it (idempotently)."""

    reason = reasons.UNAVAILABLE


class Unimplemented(AgentrtError):
    """The RPC exists in the contract but this server does not provide it yet."""

    reason = reasons.UNIMPLEMENTED


@dataclass
class ViolationCollector:
    """Gathers every field violation of a request before refusing it once, so a caller fixes
    all of them in one round trip instead of one per call."""

    violations: list[FieldViolation] = field(default_factory=list)

    def add(self, field_path: str, description: str) -> None:
        self.violations.append(FieldViolation(field_path, description))

    def raise_if_any(self, message: str = "invalid request") -> None:
        if self.violations:
            first = self.violations[0]
            summary = f"{message}: {first.field}: {first.description}"
            if len(self.violations) > 1:
                summary += f" (and {len(self.violations) - 1} more)"
            raise InvalidArgument(summary, self.violations)
