"""The gRPC health service: its servicer (with ``List``), and the watcher that says
NOT_SERVING while the database cannot be reached or written, and SERVING again once it can.

A load balancer or orchestrator reads health to route calls away from a replica that can only
fail them, so health must follow the database, not just the process. Every ``interval`` the
watcher runs :meth:`Database.probe` (a small committed write on a connection of its own) in a
thread, bounded by the server's statement deadline: a probe that fails or does not finish in
time means NOT_SERVING. A call that meets a database failure (a lost connection, a full or
read-only database: ``Database.on_failure``) flips it at once rather than at the next probe;
only a probe that succeeds flips it back. After shutdown began, the health servicer ignores
every change, so NOT_SERVING stays for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from grpc_health.v1 import health, health_pb2

from agentrt_base.db import Database
from agentrt_core.errors import AgentrtError

log = logging.getLogger("agentrt.health")

#: Failures of a call that say the database cannot take writes now (not contention: a busy
#: lock, a conflict or a slow statement is the probe's to judge).
_DOWN_REASONS = frozenset(
    {"DATABASE_UNAVAILABLE", "DATABASE_READ_ONLY", "DATABASE_FULL", "DATABASE_IO_ERROR"}
)


class DatabaseHealth:
    """Keeps every service's health status in step with the database."""

    def __init__(
        self,
        database: Database,
        servicer: health.aio.HealthServicer,
        services: Iterable[str],
        interval: float,
        timeout: float,
    ) -> None:
        self._database = database
        self._servicer = servicer
        self._services = tuple(services)
        self._interval = interval
        self._timeout = timeout
        self._serving: bool | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._probe: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return bool(self._serving)

    async def start(self) -> None:
        """Probe once (so the first status is the truth), then keep probing."""
        await self._check()
        self._database.on_failure = self._call_failed
        self._task = asyncio.create_task(self._run(), name="agentrt-health")

    async def stop(self) -> None:
        self._database.on_failure = None
        # Told, not cancelled: on Python 3.11 a cancellation that arrives as wait_for's wait
        # ends is swallowed (CPython gh-86296), and the loop then probed on for ever while the
        # server's shutdown waited for it (a loaded machine makes that race likely).
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self._probe is not None:
            # A probe stuck on a frozen database ends at its own statement deadline.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._probe), self._timeout)

    def _call_failed(self, failure: AgentrtError) -> None:
        # Runs on the loop, where the call's handler awaited the database.
        if failure.reason in _DOWN_REASONS and self._serving:
            log.warning("a call met a database failure (%s): NOT_SERVING", failure.reason)
            asyncio.get_running_loop().create_task(self._set(False))
            self._wake.set()

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            if self._stopping:
                return
            await self._check()

    async def _check(self) -> None:
        if self._probe is None or self._probe.done():
            # A probe still running from before (a frozen database) is not started twice.
            self._probe = asyncio.ensure_future(asyncio.to_thread(self._database.probe))
            # A probe that outlived its wait (a loaded machine, a frozen database) may fail
            # after nobody awaits it any more: its failure is this check's or the next one's
            # answer, not an unretrieved exception for asyncio to log at exit.
            self._probe.add_done_callback(lambda probe: probe.cancelled() or probe.exception())
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), self._timeout)
        except Exception as exc:
            if self._serving is not False:
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning(
                    "the database cannot be reached or written (%s): NOT_SERVING", first_line
                )
            await self._set(False)
            return
        if self._serving is False:
            log.info("the database can be written again: SERVING")
        await self._set(True)

    async def _set(self, serving: bool) -> None:
        if self._serving == serving:
            return
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self._services):
            await self._servicer.set(name, status)


class HealthServicer(health.aio.HealthServicer):
    """The reference asyncio servicer plus ``List``.

    grpcio-health-checking's asyncio servicer implements ``Check`` and ``Watch`` but not
    ``List``, so a ``List`` fell through to the generated base class, which raises
    ``NotImplementedError`` inside the handler: every call logged a traceback. Here ``List``
    answers the statuses ``Check`` answers, one snapshot of them.
    """

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
