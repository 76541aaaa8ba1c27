"""Fixtures the service suites share: stubs on the test's in-process server.

A module whose tests need ``plain_agent:prod`` (coding_agent without a completion policy)
published before they start says so once, with ``pytestmark = pytest.mark.plain_agent``.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from agentrt.registry.v1 import registry_service_pb2_grpc
from tests.runtime_support import Stubs


@pytest.fixture
def stubs(server_address: str, request: pytest.FixtureRequest) -> Iterator[Stubs]:
    """Registry, runtime and worker stubs on one channel to the test's server."""
    with Stubs.open(server_address) as opened:
        if request.node.get_closest_marker("plain_agent") is not None:
            opened.publish_plain_agent()
        yield opened


@pytest.fixture
def stub(server_address: str) -> Iterator[registry_service_pb2_grpc.RegistryServiceStub]:
    """The registry stub alone, for the registry suites."""
    with grpc.insecure_channel(server_address) as channel:
        yield registry_service_pb2_grpc.RegistryServiceStub(channel)
