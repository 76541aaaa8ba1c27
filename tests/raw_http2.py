"""gRPC calls made of raw HTTP/2 frames (the ``h2`` package), for tests that must send what
no gRPC client library will: metadata values that are not UTF-8, CR/LF inside a header
value, headers a client would normalise. One call per connection; returns what came back."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


@dataclass
class RawResponse:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    @property
    def status(self) -> int | None:
        """grpc-status from the trailers (or from a trailers-only response's headers)."""
        for name, value in [*self.trailers, *self.headers]:
            if name == b"grpc-status":
                return int(value)
        return None


def call(
    port: int,
    path: str,
    extra: list[tuple[bytes, bytes]],
    message: bytes = b"",
    timeout: float = 10,
) -> RawResponse:
    """Send one unary gRPC request to ``127.0.0.1:port`` with ``extra`` header fields sent
    byte for byte (no validation or normalisation on our side)."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    connection = h2.connection.H2Connection(config)
    response = RawResponse()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *extra,
        ]
        connection.send_headers(stream, headers)
        # A gRPC message: not compressed, 4-byte big-endian length, the bytes.
        frame = b"\x00" + len(message).to_bytes(4, "big") + message
        connection.send_data(stream, frame, end_stream=True)
        sock.sendall(connection.data_to_send())
        ended = False
        while not ended:
            data = sock.recv(65535)
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    response.headers = list(event.headers)
                elif isinstance(event, h2.events.TrailersReceived):
                    response.trailers = list(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    response.body += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    ended = True
            sock.sendall(connection.data_to_send())
    return response
