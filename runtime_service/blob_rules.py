"""The rules for blobs, pure: the caller reads what they need (whether a blob exists, how many
bytes are stored) and passes it in.

``store/blobs.require`` and ``step_decide`` refuse a reference to a missing blob with
:func:`blob_missing`; ``services/blobs`` holds an upload to the chunk, size and quota rules.
"""

from __future__ import annotations

from agentrt_core import reasons, refs
from agentrt_core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

#: The largest chunk a PutBlob message may carry (the contract's "at most 1 MiB per message"),
#: and the size of the chunks GetBlob answers with.
CHUNK_BYTES = 1024 * 1024


def blob_missing(field: str, digest: str) -> FailedPrecondition:
    """The error for ``field`` naming blob ``digest``, which was never uploaded."""
    return FailedPrecondition(
        f"{field}: blob {digest} has not been uploaded to the run's namespace (PutBlob first)",
        reason=reasons.BLOB_MISSING,
        metadata={"digest": digest, "field": field},
    )


def check_reference(field: str, digest: str) -> None:
    """A reference to a blob (``field``) is a sha256 digest: INVALID_ARGUMENT otherwise."""
    if not refs.is_digest(digest):
        raise InvalidArgument.for_field(field, f"{digest!r} is not a blob digest")


def check_blob_size(size: int, limit: int) -> None:
    """The per-blob limit (``max_blob_bytes``): RESOURCE_EXHAUSTED BLOB_TOO_LARGE."""
    if size > limit:
        raise ResourceExhausted(
            f"the blob ({size} bytes or more) is over the limit of {limit} bytes per blob",
            reason=reasons.BLOB_TOO_LARGE,
            metadata={"limit": str(limit)},
        )


def check_quota(size: int, *, used: int, quota: int) -> None:
    """The total quota (``blob_quota_bytes``): the ``used`` bytes of every stored blob plus
    this new one's ``size`` may not pass it (RESOURCE_EXHAUSTED BLOB_QUOTA_EXCEEDED). Content
    already stored is never charged again, so callers ask only for a blob that is not stored."""
    if used + size > quota:
        raise ResourceExhausted(
            f"storing {size} more bytes would pass the blob quota of {quota} bytes "
            f"({used} bytes are stored)",
            reason=reasons.BLOB_QUOTA_EXCEEDED,
            metadata={"quota": str(quota), "used": str(used), "size": str(size)},
        )


def check_namespace_quota(size: int, *, namespace: str, used: int, quota: int) -> None:
    """A namespace's quota (``namespace_blob_quota_bytes``): the ``used`` bytes of the blobs
    it holds plus this one's ``size`` may not pass it (RESOURCE_EXHAUSTED
    NAMESPACE_BLOB_QUOTA_EXCEEDED). A blob the namespace holds already is never charged
    again; one only another namespace holds is (its bytes are stored once, but each
    namespace that keeps it pays for it: what one tenant stores never depends on another)."""
    if used + size > quota:
        raise ResourceExhausted(
            f"storing {size} more bytes would pass namespace {namespace!r}'s blob quota of"
            f" {quota} bytes ({used} bytes are held)",
            reason=reasons.NAMESPACE_BLOB_QUOTA_EXCEEDED,
            metadata={
                "namespace": namespace,
                "quota": str(quota),
                "used": str(used),
                "size": str(size),
            },
        )


def check_chunk(chunk: bytes) -> None:
    """A chunk may carry at most :data:`CHUNK_BYTES` (INVALID_ARGUMENT naming ``chunk``)."""
    if len(chunk) > CHUNK_BYTES:
        raise InvalidArgument.for_field(
            "chunk", f"{len(chunk)} bytes; a chunk carries at most {CHUNK_BYTES} bytes"
        )
