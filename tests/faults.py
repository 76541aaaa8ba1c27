"""Helpers for the database fault tests: a server with chosen database settings, health."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import runtime_service_pb2_grpc
from agentrt_base.settings import DatabaseSettings
from runtime_service.server import AgentrtServer
from tests.support import ServerThread, error_details


@contextlib.contextmanager
def server_with(database_url: str, settings: DatabaseSettings) -> Iterator[str]:
    """The production composition on an ephemeral port, with these database settings."""
    thread = ServerThread(database_url)
    thread.settings = dataclasses.replace(thread.settings, database=settings)
    thread.server = AgentrtServer(thread.settings)
    address = thread.start()
    try:
        yield address
    finally:
        thread.stop()


class Client:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.runtime = runtime_service_pb2_grpc.RuntimeServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def status(self) -> int:
        return int(self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)

    def wait_status(self, status: int, within: float) -> float:
        """Seconds until health reads ``status``; fails after ``within``."""
        start = time.monotonic()
        while time.monotonic() - start < within:
            if self.status() == status:
                return time.monotonic() - start
            time.sleep(0.05)
        raise AssertionError(
            f"health not {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
            f" within {within} s"
        )

    def create_thread(self, title: str, request_id: str = "", pad: int = 0) -> str:
        request = pb.CreateThreadRequest(title=title, request_id=request_id)
        if pad:
            request.metadata["pad"] = "x" * pad
        return str(self.runtime.CreateThread(request, timeout=30).thread.id)

    def refusal(
        self, title: str, request_id: str = "", pad: int = 0
    ) -> tuple[grpc.StatusCode, str]:
        """The code and ErrorInfo reason of a CreateThread expected to be refused."""
        try:
            self.create_thread(title, request_id, pad)
        except grpc.RpcError as error:
            return error.code(), error_details(error)["ErrorInfo"].reason
        raise AssertionError("the call succeeded")


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
