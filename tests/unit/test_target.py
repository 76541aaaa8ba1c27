"""``--target``: a host named without a port means agentrt's port, not gRPC's 443."""

from __future__ import annotations

import pytest

from agentrt_core.connect import DEFAULT_PORT, TargetError, resolve_target, with_default_port
from agentrt_sdk import AgentrtClient


@pytest.mark.parametrize(
    ("given", "dialled"),
    [
        ("agentrt.internal", f"agentrt.internal:{DEFAULT_PORT}"),
        ("10.0.0.7", f"10.0.0.7:{DEFAULT_PORT}"),
        ("[::1]", f"[::1]:{DEFAULT_PORT}"),
        ("::1", f"[::1]:{DEFAULT_PORT}"),
        ("agentrt.internal:443", "agentrt.internal:443"),
        ("127.0.0.1:7000", "127.0.0.1:7000"),
        ("[::1]:7000", "[::1]:7000"),
        # An explicit gRPC scheme says exactly what to dial.
        ("dns:///agentrt.internal", "dns:///agentrt.internal"),
        ("unix:/run/agentrt.sock", "unix:/run/agentrt.sock"),
        ("ipv4:10.0.0.7:7000", "ipv4:10.0.0.7:7000"),
    ],
)
def test_a_host_without_a_port_gets_the_agentrt_port(given: str, dialled: str) -> None:
    assert with_default_port(given) == dialled


def test_the_flag_then_the_environment_then_the_default_each_get_the_port() -> None:
    env = {"AGENTRT_TARGET": "from-env"}
    assert resolve_target("from-flag", env) == f"from-flag:{DEFAULT_PORT}"
    assert resolve_target(None, env) == f"from-env:{DEFAULT_PORT}"
    assert resolve_target(None, {}) == f"127.0.0.1:{DEFAULT_PORT}"


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            "http://127.0.0.1:50051",
            "--target takes HOST:PORT, not a URL (http://127.0.0.1:50051): use 127.0.0.1:50051",
        ),
        (
            "https://agentrt.internal",
            "--target takes HOST:PORT, not a URL (https://agentrt.internal): use"
            f" agentrt.internal:{DEFAULT_PORT} with --tls-ca",
        ),
        (
            "grpc://[::1]:7000/",
            "--target takes HOST:PORT, not a URL (grpc://[::1]:7000/): use [::1]:7000",
        ),
    ],
)
def test_a_url_is_refused_with_the_address_to_use_instead(given: str, line: str) -> None:
    """gRPC read ``http://127.0.0.1:50051`` as a host named ``http`` ("Misformatted domain
    name"); a scheme does not say whether to use TLS here, ``--tls-ca`` does."""
    with pytest.raises(TargetError) as refused:
        resolve_target(given, {})
    assert str(refused.value) == line


def test_a_url_in_the_environment_is_refused_naming_the_variable() -> None:
    with pytest.raises(TargetError, match=r"^AGENTRT_TARGET takes HOST:PORT, not a URL"):
        resolve_target(None, {"AGENTRT_TARGET": "http://127.0.0.1:50051"})


def test_the_sdk_client_refuses_a_url_alike() -> None:
    with pytest.raises(TargetError, match=r"use 127\.0\.0\.1:50051$"):
        AgentrtClient("http://127.0.0.1:50051")
