"""Where blobs live: their rows (metadata in ``runtime_blobs``, so "does this blob exist" is
one indexed look-up whatever the store, and the quota counts the sum of its sizes), every
statement on them, and the stores that hold their bytes.

An upload's bytes are hashed and written to a temporary file as they arrive (:class:`Upload`),
in one upload thread of lower priority (:func:`in_upload_thread`), off the event loop and
outside any transaction (``services/blobs.py`` says why and drives it). Where the bytes end
up is the :class:`BlobStore`'s business:

* :class:`FileBlobStore` (a SQLite file database): one file per blob in a directory beside the
  database (``<db>-blobs/``), made durable and renamed into place *before* the row's commit,
  so a committed row always has its content and the row's transaction stays a few statements.
  Files are never rewritten or deleted once a row names them, so a backup that copies the
  database first and the directory after it holds every blob the copied ledger references.
* :class:`DatabaseBlobStore` (PostgreSQL, and an in-memory SQLite): 1 MiB rows written inside
  the row's transaction. PostgreSQL has many writers (no single writer to hold), and replicas
  on other hosts must read what one of them stored, so the bytes stay in the database there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import datetime as dt
import hashlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from agentrt_base.db import Database, utcnow
from runtime_service.blob_rules import CHUNK_BYTES, blob_missing, check_reference
from runtime_service.store.ledger import BlobContentRow, BlobNamespaceRow, BlobRow

T = TypeVar("T")

#: A temporary upload file untouched this long belongs to an upload that can no longer be
#: running (its server stopped mid-upload); it is removed when a server opens the store.
STALE_UPLOAD_SECONDS = 3600.0


#: How much lower than the server's other threads the upload thread runs (Linux ``nice``).
UPLOAD_NICENESS = 10

_upload_executor: ThreadPoolExecutor | None = None


def _lower_priority() -> None:
    # Linux applies a nice value to the one thread named by its id; elsewhere this is a no-op
    # (the thread then just runs at the server's priority).
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOAD_NICENESS)


async def in_upload_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run an upload's blocking work (hashing, writing, fsync) in the upload thread.

    One thread for every upload, at a lower priority: measured on the 2-core machine, an
    upload costs the server ~6.5 ms of CPU per MiB (receiving, hashing, copying into the page
    cache), so two uploads at ~90 MiB/s took more than half a core from the step path. At
    a lower priority the kernel lets step work go first when the CPU is contended, and the
    uploads slow down instead (a client stream is flow-controlled, so a slower reader
    throttles its sender); with the CPU idle they run at full speed.
    """
    global _upload_executor
    if _upload_executor is None:
        _upload_executor = ThreadPoolExecutor(
            1, thread_name_prefix="agentrt-blob-upload", initializer=_lower_priority
        )
    return await asyncio.get_running_loop().run_in_executor(_upload_executor, fn, *args)


