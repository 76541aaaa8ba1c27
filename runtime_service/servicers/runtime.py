"""gRPC adapter of ``agentrt.runtime.v1.RuntimeService``: proto in, use case, proto out.

RPCs not implemented here fall through to the generated base class, which the error
interceptor turns into ``UNIMPLEMENTED``.
"""

from __future__ import annotations

from agentrt.runtime.v1 import runtime_service_pb2_grpc
from agentrt_base.db import Database


class RuntimeServicer(runtime_service_pb2_grpc.RuntimeServiceServicer):
    """``agentrt.runtime.v1.RuntimeService``."""

    def __init__(self, database: Database) -> None:
        self._database = database
