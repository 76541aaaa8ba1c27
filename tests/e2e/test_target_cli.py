"""``--target`` given a URL (issue 27, item 8): every client command refuses it with one line
naming the address to use, exit 2 (a bad command line), instead of gRPC's "Misformatted
domain name" after a wait. No server is needed: the command stops before dialling."""

from __future__ import annotations

import os

import pytest

from tests.e2e.cli_support import checkout_env, in_process

pytestmark = pytest.mark.e2e

LINE = "agentrt: --target takes HOST:PORT, not a URL (http://127.0.0.1:50051): use 127.0.0.1:50051"


def _env() -> dict[str, str]:
    return checkout_env({k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")})


@pytest.mark.parametrize(
    "command",
    [
        ("health",),  # agentrt's own
        ("show", "coding_agent:prod"),  # the registry commands
        ("audit", "run_01M901FHPRTQXGWTRPP272MSZC"),  # the audit commands
        ("runs", "list"),  # the operator commands (the SDK's client)
        ("watch", "run_01M901FHPRTQXGWTRPP272MSZC"),
    ],
    ids=" ".join,
)
def test_every_client_command_refuses_a_url_in_one_line(command: tuple[str, ...]) -> None:
    result = in_process([*command, "--target", "http://127.0.0.1:50051"], _env())
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [LINE]
    assert result.stdout == ""


def test_a_url_in_the_environment_is_refused_alike() -> None:
    env = {**_env(), "AGENTRT_TARGET": "http://127.0.0.1:50051"}
    result = in_process(["runs", "list"], env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "agentrt: AGENTRT_TARGET takes HOST:PORT, not a URL (http://127.0.0.1:50051): use"
        " 127.0.0.1:50051"
    ]
