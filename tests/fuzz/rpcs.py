"""Every agentrt RPC, read from the generated descriptors, and one way to call any of them.

The catalogue is built from the ``*_pb2`` file descriptors, not from a hand-written list, so an
RPC added to a ``.proto`` is fuzzed the moment ``make gen`` runs. Calls go through a channel's
generic methods with no serializers: the fuzzer sends bytes it encoded itself (or bytes no
encoder would produce) and gets the response's bytes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

from agentrt.audit.v1 import audit_service_pb2
from agentrt.registry.v1 import registry_service_pb2
from agentrt.runtime.v1 import runtime_service_pb2, worker_service_pb2
from tests.support import error_details

FILES = (registry_service_pb2, runtime_service_pb2, worker_service_pb2, audit_service_pb2)


@dataclass(frozen=True)
class Rpc:
    service: str  # e.g. agentrt.runtime.v1.RuntimeService
    name: str  # e.g. GetRun
    input: Descriptor
    output: Descriptor
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def label(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}.{self.name}"

    def request_class(self) -> Any:
        return message_factory.GetMessageClass(self.input)

    def response_class(self) -> Any:
        return message_factory.GetMessageClass(self.output)


def message_type(field: FieldDescriptor) -> Descriptor:
    """The message type of a message field (never None for one)."""
    assert field.message_type is not None, field.full_name
    return field.message_type


def _services() -> Iterator[ServiceDescriptor]:
    for module in FILES:
        yield from module.DESCRIPTOR.services_by_name.values()


def all_rpcs() -> list[Rpc]:
    """Every method of every agentrt service, in declaration order."""
    return [
        Rpc(
            service.full_name,
            method.name,
            method.input_type,
            method.output_type,
            method.client_streaming,
            method.server_streaming,
        )
        for service in _services()
        for method in service.methods
    ]


@dataclass
class Answer:
    """What one call came back with: a status code, the response messages' bytes, and the
    server's message (for the report)."""

    code: grpc.StatusCode
    responses: list[bytes]
    details: str = ""
    reason: str = ""  # google.rpc.ErrorInfo of a refusal
    metadata: dict[str, str] = field(default_factory=dict)


def invoke(
    channel: Any,  # a grpc.Channel, whose generic methods are typed for serializers
    rpc: Rpc,
    payloads: list[bytes],
    timeout: float,
    max_messages: int = 64,
) -> Answer:
    """Send ``payloads`` (one message for a unary request, the whole stream for a client
    stream) as they are, and read the answer. A server stream is read until it ends, its
    deadline passes or ``max_messages`` arrived (then it is cancelled: counted as OK)."""
    responses: list[bytes] = []
    try:
        if rpc.client_streaming and not rpc.server_streaming:
            call = channel.stream_unary(rpc.path)
            responses.append(call(iter(payloads), timeout=timeout))
        elif rpc.server_streaming and not rpc.client_streaming:
            stream = channel.unary_stream(rpc.path)(payloads[0], timeout=timeout)
            for item in stream:
                responses.append(item)
                if len(responses) >= max_messages:
                    stream.cancel()
                    return Answer(grpc.StatusCode.OK, responses)
        elif not rpc.client_streaming:
            responses.append(channel.unary_unary(rpc.path)(payloads[0], timeout=timeout))
        else:  # no bidirectional RPC exists yet; drive one as a stream in, stream out
            for item in channel.stream_stream(rpc.path)(iter(payloads), timeout=timeout):
                responses.append(item)
                if len(responses) >= max_messages:
                    break
    except grpc.RpcError as exc:
        try:
            info = error_details(exc).get("ErrorInfo")
        except ValueError:
            # The status the client read is not the server's (it refused the trailers, say):
            # no details, which the harness counts as a refusal without ErrorInfo.
            info = None
        return Answer(
            exc.code(),
            responses,
            str(exc.details() or ""),
            info.reason if info is not None else "",
            dict(info.metadata) if info is not None else {},
        )
    return Answer(grpc.StatusCode.OK, responses)
