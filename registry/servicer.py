"""gRPC adapter of the registry: proto in, use case, proto out.

RPCs not implemented here fall through to the generated base class, which the error
interceptor turns into ``UNIMPLEMENTED``.
"""

from __future__ import annotations

from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt_base.db import Database


class RegistryServicer(registry_service_pb2_grpc.RegistryServiceServicer):
    """``agentrt.registry.v1.RegistryService``."""

    def __init__(self, database: Database) -> None:
        self._database = database
