"""Authentication (issue 16, item 1, in part): static API tokens and mTLS client certificates
as principals, from one file read again on SIGHUP. Without credentials a configured server
answers UNAUTHENTICATED to every agentrt call (health stays open); with a known token or a
known client certificate it serves. Both engines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrt.registry.v1 import message_pb2 as mpb
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import runtime_service_pb2_grpc, worker_service_pb2_grpc
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.auth import AuthConfig, token_hash
from agentrt_base.limits import Kind
from agentrt_base.tls import ServerTls
from agentrt_core.connect import ClientTls, open_channel
from runtime_service.cli.main import main as agentrt
from tests.certs import Authority
from tests.support import error_details, rpc_error, serving


def _create(config: Path, name: str, *flags: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert agentrt(["token", "create", name, *flags, "--config", str(config)]) == 0
    return capsys.readouterr().out.strip()


def _list_threads(channel: grpc.Channel, token: str | None) -> Any:
    stub = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    return stub.ListThreads(pb.ListThreadsRequest(), timeout=5, metadata=metadata)


def _refused(channel: grpc.Channel, token: str | None) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _list_threads(channel, token)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_details(refused.value)["ErrorInfo"].reason == "UNAUTHENTICATED"


def test_token_create_prints_the_token_once_and_keeps_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "auth.toml"
    token = _create(config, "ci", "--role", "publisher", "--scope", "coding_agent*", capsys=capsys)
    assert token.startswith("agentrt_") and len(token) > 40
    text = config.read_text()
    assert token not in text and token_hash(token) in text
    principal = AuthConfig.load(str(config)).by_token_hash[token_hash(token)]
    assert (principal.name, principal.roles, principal.scopes) == (
        "ci",
        ("publisher",),
        ("coding_agent*",),
    )
    with pytest.raises(SystemExit):  # argparse: not a role
        agentrt(["token", "create", "x", "--role", "root", "--config", str(config)])


def test_calls_need_a_known_token_and_the_file_is_read_again(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "auth.toml"
    token = _create(config, "client-a", "--role", "client", capsys=capsys)
    with serving(database_url, auth_config=str(config)) as thread:
        address = f"127.0.0.1:{thread.server.port}"
        with grpc.insecure_channel(address) as channel:
            _refused(channel, None)
            _refused(channel, "agentrt_guessed")
            _list_threads(channel, token)
            health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
            # A token added while it runs works once the file is read again (SIGHUP).
            later = _create(config, "client-b", "--role", "client", capsys=capsys)
            _refused(channel, later)
            assert thread.server.authenticator.reload()
            _list_threads(channel, later)
            # Revoked: the file without client-a's entry.
            text = config.read_text()
            config.write_text(text.replace(token_hash(token), token_hash("revoked" * 8)))
            assert thread.server.authenticator.reload()
            _refused(channel, token)
            # A file that does not load keeps the configuration in use.
            config.write_text("[[tokens]]\nprincipal = 3\n")
            assert not thread.server.authenticator.reload()
            _list_threads(channel, later)
        # The command line sends --token.
        assert agentrt(["versions", "coding_agent", "--target", address]) != 0
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        agentrt(["versions", "coding_agent", "--target", address, "--token", later])
        assert "UNAUTHENTICATED" not in capsys.readouterr().err


def test_a_known_client_certificate_is_a_principal(tmp_path: Path, sqlite_url: str) -> None:
    ca = Authority("agentrt test CA")
    server, known, unknown = (
        ca.issue("agentrt", server=True),
        ca.issue("worker-1", server=False),
        ca.issue("worker-2", server=False),
    )

    def write(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    config = tmp_path / "auth.toml"
    token = "agentrt_" + "c" * 43
    config.write_text(
        '[[certificates]]\nsan = "spiffe://agentrt.test/worker-1"\nprincipal = "worker-1"\n'
        'roles = ["worker"]\n'
        f'[[tokens]]\nprincipal = "client-a"\nhash = "{token_hash(token)}"\nroles = ["client"]\n'
    )
    tls = ServerTls(
        write("s.pem", server.cert), write("s.key", server.key), write("ca.pem", ca.pem)
    )
    # mTLS and a principals file: listening beyond loopback needs no --insecure.
    with serving(sqlite_url, tls=tls, auth_config=str(config), listen="0.0.0.0:0") as thread:
        address = f"127.0.0.1:{thread.server.port}"
        ca_file = str(tmp_path / "ca.pem")
        as_known = ClientTls(ca_file, write("k.pem", known.cert), write("k.key", known.key))
        with open_channel(address, as_known) as channel:
            _list_threads(channel, None)
            # A credential presented is judged, not ignored beside an admitted certificate
            # (issue 25): an unknown or malformed bearer token refuses the call.
            _refused(channel, "agentrt_guessed")
            _refused(channel, "agentrt_guessed ")
            # A valid token beside the certificate: the token's principal is the caller (the
            # refusal names whom it judged).
            runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
            for bearer, principal in ((None, "worker-1"), (token, "client-a")):
                metadata = [("authorization", f"Bearer {bearer}")] if bearer else None
                denied = rpc_error(
                    runtime.CreateThread,
                    pb.CreateThreadRequest(namespace="team-b"),
                    timeout=5,
                    metadata=metadata,
                )
                assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
                assert error_details(denied)["ErrorInfo"].metadata["principal"] == principal
            # Removing the certificate's entry ends the long poll it has open (issue 25).
            worker = worker_service_pb2_grpc.WorkerServiceStub(channel)
            waiting = worker.AcquireRun.future(
                wpb.AcquireRunRequest(worker_id="w1", wait=duration_pb2.Duration(seconds=15)),
                timeout=20,
            )
            deadline = time.monotonic() + 10  # the call is in the server, not only sent
            while thread.server.limiter.held(Kind.LONG_POLL, "worker-1") == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            config.write_text(
                f'[[tokens]]\nprincipal = "other"\nhash = "{token_hash("x" * 40)}"\n'
                'roles = ["client"]\n'
            )
            assert thread.server.authenticator.reload()
            ended = waiting.exception(timeout=20)
            assert ended is not None and ended.code() == grpc.StatusCode.UNAUTHENTICATED
        as_unknown = ClientTls(ca_file, write("u.pem", unknown.cert), write("u.key", unknown.key))
        with open_channel(address, as_unknown) as channel:
            _refused(channel, None)


def test_a_principals_file_that_does_not_load_stops_the_start(
    tmp_path: Path, sqlite_url: str
) -> None:
    config = tmp_path / "auth.toml"
    config.write_text('[[tokens]]\nprincipal = "x"\nhash = "md5:abc"\n')
    assert agentrt(["serve", "--database-url", sqlite_url, "--auth-config", str(config)]) == 3


def test_a_refusal_names_the_scope_role_or_namespace_that_would_allow_it(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27, item 4: the README's CI token (scope 'coding_agent*') publishing the example
    was refused "ci may not registry.publish for 'repo-debug'", leaving the operator to guess
    what to grant. The message and the ErrorInfo metadata now say it."""
    config = tmp_path / "auth.toml"
    ci = _create(config, "ci", "--role", "publisher", "--scope", "coding_agent*", capsys=capsys)
    team_a = _create(config, "team-a", "--role", "client", "--namespace", "team-a", capsys=capsys)

    def refusal(call: Any, request: Any, token: str) -> tuple[str, Any]:
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=5, metadata=[("authorization", f"Bearer {token}")])
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        return str(refused.value.details()), error_details(refused.value)["ErrorInfo"]

    with (
        serving(database_url, auth_config=str(config)) as thread,
        grpc.insecure_channel(f"127.0.0.1:{thread.server.port}") as channel,
    ):
        registry = registry_service_pb2_grpc.RegistryServiceStub(channel)
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)

        skill = rpb.PublishComponentRequest(
            component=mpb.ComponentDraft(name="repo-debug", version="2.1.0")
        )
        message, info = refusal(registry.PublishComponent, skill, ci)
        assert info.reason == "OUTSIDE_SCOPE"
        assert info.metadata["needs_scope"] == "repo-debug"
        assert "needs_namespace" not in info.metadata
        assert "a scope matching 'repo-debug', such as 'repo-debug' or '*'" in message
        assert "its scopes: 'coding_agent*'" in message

        tag = rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest="sha256:" + "0" * 64)
        message, info = refusal(registry.SetTag, tag, ci)
        assert info.reason == "ROLE_MISSING"
        assert info.metadata["roles"] == "tag-admin,admin"
        assert "roles that do: tag-admin, admin" in message
        assert "its roles: 'publisher'" in message

        elsewhere = pb.CreateThreadRequest(title="t", namespace="team-b")
        message, info = refusal(runtime.CreateThread, elsewhere, team_a)
        assert info.reason == "OUTSIDE_SCOPE"
        assert info.metadata["needs_namespace"] == "team-b"
        assert "needs_scope" not in info.metadata
        assert "it needs namespace 'team-b' (its namespaces: 'team-a')" in message
