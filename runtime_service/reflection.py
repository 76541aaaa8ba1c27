"""Server reflection under both of its names: ``grpc.reflection.v1`` and ``v1alpha``.

Current clients (grpcurl, Postman, grpcui) ask for ``grpc.reflection.v1.ServerReflection``
first; grpcio-reflection ships only ``v1alpha``. ``v1`` (grpc/grpc-proto,
``grpc/reflection/v1/reflection.proto``) declares the same messages with the same field
numbers under another package, so the bytes on the wire are the same. This module
therefore serves one servicer, grpcio-reflection's, at both paths, and derives the ``v1``
file descriptor from ``v1alpha``'s (renaming the package) instead of carrying a copy of the
proto: reflection can then describe its own ``v1`` service, and a client can build ``v1``
messages from it (:data:`V1_REQUEST`, :data:`V1_RESPONSE`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection, reflection_pb2

__all__ = ["V1_FILE", "V1_REQUEST", "V1_RESPONSE", "V1_SERVICE_NAME", "enable_reflection"]

V1_PACKAGE = "grpc.reflection.v1"
_ALPHA_PACKAGE = reflection_pb2.DESCRIPTOR.package
#: Where the v1 proto lives upstream, so a client asking for the file by name finds it.
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
_METHOD = "ServerReflectionInfo"


def _v1_file_proto() -> descriptor_pb2.FileDescriptorProto:
    """``v1alpha``'s file descriptor with every name moved to the ``v1`` package."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    proto.ClearField("options")  # v1alpha's language options name v1alpha packages
    old, new = f".{_ALPHA_PACKAGE}.", f".{V1_PACKAGE}."

    def moved(name: str) -> str:
        return new + name.removeprefix(old) if name.startswith(old) else name

    for message in proto.message_type:
        for message_field in message.field:
            if message_field.HasField("type_name"):  # set only on message and enum fields
                message_field.type_name = moved(message_field.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type = moved(method.input_type)
            method.output_type = moved(method.output_type)
    return proto


def _v1_descriptor() -> Any:
    # The default pool is the one the reflection servicer reads (and describes the contract
    # from); a second import of this module, or a future grpcio-reflection that registers
    # the same file, finds it there already.
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        return pool.Add(_v1_file_proto())


_V1 = _v1_descriptor()
V1_REQUEST: Any = message_factory.GetMessageClass(
    _V1.message_types_by_name["ServerReflectionRequest"]
)
V1_RESPONSE: Any = message_factory.GetMessageClass(
    _V1.message_types_by_name["ServerReflectionResponse"]
)


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection of ``service_names`` (and of itself) at the v1 and v1alpha paths.

    Args:
        server: The server, before it starts.
        service_names: The fully qualified names of the services it hosts.
    """
    both = (reflection.SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer((*service_names, *both))
    # The servicer reads and makes v1alpha messages; their bytes are v1's too.
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        tuple(grpc.method_handlers_generic_handler(name, {_METHOD: handler}) for name in both)
    )
