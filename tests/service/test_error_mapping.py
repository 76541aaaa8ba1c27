"""Domain errors reach the caller as canonical codes with google.rpc details; a bug answers
INTERNAL with an opaque id and never a traceback. Exercised through a real aio server with
the production interceptor."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
import sqlalchemy as sa

from agentrt.registry.v1 import registry_service_pb2, registry_service_pb2_grpc
from agentrt_base.grpc_errors import ErrorMappingInterceptor
from agentrt_core import errors
from tests.support import error_details


def _busy() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = 5  # SQLITE_BUSY, as the driver sets it
    return error


RAISES: dict[str, BaseException] = {
    "bad": errors.InvalidArgument(
        "definition.tools[0]: unknown tool",
        [
            errors.FieldViolation("definition.tools[0]", "unknown tool"),
            errors.FieldViolation("definition.agent_id", "must not be empty"),
        ],
    ),
    "many": errors.InvalidArgument(
        "twelve bad fields",
        [errors.FieldViolation(f"arguments.f{i}", "bad") for i in range(12)],
    ),
    "thousand": errors.InvalidArgument(
        "a thousand bad fields",
        [errors.FieldViolation(f"arguments.f{i}", "bad " * 60) for i in range(1000)],
    ),
    "missing": errors.NotFound("component", "read_file@9"),
    "taken": errors.AlreadyExists(
        "agent version",
        "coding_agent@agent_v7",
        reason="VERSION_CONFLICT",
        metadata={"existing_digest": "sha256:" + "a" * 64},
    ),
    "fence": errors.LeaseLost("lease epoch 3 is stale", metadata={"current_epoch": "4"}),
    "budget": errors.ResourceExhausted("max_steps exceeded", reason="BUDGET_EXCEEDED"),
    "state": errors.FailedPrecondition("run is COMPLETED"),
    "bug": ZeroDivisionError("secret internal detail"),
    # The database rather than the call failed: retryable codes, not INTERNAL.
    "dropped": sa.exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    ),
    "dropped-in-plain-sql": psycopg.OperationalError("consuming input failed: server closed"),
    "shutting-down": psycopg.errors.AdminShutdown("terminating connection"),
    "deadlock": psycopg.errors.DeadlockDetected("deadlock detected"),
    "busy": _busy(),
    "constraint": psycopg.errors.UniqueViolation("duplicate key value"),
}


class FailingRegistry(registry_service_pb2_grpc.RegistryServiceServicer):
    async def GetComponent(self, request: Any, context: Any) -> Any:
        raise RAISES[request.ref]


@pytest.fixture(scope="module")
def failing_stub() -> Iterator[registry_service_pb2_grpc.RegistryServiceStub]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()])
        registry_service_pb2_grpc.add_RegistryServiceServicer_to_server(FailingRegistry(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield registry_service_pb2_grpc.RegistryServiceStub(channel)
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def _fail(failing_stub: Any, key: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        failing_stub.GetComponent(registry_service_pb2.GetComponentRequest(ref=key), timeout=5)
    return info.value


def test_invalid_argument_names_every_field(failing_stub: Any) -> None:
    error = _fail(failing_stub, "bad")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = error_details(error)["BadRequest"].field_violations
    assert [v.field for v in violations] == ["definition.tools[0]", "definition.agent_id"]


def test_every_violation_that_fits_travels_and_the_rest_are_counted(failing_stub: Any) -> None:
    # Twelve short ones: all of them, and no count (nothing was left out).
    details = error_details(_fail(failing_stub, "many"))
    assert [v.field for v in details["BadRequest"].field_violations] == [
        f"arguments.f{i}" for i in range(12)
    ]
    assert "violation_count" not in details["ErrorInfo"].metadata
    # A thousand long ones: the first that fit the trailer's budget, in order, and the count;
    # the call still arrives as INVALID_ARGUMENT with its details (not a bare
    # RESOURCE_EXHAUSTED from a trailer past the client's limit).
    error = _fail(failing_stub, "thousand")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error_details(error)
    sent = [v.field for v in details["BadRequest"].field_violations]
    assert 5 <= len(sent) < 1000 and sent == [f"arguments.f{i}" for i in range(len(sent))]
    assert details["ErrorInfo"].metadata["violation_count"] == "1000"


def test_not_found_names_the_resource(failing_stub: Any) -> None:
    error = _fail(failing_stub, "missing")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    info = error_details(error)["ResourceInfo"]
    assert (info.resource_type, info.resource_name) == ("component", "read_file@9")


def test_already_exists_carries_reason_and_metadata(failing_stub: Any) -> None:
    error = _fail(failing_stub, "taken")
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    info = error_details(error)["ErrorInfo"]
    assert info.reason == "VERSION_CONFLICT"
    assert info.metadata["existing_digest"] == "sha256:" + "a" * 64


def test_stale_fence_is_aborted_lease_lost(failing_stub: Any) -> None:
    error = _fail(failing_stub, "fence")
    assert error.code() == grpc.StatusCode.ABORTED
    assert error_details(error)["ErrorInfo"].reason == "LEASE_LOST"


@pytest.mark.parametrize(
    ("key", "code", "reason"),
    [
        ("budget", grpc.StatusCode.RESOURCE_EXHAUSTED, "BUDGET_EXCEEDED"),
        ("state", grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
    ],
)
def test_other_codes(failing_stub: Any, key: str, code: grpc.StatusCode, reason: str) -> None:
    error = _fail(failing_stub, key)
    assert error.code() == code
    assert error_details(error)["ErrorInfo"].reason == reason


@pytest.mark.parametrize(
    ("key", "code", "reason"),
    [
        ("dropped", grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE"),
        ("dropped-in-plain-sql", grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE"),
        ("shutting-down", grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE"),
        ("deadlock", grpc.StatusCode.ABORTED, "TRANSACTION_CONFLICT"),
        ("busy", grpc.StatusCode.UNAVAILABLE, "DATABASE_BUSY"),
        ("constraint", grpc.StatusCode.INTERNAL, "INTERNAL"),
    ],
)
def test_a_failure_of_the_database_is_retryable_and_any_other_database_error_a_bug(
    failing_stub: Any, key: str, code: grpc.StatusCode, reason: str
) -> None:
    error = _fail(failing_stub, key)
    assert error.code() == code
    assert error_details(error)["ErrorInfo"].reason == reason
    assert "server closed" not in error.details()  # the driver's words stay in the log


def test_bug_is_internal_with_opaque_id_and_no_traceback(
    failing_stub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    error = _fail(failing_stub, "bug")
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "secret internal detail" not in error.details()
    assert "Traceback" not in error.details()
    error_id = error_details(error)["ErrorInfo"].metadata["error_id"]
    assert error_id.startswith("err_")
    assert error_id in error.details()
    # The operator, unlike the caller, gets the whole story under the same id.
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None


def test_unbuilt_rpc_answers_unimplemented_with_details(failing_stub: Any) -> None:
    """An RPC of the contract that a servicer does not implement (FailingRegistry leaves
    ListTags to the generated base class) answers UNIMPLEMENTED naming the method."""
    with pytest.raises(grpc.RpcError) as info:
        failing_stub.ListTags(registry_service_pb2.ListTagsRequest(), timeout=5)
    error = info.value
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "ListTags" in error.details()
    details = error_details(error)
    assert details["ErrorInfo"].reason == "UNIMPLEMENTED"
    assert details["ErrorInfo"].domain == "agentrt"
