"""Typed exceptions built from the ``google.rpc`` details agentrt sends with every error.

Every refused call comes back as a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer: an ``ErrorInfo`` (domain ``agentrt``, a ``reason`` from the server's reason registry,
metadata), and where they apply ``BadRequest``, ``PreconditionFailure``, ``ResourceInfo`` and
``RetryInfo`` (docs/api.md, "Errors"). :func:`from_rpc_error` turns that into one exception
class per status code, and a narrower one where a reason asks for its own handling
(:class:`LeaseLostError`, :class:`BudgetExceededError`) — the way Temporal's clients turn
failure details back into typed exceptions, so callers write ``except LeaseLostError`` rather
than compare strings.

The mapping from (code, reason) to class is :data:`_BY_REASON` and :data:`_BY_CODE`, here
and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

__all__ = [
    "AbortedError",
    "AgentrtError",
    "AlreadyExistsError",
    "BudgetExceededError",
    "CancelledError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FailedStepLimitError",
    "FieldViolation",
    "InternalError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "PreconditionViolation",
    "RateLimitedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "from_rpc_error",
]

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    """One ``BadRequest.FieldViolation``: the request field (a dotted path) and what is wrong."""

    field: str
    description: str


@dataclass(frozen=True)
class PreconditionViolation:
    """One ``PreconditionFailure.Violation``."""

    type: str
    subject: str
    description: str


@dataclass(frozen=True)
class ErrorDetails:
    """What the server said about an error, decoded from its ``google.rpc.Status``."""

    reason: str = ""
    domain: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: Sequence[FieldViolation] = ()
    precondition_violations: Sequence[PreconditionViolation] = ()
    resource_type: str = ""
    resource_name: str = ""
    retry_delay: float | None = None


class AgentrtError(Exception):
    """A call agentrt refused or could not serve.

    Attributes:
        code: the gRPC status code.
        message: the status message (one line, for humans).
        reason: ``ErrorInfo.reason`` (``LEASE_LOST``, ``NOT_IN_DEFINITION`` ...); the status
            code's name when the server sent no ErrorInfo (e.g. a transport failure).
        metadata: ``ErrorInfo.metadata``.
        details: everything decoded from the status details.
        method: the RPC's full name, when known.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        details: ErrorDetails | None = None,
        method: str = "",
    ) -> None:
        self.code = code
        self.message = message
        self.details = details or ErrorDetails()
        self.reason = self.details.reason or code.name
        self.metadata: Mapping[str, str] = self.details.metadata
        self.method = method
        super().__init__(f"{code.name}: {message}{self._reason_suffix()}")

    def _reason_suffix(self) -> str:
        """`` [REASON]`` when the server's ``ErrorInfo.reason`` says more than the status
        code; nothing when it is the code again (a plain NOT_FOUND's reason is NOT_FOUND)."""
        reason = self.details.reason
        return f" [{reason}]" if reason and reason != self.code.name else ""

    def line(self) -> str:
        """``CODE: message [REASON]`` on one line, as the ``agentrt`` command reports it: the
        message's line breaks become spaces, and the reason is shown only when it is not the
        code again."""
        return f"{self.code.name}: {' '.join(self.message.split())}{self._reason_suffix()}"

    @property
    def field_violations(self) -> Sequence[FieldViolation]:
        return self.details.field_violations

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed if sent again later (with the same request id)."""
        return False


class InvalidArgumentError(AgentrtError):
    """INVALID_ARGUMENT: the request is malformed; :attr:`field_violations` say where."""


class NotFoundError(AgentrtError):
    """NOT_FOUND: ``resource_type`` / ``resource_name`` name what does not exist."""

    @property
    def resource_type(self) -> str:
        return self.details.resource_type

    @property
    def resource_name(self) -> str:
        return self.details.resource_name


class AlreadyExistsError(AgentrtError):
    """ALREADY_EXISTS: e.g. a version label already published with other content;
    :attr:`existing_digest` is the digest that holds it."""

    @property
    def existing_digest(self) -> str:
        return self.metadata.get("existing_digest", "")


class FailedPreconditionError(AgentrtError):
    """FAILED_PRECONDITION: the state does not allow the call (``reason`` says which rule)."""

    @property
    def precondition_violations(self) -> Sequence[PreconditionViolation]:
        return self.details.precondition_violations


class AbortedError(AgentrtError):
    """ABORTED: a concurrency conflict (a lost compare-and-swap); read again and retry."""


class LeaseLostError(AbortedError):
    """ABORTED with reason ``LEASE_LOST``: the attempt's fence is no longer valid. The call
    changed nothing; the worker must stop working on the run."""

    @property
    def attempt_status(self) -> str:
        return self.metadata.get("attempt_status", "")

    @property
    def run_status(self) -> str:
        return self.metadata.get("run_status", "")


class ResourceExhaustedError(AgentrtError):
    """RESOURCE_EXHAUSTED: a budget, quota or rate limit."""

    @property
    def retry_delay(self) -> float | None:
        return self.details.retry_delay


class BudgetExceededError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED with reason ``BUDGET_EXCEEDED``: the run's budget is spent and the
    run has ended FAILED; :attr:`budget` names the budget (metadata ``budget``)."""

    @property
    def budget(self) -> str:
        return self.metadata.get("budget", "")


