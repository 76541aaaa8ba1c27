"""Content-addressed blobs: upload bytes once, name them by ``sha256:`` digest everywhere."""

from __future__ import annotations

from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_core.jcs import digest_bytes
from agentrt_sdk.transport import Connection

#: The largest chunk the server takes (runtime_service.proto, PutBlob).
CHUNK = 1 << 20


#: The digest the server gives ``content`` (the project's one digest function).
blob_digest = digest_bytes


class Blobs:
    """``PutBlob`` / ``GetBlob``."""

    def __init__(self, connection: Connection) -> None:
        self._c = connection

    async def put(
        self, content: bytes, *, media_type: str = "application/octet-stream", namespace: str = ""
    ) -> message_pb2.Blob:
        """Upload ``content`` (whole, in 1 MiB chunks) and return its blob. The expected
        digest travels in the header, so the server refuses a transfer that arrived damaged;
        a retry sends the same bytes again (the blob is content-addressed)."""

        def messages() -> list[pb.PutBlobRequest]:
            header = message_pb2.BlobHeader(
                media_type=media_type,
                size=len(content),
                expected_digest=blob_digest(content),
                namespace=namespace,
            )
            chunks = [
                pb.PutBlobRequest(chunk=content[i : i + CHUNK])
                for i in range(0, len(content), CHUNK)
            ]
            return [pb.PutBlobRequest(header=header), *chunks]

        response = await self._c.stream_in("runtime", "PutBlob", messages, pb.PutBlobResponse)
        return response.blob

    async def get(self, digest: str, *, namespace: str = "") -> tuple[message_pb2.Blob, bytes]:
        """A blob and its bytes, checked against its digest."""
        blob = message_pb2.Blob()
        parts: list[bytes] = []
        request = pb.GetBlobRequest(digest=digest, namespace=namespace)
        async for response in self._c.stream_out("runtime", "GetBlob", request):
            if response.HasField("blob"):
                blob.CopyFrom(response.blob)
            else:
                parts.append(response.chunk)
        content = b"".join(parts)
        if blob_digest(content) != digest:
            raise ValueError(f"blob {digest}: the bytes received hash to {blob_digest(content)}")
        return blob, content