class Upload:
    """One upload's bytes while they arrive: hashed and appended to a temporary file.

    Its methods block (hashing and file writes), so callers run them in a worker thread.
    """

    def __init__(self, directory: str | None, *, durable: bool = False) -> None:
        """``durable``: the file itself becomes the blob, so its bytes go to disk as they
        arrive (:func:`_write_back`) rather than all at once before the row commits."""
        self._durable = durable
        fd, self.path = tempfile.mkstemp(prefix="upload-", dir=directory)
        self._file = os.fdopen(fd, "w+b")
        self._hasher = hashlib.sha256()
        self.size = 0
        self._written_back = 0

    def add(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        self._file.write(chunk)
        self.size += len(chunk)
        # A MiB at a time, however small the client's chunks.
        if self._durable and self.size - self._written_back >= CHUNK_BYTES:
            self._file.flush()
            _write_back(self._file.fileno(), self._written_back, self.size - self._written_back)
            self._written_back = self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self._hasher.hexdigest()

    def sync(self) -> None:
        """Put the content on disk (before a row that names it may commit)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def rewind(self) -> None:
        self._file.flush()
        self._file.seek(0)

    def read(self, size: int) -> bytes:
        return self._file.read(size)

    def discard(self) -> None:
        """Remove the temporary file (a refused or abandoned upload leaves nothing behind)."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class BlobStore(Protocol):
    """Where blob bytes live. A verified upload is kept in steps: :meth:`place` (outside the
    row's transaction), :meth:`write` (inside the short transaction that inserts the blob's
    row), and, whenever that transaction does not insert the row (refused, failed, or the
    content was stored already), :meth:`unplace`."""

    def open_upload(self) -> Upload:
        """A new upload's staging file."""
        ...

    async def place(self, digest: str, upload: Upload) -> str | None:
        """Put the content where it will be read from, without holding the ledger's writer;
        returns what :meth:`write` and :meth:`unplace` need (None: nothing was placed)."""
        ...

    def write(self, session: Session, digest: str, placed: str | None) -> None: ...

    async def unplace(self, placed: str | None) -> None: ...

    def read_chunk(self, session: Session, digest: str, index: int) -> bytes | None:
        """Chunk ``index`` (0-based) of the blob, or None past its end."""
        ...


def get(session: Session, digest: str) -> BlobRow | None:
    return session.get(BlobRow, digest)


def exists(session: Session, digest: str) -> bool:
    return session.get(BlobRow, digest) is not None


def require(session: Session, namespace: str, digest: str, field: str) -> None:
    """Refuse a reference (``field``) to a blob that was never uploaded to ``namespace``:
    INVALID_ARGUMENT for what is not a digest, FAILED_PRECONDITION BLOB_MISSING for one not
    held there (``runtime_service.blob_rules``), even if another namespace stores the same
    content (a reference would tell one tenant that another has it)."""
    check_reference(field, digest)
    if held(session, namespace, digest) is None:
        raise blob_missing(field, digest)


def used_bytes(session: Session) -> int:
    """The size of every stored blob together: what the quota counts."""
    stored = sa.select(sa.func.coalesce(sa.func.sum(BlobRow.size), 0)).where(
        BlobRow.digest.startswith("sha256:")  # not uploads being staged
    )
    return int(session.scalar(stored) or 0)


def stored_and_locked(session: Session, digest: str) -> BlobRow | None:
    """The row of ``digest`` if it is stored, else None; either way with the quotas' lock
    held (on PostgreSQL) until this transaction ends, so the caller may check the quotas,
    insert the blob and add it to a namespace."""
    if session.get_bind().dialect.name == "postgresql":
        # Replicas commit blobs concurrently: one at a time, or two could each fit a quota
        # alone and pass it together. (SQLite has one writer already.)
        session.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('agentrt.blobs'))"))
    return session.get(BlobRow, digest)


def held(session: Session, namespace: str, digest: str) -> BlobRow | None:
    """The blob's row if ``namespace`` holds it (it was uploaded there), else None."""
    return session.scalar(
        sa.select(BlobRow)
        .join(BlobNamespaceRow, BlobNamespaceRow.digest == BlobRow.digest)
        .where(BlobNamespaceRow.namespace == namespace, BlobNamespaceRow.digest == digest)
    )


def held_in_any(session: Session, namespaces: Collection[str], digest: str) -> bool:
    """Whether any of ``namespaces`` holds the blob (:func:`held`, for a caller seeing several)."""
    found = sa.select(BlobNamespaceRow.digest).where(
        BlobNamespaceRow.namespace.in_(sorted(namespaces)), BlobNamespaceRow.digest == digest
    )
    return session.scalar(found.limit(1)) is not None


def namespace_used_bytes(session: Session, namespace: str) -> int:
    """The size of every blob ``namespace`` holds together: what its quota counts."""
    used = sa.select(sa.func.coalesce(sa.func.sum(BlobNamespaceRow.size), 0)).where(
        BlobNamespaceRow.namespace == namespace
    )
    return int(session.scalar(used) or 0)


