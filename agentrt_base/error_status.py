"""Domain errors → ``google.rpc.Status`` with details: the one mapping, without the transport.

Every :class:`agentrt_core.errors.AgentrtError` has one canonical code (:func:`status_code_for`),
and :func:`to_status` builds the status the caller receives: ``ErrorInfo`` (reason, domain,
metadata) on every error, plus ``BadRequest`` field violations, ``PreconditionFailure``,
``ResourceInfo`` or ``RetryInfo`` where they apply (https://google.aip.dev/193). What an error
echoes of the request is clipped, since the status travels in trailers (see the bounds below).
The interceptor that sends it (:mod:`agentrt_base.grpc_errors`) is the only caller on the
server's side.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from agentrt_core import errors, reasons

__all__ = ["internal_status", "status_code_for", "to_status"]

_CODES: list[tuple[type[errors.AgentrtError], grpc.StatusCode]] = [
    # Order matters: subclasses before their bases.
    (errors.LeaseLost, grpc.StatusCode.ABORTED),
    (errors.Aborted, grpc.StatusCode.ABORTED),
    (errors.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
]


def status_code_for(error: errors.AgentrtError) -> grpc.StatusCode:
    """The canonical code for a domain error (``FAILED_PRECONDITION`` for an unknown subclass
    would hide a bug, so an unmapped class is treated as a programming error: INTERNAL)."""
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


#: Bounds, in UTF-8 bytes, on what an error echoes of the request. The status travels in
#: trailers, and gRPC clients refuse metadata past 16 KiB and, at random, past 8 KiB: a
#: NOT_FOUND that quoted a 100 KB id in full reached the caller as RESOURCE_EXHAUSTED
#: "metadata size exceeds hard limit". The message goes out twice (grpc-message, where a
#: non-ASCII byte is percent-encoded as three, and inside the base64 details), so the worst
#: case stays near 6 KiB: message 1.2 KiB + details 4.4 KiB x 4/3.
_MAX_MESSAGE = 400
_MAX_TEXT = 160
#: The bytes of field (or precondition) violations sent, in the order found: every one that
#: fits. Each takes at most ~330 bytes (field and description clipped to 160), a typical one
#: ~60-100, so a request breaking a schema in a few dozen places is reported whole; one that
#: breaks it in a thousand would otherwise push the trailer past the clients' limit and arrive
#: as a bare RESOURCE_EXHAUSTED. With this budget the worst case stays within the ~6 KiB
#: above. When some are left out, ErrorInfo.metadata["violation_count"] says how many there
#: were in all (docs/api.md, "Errors"); a refused tool call's step records them all.
_VIOLATION_BYTES = 3000


def _fitting(items: list[Any]) -> list[Any]:
    """The first of ``items`` (violation messages) whose encoded sizes fit the budget."""
    kept, used = [], 0
    for item in items:
        used += item.ByteSize() + 3  # + the repeated field's tag and length
        if used > _VIOLATION_BYTES:
            break
        kept.append(item)
    return kept


def _clip(text: str, limit: int = _MAX_TEXT) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    # Cut on a character boundary, leaving room for the ellipsis (3 bytes).
    return data[: limit - 3].decode(errors="ignore") + "…"


def to_status(error: errors.AgentrtError) -> tuple[grpc.StatusCode, status_pb2.Status]:
    """Build the ``google.rpc.Status`` (with details) for a domain error."""
    code = status_code_for(error)
    metadata = {_clip(k): _clip(v) for k, v in error.metadata.items()}
    field_violations = (
        _fitting(
            [
                error_details_pb2.BadRequest.FieldViolation(
                    field=_clip(v.field), description=_clip(v.description)
                )
                for v in error.violations
            ]
        )
        if isinstance(error, errors.InvalidArgument)
        else []
    )
    precondition_violations = (
        _fitting(
            [
                error_details_pb2.PreconditionFailure.Violation(
                    type=_clip(kind), subject=_clip(subject), description=_clip(description)
                )
                for kind, subject, description in error.violations
            ]
        )
        if isinstance(error, errors.FailedPrecondition)
        else []
    )
    sent = len(field_violations) + len(precondition_violations)
    if isinstance(error, errors.InvalidArgument | errors.FailedPrecondition) and (
        sent < len(error.violations)
    ):
        metadata["violation_count"] = str(len(error.violations))
    details = [
        _pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason, domain=errors.ERROR_DOMAIN, metadata=metadata
            )
        )
    ]
    if field_violations:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=field_violations)))
    if precondition_violations:
        details.append(
            _pack(error_details_pb2.PreconditionFailure(violations=precondition_violations))
        )
    if isinstance(error, errors.NotFound | errors.AlreadyExists):
        details.append(
            _pack(
                error_details_pb2.ResourceInfo(
                    resource_type=error.resource_type,
                    resource_name=_clip(error.resource_name),
                    description=_clip(error.message, _MAX_MESSAGE),
                )
            )
        )
    if isinstance(error, errors.ResourceExhausted) and error.retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, round(error.retry_delay * 1e9)))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(
        code=code.value[0], message=_clip(error.message, _MAX_MESSAGE), details=details
    )
    return code, status


def internal_status(error_id: str) -> status_pb2.Status:
    """The status of a bug of ours: ``INTERNAL`` with the error id only, never the exception."""
    return status_pb2.Status(
        code=code_pb2.INTERNAL,
        message=f"internal error (id {error_id}); the server log has the details",
        details=[
            _pack(
                error_details_pb2.ErrorInfo(
                    reason=reasons.INTERNAL,
                    domain=errors.ERROR_DOMAIN,
                    metadata={"error_id": error_id},
                )
            )
        ],
    )
