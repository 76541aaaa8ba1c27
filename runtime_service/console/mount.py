"""The console of one server, from the check of where it may listen to its socket's removal:
what ``AgentrtServer`` calls at each stage of its start and stop."""

from __future__ import annotations

import grpc

from agentrt_base.access import Authorizer
from agentrt_base.auth import Principal
from agentrt_base.auth_gate import Authenticator
from agentrt_base.tls import ServerTls
from agentrt_core.errors import AgentrtError as CoreError
from runtime_service.console.api import Api, LocalSocket
from runtime_service.console.web import Console, ConsoleEndpoint, console_exposure


class ConsoleMount:
    def __init__(
        self, listen: str, tls: ServerTls | None, authenticator: Authenticator, insecure: bool
    ) -> None:
        """Raises ConsoleExposureError where the console may not listen (before anything is
        opened: a refused start leaves nothing behind)."""
        self.listen = listen
        self.how = console_exposure(listen, tls, authenticator.configured, insecure)
        self._authenticator = authenticator
        self._socket: LocalSocket | None = None
        self._pages: ConsoleEndpoint | None = None

    def bind(self, server: grpc.aio.Server) -> None:
        """Have ``server`` listen on the console's own socket too (before it starts): the
        console's calls come in there, through the same interceptors and permission table as
        every other call, on a socket only this process can reach."""
        self._socket = LocalSocket.make()
        server.add_insecure_port(self._socket.address)

    async def start(self, authorizer: Authorizer | None) -> str:
        """Serve the pages (the gRPC server has started); return their URL. OSError or
        ConsoleExposureError when the address cannot be bound."""
        assert self._socket is not None, "bind first"
        console = Console.make(
            Api(self._socket.address),
            self._sign_in if self._authenticator.configured else None,
            authorizer.permits if authorizer is not None else None,
            self._authenticator.console_sign_in,
        )
        pages = ConsoleEndpoint(self.listen, console)
        try:
            await pages.start()
        except BaseException:
            await pages.stop()
            raise
        self._pages = pages
        return pages.url

    @property
    def url(self) -> str | None:
        return self._pages.url if self._pages is not None else None

    async def stop(self) -> None:
        """Close the pages and their event streams (before the gRPC server drains)."""
        if self._pages is not None:
            await self._pages.stop()
            self._pages = None

    def remove(self) -> None:
        """Remove the socket (the gRPC server has stopped)."""
        if self._socket is not None:
            self._socket.remove()
            self._socket = None

    async def _sign_in(self, token: str) -> Principal | None:
        """The principal a token proves, by the gate's own rule; None for one it refuses."""
        try:
            return await self._authenticator.principal_of(
                [("authorization", f"Bearer {token}")], None
            )
        except CoreError:
            return None
