"""PutBlob's limits through real gRPC on both engines: the per-blob limit, the total quota
(content stored once is charged once), the chunk size, and that a refused or abandoned upload
leaves nothing behind: no blob row, no content rows, no file, no staged upload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.db_engines import normalise_url
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.store.blobs import blob_directory
from tests.runtime_support import Stubs
from tests.service.steps_support import (
    T,
    chunk,
    digest_of,
    expect,
    header,
    put,
    put_blob,
    violations,
)
from tests.support import running_server

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MIB = 1024 * 1024


def get(stubs: Stubs, digest: str) -> bytes:
    responses = list(stubs.runtime.GetBlob(pb.GetBlobRequest(digest=digest), timeout=T))
    return b"".join(r.chunk for r in responses[1:])


def stored(database_url: str) -> tuple[int, int, list[str]]:
    """What blob storage holds: blob rows, content rows, and every file under the SQLite
    blob directory (content and staged uploads alike)."""
    url = normalise_url(database_url)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT count(*) FROM runtime_blobs").scalar_one()
            chunks = conn.exec_driver_sql("SELECT count(*) FROM runtime_blob_chunks").scalar_one()
    finally:
        engine.dispose()
    directory = blob_directory(url)
    files = (
        sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*") if p.is_file())
        if directory
        else []
    )
    return rows, chunks, files


@pytest.fixture
def limited(database_url: str) -> Iterator[Stubs]:
    """A server with a 2000-byte blob limit and a 3000-byte quota."""
    settings = RuntimeSettings(max_blob_bytes=2000, blob_quota_bytes=3000)
    with running_server(database_url, settings) as address, Stubs.open(address) as stubs:
        yield stubs


def test_the_per_blob_limit_is_a_setting(limited: Stubs, database_url: str) -> None:
    assert put_blob(limited, b"x" * 2000).created  # at the limit is fine
    before = stored(database_url)
    details = expect(EXHAUSTED, put, limited, header(2001), reason="BLOB_TOO_LARGE")
    assert details["ErrorInfo"].metadata["limit"] == "2000"
    # A header that understates the size is caught while streaming.
    expect(
        EXHAUSTED,
        put,
        limited,
        header(1000),
        chunk(b"y" * 1500),
        chunk(b"y" * 1500),
        reason="BLOB_TOO_LARGE",
    )
    assert stored(database_url) == before


def test_the_total_quota_refuses_what_would_not_fit_and_stores_nothing(
    limited: Stubs, database_url: str
) -> None:
    a = b"a" * 2000
    assert put_blob(limited, a).created
    before = stored(database_url)
    b = b"b" * 1500
    details = expect(
        EXHAUSTED, put, limited, header(len(b)), chunk(b), reason="BLOB_QUOTA_EXCEEDED"
    )
    info = details["ErrorInfo"].metadata
    assert (info["quota"], info["used"], info["size"]) == ("3000", "2000", "1500")
    # Announced with its digest, the same upload is refused from its header alone.
    expect(
        EXHAUSTED,
        put,
        limited,
        header(len(b), expected=digest_of(b)),
        chunk(b),
        reason="BLOB_QUOTA_EXCEEDED",
    )
    assert stored(database_url) == before
    expect(grpc.StatusCode.NOT_FOUND, get, limited, digest_of(b))
    assert get(limited, digest_of(a)) == a


def test_a_deduplicated_upload_is_not_charged_twice(limited: Stubs, database_url: str) -> None:
    a = b"a" * 2000
    assert put_blob(limited, a).created
    before = stored(database_url)
    # 2000 + 2000 would pass the quota of 3000, but the content is stored already.
    again = put_blob(limited, a, chunk=700)
    assert not again.created
    announced = put(limited, header(len(a), expected=digest_of(a)), chunk(a))
    assert not announced.created
    assert stored(database_url) == before  # and nothing of them was left staged
    # So exactly 1000 bytes are left.
    assert put_blob(limited, b"c" * 1000).created
    expect(EXHAUSTED, put, limited, header(1), chunk(b"d"), reason="BLOB_QUOTA_EXCEEDED")


def test_a_chunk_over_1_mib_is_refused(database_url: str) -> None:
    with running_server(database_url) as address:
        stubs = Stubs.open(address)
        try:
            data = b"z" * (MIB + 1)
            details = expect(
                grpc.StatusCode.INVALID_ARGUMENT, put, stubs, header(len(data)), chunk(data)
            )
            assert violations(details) == ["chunk"]
            assert stored(database_url) == (0, 0, [])
            # Exactly 1 MiB per chunk is what the contract allows.
            assert put_blob(stubs, data, chunk=MIB).created
        finally:
            stubs.close()


def test_an_abandoned_upload_leaves_nothing(database_url: str) -> None:
    size = 3 * MIB
    settings = RuntimeSettings(blob_quota_bytes=size)
    with running_server(database_url, settings) as address:
        stubs = Stubs.open(address)
        try:
            sent = threading.Event()
            release = threading.Event()

            def messages() -> Iterator[pb.PutBlobRequest]:
                yield header(size)
                yield chunk(b"p" * MIB)
                yield chunk(b"p" * MIB)
                sent.set()
                release.wait(T)  # the client never sends the last chunk

            call = stubs.runtime.PutBlob.future(messages(), timeout=T)
            assert sent.wait(T)
            time.sleep(0.3)  # let the server take the two chunks
            call.cancel()
            release.set()
            deadline = time.monotonic() + 10
            while stored(database_url) != (0, 0, []) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert stored(database_url) == (0, 0, [])
            # Nothing of it was charged: a blob of the whole quota still fits.
            data = b"q" * size
            assert put_blob(stubs, data).created
            assert get(stubs, digest_of(data)) == data
        finally:
            stubs.close()


def test_uploads_together_keep_to_the_servers_pace(database_url: str) -> None:
    """Two uploads at once share one pace (here 4 MiB/s after a 4 MiB burst): 12 MiB in all
    take at least (12 - 4) / 4 = 2 s however fast the clients send, and both complete."""
    settings = RuntimeSettings(blob_upload_rate=4 * MIB)
    with running_server(database_url, settings) as address:
        stubs = Stubs.open(address)
        try:
            results: list[Any] = []

            def upload(tag: bytes) -> None:
                results.append(put_blob(stubs, tag * (6 * MIB), chunk=MIB))

            started = time.monotonic()
            uploads = [threading.Thread(target=upload, args=(t,)) for t in (b"a", b"b")]
            for thread in uploads:
                thread.start()
            for thread in uploads:
                thread.join(60)
            elapsed = time.monotonic() - started
            assert [r.created for r in results] == [True, True]
            assert elapsed >= 1.9, f"12 MiB took {elapsed:.2f} s at 4 MiB/s"
            assert get(stubs, results[0].blob.digest)[:1] in (b"a", b"b")
        finally:
            stubs.close()
