"""Fixtures several service test modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrt.audit.v1 import audit_service_pb2_grpc
from tests.runtime_support import Stubs
from tests.service.audit_history import Env
from tests.support import ServerThread


@pytest.fixture
def env(server_thread: ServerThread) -> Iterator[Env]:
    """The test's server (see ``server_thread``) with its step writer, and stubs including
    the audit service's."""
    server = server_thread
    stubs = Stubs.open(server.address)
    try:
        yield Env(stubs, audit_service_pb2_grpc.AuditServiceStub(stubs.channel), server)
    finally:
        stubs.close()