def add_to_namespace(session: Session, namespace: str, row: BlobRow, now: dt.datetime) -> None:
    """Record that ``namespace`` holds the blob (the caller checked it did not, under the
    quotas' lock)."""
    session.add(
        BlobNamespaceRow(namespace=namespace, digest=row.digest, size=row.size, create_time=now)
    )
    session.flush()


class StoredMeanwhile(Exception):
    """Another transaction inserted the blob's row first (the primary key refused ours)."""


def insert(session: Session, digest: str, size: int, media_type: str, now: dt.datetime) -> BlobRow:
    """Insert a blob's row.

    Raises:
        StoredMeanwhile: the primary key refused the row.
    """
    # A media type longer than its column is cut to fit, not refused.
    row = BlobRow(digest=digest, size=size, media_type=media_type[:200], create_time=now)
    session.add(row)
    try:
        session.flush()
    except sa.exc.IntegrityError as exc:
        raise StoredMeanwhile(digest) from exc
    return row


def read_chunk_row(session: Session, digest: str, index: int) -> bytes | None:
    data: bytes | None = session.scalar(
        sa.select(BlobContentRow.data).where(
            BlobContentRow.digest == digest, BlobContentRow.chunk == index
        )
    )
    return data


#: Prefix of the key under which :class:`DatabaseBlobStore` stages an upload's rows. Never a
#: digest (every digest a caller passes is checked to be ``sha256:...``), so nothing can
#: find or reference a staged upload, and :func:`used_bytes` does not count it.
PENDING_PREFIX = "pending:"


class DatabaseBlobStore:
    """Blob bytes as 1 MiB rows of ``runtime_blob_chunks``.

    Written in one transaction, 64 MiB of rows went into PostgreSQL's WAL at once, and every
    step commit after them waited for all of it to be flushed. So the rows are staged one
    chunk per committed transaction (each commit waits for its own 1 MiB to be flushed, which
    paces the upload at what the disk takes, with the step commits interleaved) under a
    pending key whose row holds them (the foreign key wants one), and the row's transaction
    only renames them to the digest: small tuples, the chunk data itself is not rewritten.
    """

    def __init__(self, database: Database) -> None:
        self._db = database
        self._swept = False

    def open_upload(self) -> Upload:
        # A temporary file whose bytes end up in rows: it need not survive a crash.
        return Upload(None)

    async def place(self, digest: str, upload: Upload) -> str | None:
        if not self._swept:
            self._swept = True
            await self._sweep()
        pending = PENDING_PREFIX + uuid.uuid4().hex
        created = utcnow()

        def open_pending(session: Session) -> None:
            session.add(
                BlobRow(digest=pending, size=upload.size, media_type="", create_time=created)
            )

        await self._db.write(open_pending)
        try:
            await in_upload_thread(upload.rewind)
            index = 0
            while chunk := await in_upload_thread(upload.read, CHUNK_BYTES):
                await self._db.write(partial(_insert_chunk, pending, index, chunk))
                index += 1
        except BaseException:
            await self.unplace(pending)
            raise
        return pending

    def write(self, session: Session, digest: str, placed: str | None) -> None:
        session.execute(
            sa.update(BlobContentRow)
            .where(BlobContentRow.digest == placed)
            .values(digest=digest)
            .execution_options(synchronize_session=False)
        )
        session.execute(sa.delete(BlobRow).where(BlobRow.digest == placed))

    async def unplace(self, placed: str | None) -> None:
        if placed is not None:
            await self._db.write(partial(_drop_pending, [placed]))

    def read_chunk(self, session: Session, digest: str, index: int) -> bytes | None:
        return read_chunk_row(session, digest, index)

    async def _sweep(self) -> None:
        """Drop uploads staged by a server that stopped mid-upload (any replica's, once
        stale)."""
        cutoff = utcnow() - dt.timedelta(seconds=STALE_UPLOAD_SECONDS)

        def stale(session: Session) -> list[str]:
            return list(
                session.scalars(
                    sa.select(BlobRow.digest).where(
                        BlobRow.digest.startswith(PENDING_PREFIX), BlobRow.create_time < cutoff
                    )
                )
            )

        keys = await self._db.read(stale)
        if keys:
            await self._db.write(partial(_drop_pending, keys))


