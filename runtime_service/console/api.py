"""How the console reads and writes: through the server's own gRPC API, as the signed-in
principal.

The console does not open the database. Every page is made from gRPC calls to this same
server, over a Unix socket only this process can reach (a directory of mode 0700 made for
it), each call carrying the session's credential. So each goes through the same gate, the
same permission table, the same limits and the same error mapping as a backend's call: a
principal sees in the console exactly what the API would show it, and what the console asks
to change is refused exactly when the API would refuse it, with the API's reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2_grpc
from agentrt_sdk.errors import from_rpc_error
from runtime_service.console.sessions import Session

T = TypeVar("T")


@dataclass
class LocalSocket:
    """The Unix socket the console's calls arrive on: made before the server binds it,
    removed when the server has stopped."""

    directory: str

    @classmethod
    def make(cls) -> LocalSocket:
        directory = tempfile.mkdtemp(prefix="agentrt-console-")  # mode 0700: ours alone
        os.chmod(directory, 0o700)
        return cls(directory)

    @property
    def address(self) -> str:
        return f"unix:{os.path.join(self.directory, 'api.sock')}"

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class Api:
    """The stubs of the server's services over its local socket."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self.runtime: Any = runtime_service_pb2_grpc.RuntimeServiceStub(self._channel)
        self.registry: Any = registry_service_pb2_grpc.RegistryServiceStub(self._channel)
        self.audit: Any = audit_service_pb2_grpc.AuditServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def watch(self, session: Session | None, request: Any) -> AsyncIterator[Any]:
        """WatchRun's events as the session's principal, until the stream ends."""
        async for reply in self.stream(session, self.runtime.WatchRun, request):
            yield reply.event

    async def stream(
        self, session: Session | None, method: Callable[..., Any], request: Any
    ) -> AsyncIterator[Any]:
        """A server-streaming call's messages as the session's principal, until it ends; the
        SDK's AgentrtError if it is refused or broken. Closing the iterator cancels it."""
        call = method(request, metadata=_metadata(session))
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def call(
        self, session: Session | None, method: Callable[..., Awaitable[T]], request: Any
    ) -> T:
        """``method(request)`` as the session's principal; the SDK's typed AgentrtError
        (``agentrt_sdk.errors``: code, message, ErrorInfo reason, field violations) if it is
        refused."""
        try:
            return await method(request, metadata=_metadata(session), timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None


def _metadata(session: Session | None) -> tuple[tuple[str, str], ...]:
    if session is None or not session.credential:
        return ()
    return (("authorization", f"Bearer {session.credential}"),)
