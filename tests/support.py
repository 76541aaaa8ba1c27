"""Helpers the test suites share: an in-process server on its own loop, error-detail readers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentrt_base.settings import ServerSettings
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.server import AgentrtServer

_SIGNING_KEY: list[str] = []


def signing_key() -> str:
    """The key file the test servers on PostgreSQL sign with (one per test process): a
    PostgreSQL server must be given its key (agentrt_base.signing_keys); a SQLite file's
    server generates its own beside the database, as in production."""
    if not _SIGNING_KEY:
        from agentrt_base.signing_keys import generate_key_file

        path = Path(tempfile.mkdtemp(prefix="agentrt-test-key-")) / "signing-key.pem"
        generate_key_file(path)
        _SIGNING_KEY.append(str(path))
    return _SIGNING_KEY[0]


class ServerThread:
    """Runs :class:`AgentrtServer` (the production composition) on an event loop in a thread,
    so tests can use plain blocking stubs against a real server on an ephemeral port."""

    def __init__(
        self,
        database_url: str,
        runtime_settings: RuntimeSettings | None = None,
        *,
        step_process: bool = True,
        **settings: Any,
    ) -> None:
        """``settings``: other ServerSettings fields (``tls``, ``listen``, ``insecure``...)."""
        if database_url.startswith("postgresql") and "signing_keys" not in settings:
            settings["signing_keys"] = (signing_key(),)
        self.settings = ServerSettings(
            **{
                "listen": "127.0.0.1:0",
                "database_url": database_url,
                "step_process": step_process,
                **settings,
            }
        )
        self.server = AgentrtServer(self.settings)
        if runtime_settings is not None:
            self.server.runtime_settings = runtime_settings
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> str:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(60)
        # (Loopback also for a server listening on every address.)
        self.address = f"127.0.0.1:{port}"
        return self.address

    def stop(self) -> None:
        """Stop the server; a stop that hangs fails the test (naming the stage it hung in)
        instead of holding up the suite, as ``serve``'s shutdown deadline would end it."""
        stopping = asyncio.run_coroutine_threadsafe(self.server.stop(0.5), self._loop)
        try:
            stopping.result(30)
        except concurrent.futures.TimeoutError:
            raise AssertionError(
                f"the server did not stop within 30 s (stuck: {self.server.stopping})"
            ) from None
        except Exception:  # a stop that failed is that test's own business, not a hang
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()


@contextlib.contextmanager
def running_server(
    database_url: str,
    runtime_settings: RuntimeSettings | None = None,
    *,
    step_process: bool = True,
) -> Iterator[str]:
    thread = ServerThread(database_url, runtime_settings, step_process=step_process)
    address = thread.start()
    try:
        yield address
    finally:
        thread.stop()


@contextlib.contextmanager
def serving(
    database_url: str, *, step_process: bool = False, **settings: Any
) -> Iterator[ServerThread]:
    """A server of its own (by default without the step writer process) with ``settings``
    (ServerSettings fields, e.g. ``auth_config``, ``tls``), for as long as the block runs; its
    address is ``.address``. Tests that need a server unlike the shared one use this, not a
    copy of it."""
    thread = ServerThread(database_url, step_process=step_process, **settings)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def rpc_error(call: Callable[..., Any], *args: Any, **kwargs: Any) -> grpc.RpcError:
    """Call and return the RpcError it must raise."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def error_details(error: grpc.RpcError) -> dict[str, Any]:
    """Decode the ``google.rpc`` details of a failed call into a dict keyed by type name."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    found: dict[str, Any] = {}
    if status is None:
        return found
    for detail in status.details:
        for cls in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.ResourceInfo,
            error_details_pb2.PreconditionFailure,
        ):
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                found[cls.DESCRIPTOR.name] = message
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