def _insert_chunk(key: str, index: int, data: bytes, session: Session) -> None:
    session.execute(sa.insert(BlobContentRow).values(digest=key, chunk=index, data=data))


def _drop_pending(keys: list[str], session: Session) -> None:
    session.execute(sa.delete(BlobContentRow).where(BlobContentRow.digest.in_(keys)))
    session.execute(sa.delete(BlobRow).where(BlobRow.digest.in_(keys)))


class FileBlobStore:
    """One file per blob under ``root/sha256/<first two hex digits>/``; uploads are staged in
    ``root/tmp/`` on the same file system, so moving one into place is an atomic rename."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.staging_dir = str(self.root / "tmp")
        os.makedirs(self.staging_dir, exist_ok=True)
        self._remove_stale_uploads()

    def open_upload(self) -> Upload:
        return Upload(self.staging_dir, durable=True)

    def path(self, digest: str) -> Path:
        hexdigest = digest.removeprefix("sha256:")
        return self.root / "sha256" / hexdigest[:2] / hexdigest

    async def place(self, digest: str, upload: Upload) -> str | None:
        placed = await in_upload_thread(self._place, digest, upload)
        return str(self.path(digest)) if placed else None

    def _place(self, digest: str, upload: Upload) -> bool:
        target = self.path(digest)
        if target.exists():
            return False
        upload.sync()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(upload.path, target)
        # The rename itself must be durable before the row that names the file commits.
        _fsync_directory(target.parent)
        return True

    def write(self, session: Session, digest: str, placed: str | None) -> None:
        return None

    async def unplace(self, placed: str | None) -> None:
        if placed is not None:
            await in_upload_thread(partial(Path(placed).unlink, missing_ok=True))

    def read_chunk(self, session: Session, digest: str, index: int) -> bytes | None:
        try:
            with open(self.path(digest), "rb") as f:
                f.seek(index * CHUNK_BYTES)
                return f.read(CHUNK_BYTES) or None
        except FileNotFoundError:
            # Blobs stored before the file store existed are still rows in the database.
            return read_chunk_row(session, digest, index)

    def _remove_stale_uploads(self) -> None:
        cutoff = time.time() - STALE_UPLOAD_SECONDS
        for entry in Path(self.staging_dir).glob("upload-*"):
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()


def _libc_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range() if sys.platform == "linux" else None
#: SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
_SYNC_RANGE_AND_WAIT = 1 | 2 | 4


def _write_back(fd: int, offset: int, length: int) -> None:
    """Put a just-written range of an upload on disk before the next is taken.

    Left to the kernel, 64 MiB of dirty upload data is written back in bursts, and the final
    fsync writes whatever is left at once; SQLite's commits (synchronous=FULL) queue behind
    those writes on the same disk, and on ext4 an fsync can wait for another file's data to
    be flushed. Written back a chunk at a time, the disk's queue holds at most one chunk of
    upload data, the upload goes at the pace the disk takes it without crowding the ledger's
    commits out, and the final fsync has nearly nothing left to write. ``sync_file_range``
    writes the data without a journal commit; elsewhere ``fdatasync`` does the same job.
    """
    if _sync_file_range is None or _sync_file_range(fd, offset, length, _SYNC_RANGE_AND_WAIT):
        os.fdatasync(fd)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def blob_directory(url: URL) -> str | None:
    """Where a SQLite file database keeps its blob files (None: not a SQLite file)."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return database + "-blobs"


def default_store(database: Database) -> BlobStore:
    """The file store beside a SQLite file database; the database itself otherwise."""
    directory = blob_directory(database.url)
    return FileBlobStore(directory) if directory is not None else DatabaseBlobStore(database)
