"""``--target``: a host named without a port means agentrt's port, not gRPC's 443."""

from __future__ import annotations

import pytest

from agentrt_base.settings import DEFAULT_PORT, resolve_target, with_default_port


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
