"""gRPC adapter of ``agentrt.audit.v1.AuditService``: proto in, use case, proto out.

RPCs not implemented here fall through to the generated base class, which the error
interceptor turns into ``UNIMPLEMENTED``.
"""

from __future__ import annotations

from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt_base.db import Database


class AuditServicer(audit_service_pb2_grpc.AuditServiceServicer):
    """``agentrt.audit.v1.AuditService``."""

    def __init__(self, database: Database) -> None:
        self._database = database
