"""The asyncio client: one object holding a connection and every API group.

async with AgentrtClient("127.0.0.1:50051") as client:
    published = await client.registry.publish("examples/coding_agent.yaml", tag="prod")
    thread = await client.threads.create("login returns 500")
    run = await client.runs.create(thread.id, "coding_agent:prod", "fix the login failure")
    async for event in client.watch_run(run.id):
        print(event.sequence, event.type)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import Any

from agentrt.runtime.v1 import event_pb2
from agentrt_core.connect import ClientTls
from agentrt_sdk.audit_api import Audit
from agentrt_sdk.blobs_api import Blobs
from agentrt_sdk.registry_api import Registry
from agentrt_sdk.runtime_api import Runs, Threads
from agentrt_sdk.transport import Connection, RetryPolicy
from agentrt_sdk.watch import ThreadEvent, watch_run, watch_thread


class AgentrtClient:
    """An agentrt client for asyncio code.

    Create it inside the event loop that uses it (gRPC's asyncio channels belong to one loop),
    and close it (``async with``, or :meth:`close`).

    Args:
        target: ``HOST:PORT``; default ``AGENTRT_TARGET`` or ``127.0.0.1:50051``.
        token: bearer token; default ``AGENTRT_TOKEN``.
        tls: the server's CA and an optional client certificate; default ``AGENTRT_TLS_*``.
        timeout: per-try deadline of unary calls, in seconds.
        retry: backoff for calls retried on ``UNAVAILABLE`` (see :mod:`agentrt_sdk.transport`).
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.connection = Connection(
            target, token=token, tls=tls, timeout=timeout, retry=retry, options=options
        )
        self.registry = Registry(self.connection)
        self.threads = Threads(self.connection)
        self.runs = Runs(self.connection)
        self.blobs = Blobs(self.connection)
        self.audit = Audit(self.connection)

    @property
    def target(self) -> str:
        return self.connection.target

    def watch_run(
        self, run_id: str, *, after_sequence: int = 0, event_types: Iterable[int] = ()
    ) -> AsyncIterator[event_pb2.Event]:
        """The run's events after ``after_sequence``, then live, until ``run.ended``;
        reconnects by itself (:mod:`agentrt_sdk.watch`)."""
        return watch_run(
            self.connection, run_id, after_sequence=after_sequence, event_types=event_types
        )

    def watch_thread(
        self,
        thread_id: str,
        *,
        after_cursor: str = "",
        live_only: bool = False,
        event_types: Iterable[int] = (),
    ) -> AsyncIterator[ThreadEvent]:
        """The thread's events (its runs' too) after ``after_cursor``, then live; never ends
        on its own."""
        return watch_thread(
            self.connection,
            thread_id,
            after_cursor=after_cursor,
            live_only=live_only,
            event_types=event_types,
        )

    async def close(self) -> None:
        await self.connection.close()

    async def __aenter__(self) -> AgentrtClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
