"""gRPC adapter of ``agentrt.runtime.v1.WorkerService``: proto in, use case, proto out.

RPCs not implemented here fall through to the generated base class, which the error
interceptor turns into ``UNIMPLEMENTED``.
"""

from __future__ import annotations

from agentrt.runtime.v1 import worker_service_pb2_grpc
from agentrt_base.db import Database


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    """``agentrt.runtime.v1.WorkerService``."""

    def __init__(self, database: Database) -> None:
        self._database = database
