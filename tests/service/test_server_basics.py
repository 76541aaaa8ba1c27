"""The server as a client sees it: health, reflection, UNIMPLEMENTED for unbuilt RPCs."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from runtime_service.reflection import V1_REQUEST, V1_RESPONSE
from runtime_service.server import SERVICE_NAMES

AGENTRT_SERVICES = {
    "agentrt.registry.v1.RegistryService",
    "agentrt.runtime.v1.RuntimeService",
    "agentrt.runtime.v1.WorkerService",
    "agentrt.audit.v1.AuditService",
}


def test_service_names_are_the_contracts() -> None:
    assert set(SERVICE_NAMES) == AGENTRT_SERVICES


def test_health_serving_for_server_and_each_service(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", *sorted(AGENTRT_SERVICES)):
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_list_answers_every_service_without_a_traceback(
    server_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    """grpc.health.v1.Health/List is part of the health contract the server registers; it
    answers the same statuses Check does, and logs nothing (it once raised in the handler and
    logged a traceback on every call)."""
    caplog.set_level(logging.DEBUG)
    with grpc.insecure_channel(server_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(3):
            response = stub.List(health_pb2.HealthListRequest(), timeout=5)
            assert set(response.statuses) == {"", *AGENTRT_SERVICES}
            for service, status in response.statuses.items():
                assert status.status == health_pb2.HealthCheckResponse.SERVING, service
    noisy = [
        r
        for r in caplog.records
        if r.exc_info or "Traceback" in r.getMessage() or r.levelno >= logging.ERROR
    ]
    assert not noisy, [r.getMessage() for r in noisy]


def test_reflection_lists_the_four_services(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        listed = {s.name for r in responses for s in r.list_services_response.service}
    assert listed >= AGENTRT_SERVICES
    assert "grpc.health.v1.Health" in listed


def test_reflection_serves_file_descriptors(server_address: str) -> None:
    """A client without the protos (grpcurl, Postman) can fetch the contract itself."""
    with grpc.insecure_channel(server_address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = list(
            stub.ServerReflectionInfo(
                iter(
                    [
                        reflection_pb2.ServerReflectionRequest(
                            file_containing_symbol="agentrt.runtime.v1.WorkerService"
                        )
                    ]
                ),
                timeout=5,
            )
        )
    assert responses[0].file_descriptor_response.file_descriptor_proto


def test_reflection_v1_lists_the_services_and_describes_itself(server_address: str) -> None:
    """Current grpcurl asks for grpc.reflection.v1 first (v1alpha only when that is
    UNIMPLEMENTED); a v1 client gets the same answers."""
    with grpc.insecure_channel(server_address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=V1_REQUEST.SerializeToString,
            response_deserializer=V1_RESPONSE.FromString,
        )
        listed, described, contract = info(
            iter(
                [
                    V1_REQUEST(list_services=""),
                    V1_REQUEST(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
                    V1_REQUEST(file_containing_symbol="agentrt.registry.v1.RegistryService"),
                ]
            ),
            timeout=5,
        )
    names = {s.name for s in listed.list_services_response.service}
    assert names >= AGENTRT_SERVICES | {
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    # `grpcurl describe` of the v1 service: its file, in its own package.
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    (own,) = files
    assert (own.name, own.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    (service,) = own.service
    (method,) = service.method
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
    assert method.client_streaming and method.server_streaming
    contract_files = {
        descriptor_pb2.FileDescriptorProto.FromString(raw).name
        for raw in contract.file_descriptor_response.file_descriptor_proto
    }
    assert "agentrt/registry/v1/registry_service.proto" in contract_files


def test_unknown_rpc_answers_unimplemented(server_address: str) -> None:
    """A method the server does not have (a client built against a newer contract) gets a
    clean UNIMPLEMENTED, not a crash or a hang. How an agentrt servicer's own unbuilt method
    answers (with ErrorInfo) is tested in test_error_mapping.py."""
    with grpc.insecure_channel(server_address) as channel:
        call = channel.unary_unary("/agentrt.audit.v1.AuditService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
