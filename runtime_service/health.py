"""The gRPC health service (``grpc.health.v1.Health``), with the ``List`` call implemented.

grpcio-health-checking's asyncio servicer implements ``Check`` and ``Watch`` but not ``List``,
so a ``List`` fell through to the generated base class, which raises ``NotImplementedError``
inside the handler: every call logged a traceback. Here ``List`` answers the statuses
``Check`` answers, one snapshot of them.
"""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health, health_pb2


class HealthServicer(health.aio.HealthServicer):
    """The reference asyncio servicer plus ``List``."""

    async def List(self, request: Any, context: Any) -> Any:
        # `_server_status` is the reference servicer's own record of every `set` (and of a
        # graceful shutdown), the mapping its `Check` reads. The List messages and that
        # attribute are missing from the published type stubs (they lag the package).
        statuses = self._server_status  # type: ignore[attr-defined]
        return health_pb2.HealthListResponse(  # type: ignore[attr-defined]
            statuses={
                service: health_pb2.HealthCheckResponse(status=status)
                for service, status in statuses.items()
            }
        )
