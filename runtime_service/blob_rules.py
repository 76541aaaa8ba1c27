"""The rule for a reference to a blob: it must name one that was uploaded. Pure (the caller
says whether the blob exists); ``blobs.require_blob`` and ``step_decide`` both use it."""

from __future__ import annotations

from agentrt_base.errors import FailedPrecondition


def blob_missing(field: str, digest: str) -> FailedPrecondition:
    """The error for ``field`` naming blob ``digest``, which was never uploaded."""
    return FailedPrecondition(
        f"{field}: blob {digest} has not been uploaded (PutBlob first)",
        reason="BLOB_MISSING",
        metadata={"digest": digest, "field": field},
    )