class FailedStepLimitError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED with reason ``FAILED_STEP_LIMIT``: the attempt's last steps all
    failed, up to the runtime's limit, and the runtime has ended the attempt (the run is
    retried if it has attempts left). The worker stops working on it without another write."""


class RateLimitedError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED because the caller is over its call rate (``RATE_LIMITED``) or holds
    its limit of watches or long polls; :attr:`retry_delay` says when to come back."""

    @property
    def retryable(self) -> bool:
        return True


class PermissionDeniedError(AgentrtError):
    """PERMISSION_DENIED: the caller's role or scope (``ROLE_MISSING``, ``OUTSIDE_SCOPE``), or
    the agent's definition or policy (``NOT_IN_DEFINITION``, ``TOOL_DENIED``), does not allow it."""


class UnauthenticatedError(AgentrtError):
    """UNAUTHENTICATED: no credentials, or credentials the server does not accept."""


class UnavailableError(AgentrtError):
    """UNAVAILABLE: the server could not serve the call now; a retry with the same request id
    is safe (the client retries these itself, with backoff, before raising)."""

    @property
    def retryable(self) -> bool:
        return True


class DeadlineExceededError(AgentrtError):
    """DEADLINE_EXCEEDED: the call's deadline passed before an answer."""


class CancelledError(AgentrtError):
    """CANCELLED: the call was cancelled (by this process, or the connection closed)."""


class UnimplementedError(AgentrtError):
    """UNIMPLEMENTED: the server does not provide this RPC (an older server?)."""


class InternalError(AgentrtError):
    """INTERNAL or UNKNOWN: a bug in the server; metadata ``error_id`` is in its log."""


_BY_REASON: dict[tuple[grpc.StatusCode, str], type[AgentrtError]] = {
    (grpc.StatusCode.ABORTED, "LEASE_LOST"): LeaseLostError,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "BUDGET_EXCEEDED"): BudgetExceededError,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "FAILED_STEP_LIMIT"): FailedStepLimitError,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED"): RateLimitedError,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_WATCHES"): RateLimitedError,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_LONG_POLLS"): RateLimitedError,
}

_BY_CODE: dict[grpc.StatusCode, type[AgentrtError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
}


def decode_status(trailing_metadata: Sequence[tuple[str, Any]] | None) -> ErrorDetails | None:
    """The details of a ``google.rpc.Status`` trailer; None when the call carried none (an
    error raised by the transport rather than by agentrt)."""
    raw = next((v for k, v in trailing_metadata or () if k == _STATUS_DETAILS_KEY), None)
    if not isinstance(raw, bytes):
        return None
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except Exception:  # a trailer we cannot read is reported as no details, not a crash
        return None
    reason, domain, metadata = "", "", {}
    fields: list[FieldViolation] = []
    preconditions: list[PreconditionViolation] = []
    resource_type = resource_name = ""
    retry_delay: float | None = None
    for any_detail in status.details:
        if any_detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif any_detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_detail.Unpack(bad)
            fields += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif any_detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            any_detail.Unpack(failure)
            preconditions += [
                PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations
            ]
        elif any_detail.Is(error_details_pb2.ResourceInfo.DESCRIPTOR):
            resource = error_details_pb2.ResourceInfo()
            any_detail.Unpack(resource)
            resource_type, resource_name = resource.resource_type, resource.resource_name
        elif any_detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            any_detail.Unpack(retry)
            retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
    return ErrorDetails(
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(fields),
        precondition_violations=tuple(preconditions),
        resource_type=resource_type,
        resource_name=resource_name,
        retry_delay=retry_delay,
    )


def from_rpc_error(error: grpc.RpcError, method: str = "", note: str = "") -> AgentrtError:
    """The typed exception for a failed call (``grpc.aio.AioRpcError`` or a sync call's error);
    ``note``, when given, is added to its message (what the client found out about the
    failure, such as a TLS server called in plaintext)."""
    code_of = getattr(error, "code", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details_of = getattr(error, "details", None)
    message = (details_of() if callable(details_of) else None) or str(error)
    if note:
        message = f"{message}; {note}"
    trailers_of = getattr(error, "trailing_metadata", None)
    trailers = trailers_of() if callable(trailers_of) else None
    details = decode_status(trailers)
    reason = details.reason if details else ""
    cls = _BY_REASON.get((code, reason)) or _BY_CODE.get(code, AgentrtError)
    return cls(code, message, details, method)
