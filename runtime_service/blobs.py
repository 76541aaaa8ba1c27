"""Content-addressed blobs: streamed in, verified, deduplicated, size-limited, streamed out.

Bytes live behind the small :class:`BlobStore` interface so an object store can replace the
embedded default, :class:`DatabaseBlobStore`, which keeps them in the database in 1 MiB rows
(one backup covers the ledger and its blobs). Metadata always lives in ``runtime_blobs``, so
"does this blob exist" is one indexed look-up whatever the store.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import IO, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_base.errors import InvalidArgument, NotFound, ResourceExhausted
from registry import refs
from runtime_service.services.context import Runtime
from runtime_service.store.ledger import BlobContentRow, BlobRow

#: Largest blob accepted (documented in docs/api.md); bigger uploads are refused as soon as
#: the stream passes it, with RESOURCE_EXHAUSTED.
MAX_BLOB_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BlobHeader:
    media_type: str
    size: int
    expected_digest: str


class BlobStore(Protocol):
    """Where blob bytes live. Writes happen inside the metadata's transaction."""

    def write(self, session: Session, digest: str, data: IO[bytes]) -> None: ...

    def read_chunk(self, session: Session, digest: str, index: int) -> bytes | None:
        """Chunk ``index`` (0-based) of the blob, or None past its end."""
        ...


class DatabaseBlobStore:
    def write(self, session: Session, digest: str, data: IO[bytes]) -> None:
        index = 0
        while chunk := data.read(CHUNK_BYTES):
            session.execute(
                sa.insert(BlobContentRow).values(digest=digest, chunk=index, data=chunk)
            )
            index += 1

    def read_chunk(self, session: Session, digest: str, index: int) -> bytes | None:
        data: bytes | None = session.scalar(
            sa.select(BlobContentRow.data).where(
                BlobContentRow.digest == digest, BlobContentRow.chunk == index
            )
        )
        return data


def blob_exists(session: Session, digest: str) -> bool:
    return session.get(BlobRow, digest) is not None


def require_blob(session: Session, digest: str, field: str) -> None:
    """Refuse a reference to a blob that was never uploaded (FAILED_PRECONDITION BLOB_MISSING)."""
    from agentrt_base.errors import FailedPrecondition

    if not refs.is_digest(digest):
        raise InvalidArgument.for_field(field, f"{digest!r} is not a blob digest")
    if not blob_exists(session, digest):
        raise FailedPrecondition(
            f"{field}: blob {digest} has not been uploaded (PutBlob first)",
            reason="BLOB_MISSING",
            metadata={"digest": digest, "field": field},
        )


class BlobService:
    def __init__(self, runtime: Runtime, store: BlobStore | None = None) -> None:
        self._rt = runtime
        self._store = store or DatabaseBlobStore()

    async def put(
        self, header: BlobHeader | None, chunks: AsyncIterable[bytes]
    ) -> tuple[BlobRow, bool]:
        """Receive a blob; verify size and digest; store it unless it exists already."""
        if header is None:
            raise InvalidArgument.for_field("header", "required: the first message is the header")
        # Fix: a negative size is malformed input (INVALID_ARGUMENT), not an oversized blob.
        if header.size < 0:
            raise InvalidArgument.for_field("header.size", "must not be negative")
        if header.size > MAX_BLOB_BYTES:
            raise ResourceExhausted(
                f"header.size {header.size} is over the blob limit of {MAX_BLOB_BYTES} bytes",
                reason="BLOB_TOO_LARGE",
                metadata={"limit": str(MAX_BLOB_BYTES)},
            )
        if header.expected_digest and not refs.is_digest(header.expected_digest):
            raise InvalidArgument.for_field("header.expected_digest", "not a sha256 digest")
        hasher = hashlib.sha256()
        size = 0
        # Spooled: small blobs stay in memory, large ones go to a temporary file, so a
        # 64 MiB upload does not sit in the server's memory.
        with tempfile.SpooledTemporaryFile(max_size=CHUNK_BYTES) as spool:
            async for chunk in chunks:
                size += len(chunk)
                if size > MAX_BLOB_BYTES:
                    raise ResourceExhausted(
                        f"the blob is over the limit of {MAX_BLOB_BYTES} bytes",
                        reason="BLOB_TOO_LARGE",
                        metadata={"limit": str(MAX_BLOB_BYTES)},
                    )
                hasher.update(chunk)
                spool.write(chunk)
            digest = "sha256:" + hasher.hexdigest()
            # Fix: header.size is required and exact; a zero size with content was accepted.
            if size != header.size:
                raise InvalidArgument.for_field(
                    "header.size", f"announced {header.size} bytes, received {size}"
                )
            if header.expected_digest and digest != header.expected_digest:
                raise InvalidArgument.for_field(
                    "header.expected_digest",
                    f"the content's digest is {digest}, not {header.expected_digest}",
                )
            spool.seek(0)

            def write(session: Session) -> tuple[BlobRow, bool]:
                existing = session.get(BlobRow, digest)
                if existing is not None:
                    return existing, False
                row = BlobRow(
                    digest=digest,
                    size=size,
                    # Fix: BlobHeader.media_type "defaults to application/octet-stream".
                    media_type=(header.media_type or "application/octet-stream")[:200],
                    create_time=utcnow(),
                )
                session.add(row)
                session.flush()
                self._store.write(session, digest, spool)
                return row, True

            try:
                return await self._rt.write(write)
            except sa.exc.IntegrityError:
                # Fix: two concurrent uploads of the same content both pass the existence
                # check; the loser's insert hits the primary key (INTERNAL on PostgreSQL).
                # The content is stored either way: answer as for a repeated upload.
                stored = await self._rt.read(lambda session: session.get(BlobRow, digest))
                if stored is None:
                    raise
                return stored, False

    async def get(self, digest: str) -> tuple[BlobRow, AsyncIterator[bytes]]:
        if not refs.is_digest(digest):
            raise InvalidArgument.for_field("digest", f"{digest!r} is not a sha256 digest")

        def meta(session: Session) -> BlobRow:
            row = session.get(BlobRow, digest)
            if row is None:
                raise NotFound("blob", digest)
            return row

        row = await self._rt.read(meta)
        store = self._store

        async def stream() -> AsyncIterator[bytes]:
            index = 0
            while True:
                # One chunk per read: a slow client never holds a transaction open.
                chunk = await self._rt.read(partial(store.read_chunk, digest=digest, index=index))
                if chunk is None:
                    return
                yield chunk
                index += 1

        return row, stream()
