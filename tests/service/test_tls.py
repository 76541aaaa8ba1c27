"""TLS and mTLS (issue 16, item 6), with certificates made in the test: the server answers
over TLS, refuses a client without a certificate when it requires one, picks up renewed
certificate files without a restart, and by default will not listen beyond loopback without
a way to authenticate its callers."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrt_base.settings import ServerSettings
from agentrt_base.tls import ServerTls, is_loopback
from agentrt_core.connect import PLAINTEXT_TO_TLS_HINT, ClientTls, open_channel, speaks_tls
from agentrt_sdk import AgentrtClient, RetryPolicy, UnavailableError
from runtime_service.cli.main import main as agentrt
from runtime_service.listening import StartupError
from runtime_service.server import AgentrtServer
from tests.certs import Authority
from tests.e2e.cli_support import AGENTRT, in_process, serve_env, stop, wait_ready
from tests.support import free_port, serving


@dataclass
class Files:
    root: Path

    def write(self, name: str, data: bytes) -> str:
        path = self.root / name
        path.write_bytes(data)
        return str(path)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def _check(target: str, tls: ClientTls | None) -> int:
    with open_channel(target, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        response = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(response.status)


def test_tls_serves_clients_that_trust_its_ca_and_only_over_tls(
    files: Files, sqlite_url: str
) -> None:
    ca = Authority("agentrt test CA")
    server = ca.issue("agentrt", server=True)
    tls = ServerTls(files.write("server.pem", server.cert), files.write("server.key", server.key))
    trust = ClientTls(files.write("ca.pem", ca.pem))
    with serving(sqlite_url, tls=tls) as server:
        address = server.address
        assert _check(address, trust) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as plaintext:
            _check(address, None)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
        other = ClientTls(files.write("other-ca.pem", Authority("another CA").pem))
        with pytest.raises(grpc.RpcError) as untrusted:
            _check(address, other)
        assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
        # The CLI, with --tls-ca.
        assert agentrt(["health", "--target", address, "--tls-ca", trust.ca_file]) == 0


def test_mtls_requires_a_client_certificate_of_its_ca(files: Files, sqlite_url: str) -> None:
    ca = Authority("agentrt test CA")
    server = ca.issue("agentrt", server=True)
    client = ca.issue("ci-publisher", server=False)
    stranger = Authority("stranger CA").issue("intruder", server=False)
    tls = ServerTls(
        files.write("server.pem", server.cert),
        files.write("server.key", server.key),
        client_ca_file=files.write("clients.pem", ca.pem),
    )
    ca_file = files.write("ca.pem", ca.pem)
    with serving(sqlite_url, tls=tls) as server:
        address = server.address
        with pytest.raises(grpc.RpcError) as anonymous:
            _check(address, ClientTls(ca_file))
        assert anonymous.value.code() == grpc.StatusCode.UNAVAILABLE
        forged = ClientTls(
            ca_file, files.write("intruder.pem", stranger.cert), files.write("i.key", stranger.key)
        )
        with pytest.raises(grpc.RpcError):
            _check(address, forged)
        known = ClientTls(
            ca_file, files.write("client.pem", client.cert), files.write("client.key", client.key)
        )
        assert _check(address, known) == health_pb2.HealthCheckResponse.SERVING
        command = ["health", "--target", address, "--tls-ca", ca_file]
        assert (
            agentrt(
                [*command, "--tls-cert", known.cert_file or "", "--tls-key", known.key_file or ""]
            )
            == 0
        )
        assert agentrt(command) != 0
        # The SDK's asyncio channel, with the same credentials.
        assert asyncio.run(_sdk_threads(address, known)) == []
        with pytest.raises(UnavailableError):
            asyncio.run(_sdk_threads(address, ClientTls(ca_file)))


async def _sdk_threads(address: str, tls: ClientTls) -> list[Any]:
    fast = RetryPolicy(attempts=1)
    async with AgentrtClient(address, tls=tls, retry=fast, timeout=5) as client:
        return await client.threads.list()


def test_renewed_certificate_files_are_used_without_a_restart(
    files: Files, sqlite_url: str
) -> None:
    old_ca, new_ca = Authority("old CA"), Authority("new CA")
    first = old_ca.issue("agentrt", server=True)
    tls = ServerTls(files.write("server.pem", first.cert), files.write("server.key", first.key))
    trusts_old = ClientTls(files.write("old.pem", old_ca.pem))
    trusts_new = ClientTls(files.write("new.pem", new_ca.pem))
    with serving(sqlite_url, tls=tls) as server:
        address = server.address
        assert _check(address, trusts_old) == health_pb2.HealthCheckResponse.SERVING
        renewed = new_ca.issue("agentrt", server=True)
        # As a renewal would: the key, then the certificate (a later mtime for both).
        files.write("server.key", renewed.key)
        files.write("server.pem", renewed.cert)
        later = (dt.datetime.now().timestamp() + 5,) * 2
        for name in ("server.key", "server.pem"):
            os.utime(files.root / name, later)
        assert _check(address, trusts_new) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError):
            _check(address, trusts_old)


def test_it_listens_beyond_loopback_only_when_told_or_with_mtls(
    files: Files, sqlite_url: str
) -> None:
    assert is_loopback("127.0.0.1:50051") and is_loopback("[::1]:1") and is_loopback("localhost:1")
    assert not is_loopback("0.0.0.0:50051") and not is_loopback("[::]:1")
    assert not is_loopback("agentrt.internal:50051")
    refused = AgentrtServer(ServerSettings(listen="0.0.0.0:0", database_url=sqlite_url))
    with pytest.raises(StartupError, match="--insecure"):
        asyncio.run(refused.start())
    with serving(sqlite_url, listen="0.0.0.0:0", insecure=True) as server:
        address = server.address
        assert _check(address, None) == health_pb2.HealthCheckResponse.SERVING
    ca = Authority("agentrt test CA")
    server, client = ca.issue("agentrt", server=True), ca.issue("w", server=False)
    mtls = ServerTls(
        files.write("s.pem", server.cert),
        files.write("s.key", server.key),
        client_ca_file=files.write("c.pem", ca.pem),
    )
    with serving(sqlite_url, listen="0.0.0.0:0", tls=mtls) as server:
        address = server.address
        known = ClientTls(
            files.write("ca.pem", ca.pem),
            files.write("w.pem", client.cert),
            files.write("w.key", client.key),
        )
        assert _check(address, known) == health_pb2.HealthCheckResponse.SERVING


def test_the_serve_command_refuses_an_incomplete_tls_configuration(sqlite_url: str) -> None:
    for flags in (["--tls-cert", "x.pem"], ["--tls-key", "x.key"], ["--client-ca", "ca.pem"]):
        assert agentrt(["serve", "--database-url", sqlite_url, *flags]) == 3


def _plain_env(tmp: Path) -> dict[str, str]:
    """An environment naming no CA, target or token (a developer's shell may set them)."""
    return {"PATH": os.environ["PATH"], "HOME": str(tmp), "COLUMNS": "200"}


def test_a_plaintext_client_of_a_tls_server_is_told_to_pass_its_ca(
    files: Files, sqlite_url: str, server_address: str
) -> None:
    """Issue 27, item 5: a plaintext call to a TLS server failed "UNAVAILABLE ... Socket
    closed" and nothing more. The CLI (a registry, an operator and the health command) and
    the SDK now add that the server speaks TLS and which option names its CA; a server that
    does not speak TLS (the module's plaintext one) or nothing listening gets no such hint."""
    ca = Authority("agentrt test CA")
    server = ca.issue("agentrt", server=True)
    tls = ServerTls(files.write("server.pem", server.cert), files.write("server.key", server.key))
    env = _plain_env(files.root)
    with serving(sqlite_url, tls=tls) as server:
        address = server.address
        assert speaks_tls(address)
        for command in (
            ["health", "--target", address, "--timeout", "3"],
            ["versions", "coding_agent", "--target", address, "--timeout", "3"],
            ["threads", "list", "--target", address, "--timeout", "3"],
        ):
            result = in_process(command, env)
            assert result.returncode != 0, command
            assert "UNAVAILABLE" in result.stderr, (command, result.stderr)
            assert PLAINTEXT_TO_TLS_HINT in result.stderr, (command, result.stderr)
            assert "--tls-ca PATH (env AGENTRT_TLS_CA" in result.stderr
        with pytest.raises(UnavailableError) as sdk:
            asyncio.run(_sdk_plaintext_threads(address))
        assert PLAINTEXT_TO_TLS_HINT in sdk.value.message
        assert PLAINTEXT_TO_TLS_HINT in str(sdk.value)
        # With the CA named in the environment the command works (and is not probed).
        trusted = in_process(
            ["health", "--target", address],
            {**env, "AGENTRT_TLS_CA": files.write("ca.pem", ca.pem)},
        )
        assert trusted.returncode == 0, trusted.stderr
    # A plaintext server is no TLS server; a closed port is told nothing about TLS.
    assert not speaks_tls(server_address)
    closed = f"127.0.0.1:{free_port()}"
    refused = in_process(["health", "--target", closed, "--timeout", "3"], env)
    assert refused.returncode != 0 and "UNAVAILABLE" in refused.stderr
    assert "TLS" not in refused.stderr, refused.stderr


async def _sdk_plaintext_threads(address: str) -> list[Any]:
    async with AgentrtClient(address, retry=RetryPolicy(attempts=1), timeout=5) as client:
        return await client.threads.list()


def test_the_server_logs_no_raw_grpc_handshake_line_for_a_plaintext_client(
    files: Files, sqlite_url: str
) -> None:
    """Issue 27, item 5: `agentrt serve` printed gRPC core's "Handshake failed with error
    SSL_ERROR_SSL: ... WRONG_VERSION_NUMBER" INFO line for each plaintext client, which reads
    like a fault of the server. The command now defaults GRPC_VERBOSITY to ERROR (gRPC offers
    no hook to log a failed handshake in its place: the client is the one told,
    test above). A real process: the setting must precede gRPC's import."""
    ca = Authority("agentrt test CA")
    server = ca.issue("agentrt", server=True)
    port = free_port()
    env = serve_env()
    env.pop("GRPC_VERBOSITY", None)  # this process set it when it imported the CLI
    process = subprocess.Popen(
        [
            *AGENTRT,
            "serve",
            "--database-url",
            sqlite_url,
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert",
            files.write("server.pem", server.cert),
            "--tls-key",
            files.write("server.key", server.key),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(process)
        with pytest.raises(grpc.RpcError) as plaintext:
            _check(f"127.0.0.1:{port}", None)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
        assert _check(f"127.0.0.1:{port}", ClientTls(files.write("ca.pem", ca.pem))) == 1
    finally:
        stop(process)
    assert process.stderr is not None
    rest = process.stderr.read()
    assert "agentrt stopped" in rest, rest
    assert "Handshake failed" not in rest and "ssl_transport_security" not in rest, rest
