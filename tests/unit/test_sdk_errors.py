"""How an :class:`agentrt_sdk.AgentrtError` reads on one line (agentrt_sdk/errors.py)."""

from __future__ import annotations

import grpc

from agentrt_sdk import AgentrtError
from agentrt_sdk.errors import ErrorDetails


def test_a_reason_that_is_the_code_again_is_not_repeated() -> None:
    error = AgentrtError(
        grpc.StatusCode.NOT_FOUND, "run 'run_bogus' not found", ErrorDetails(reason="NOT_FOUND")
    )
    assert error.line() == "NOT_FOUND: run 'run_bogus' not found"
    assert str(error) == "NOT_FOUND: run 'run_bogus' not found"


def test_a_reason_that_says_more_is_kept_and_the_message_is_one_line() -> None:
    error = AgentrtError(
        grpc.StatusCode.ABORTED, "the lease\nwas lost", ErrorDetails(reason="LEASE_LOST")
    )
    assert error.line() == "ABORTED: the lease was lost [LEASE_LOST]"
    assert AgentrtError(grpc.StatusCode.UNAVAILABLE, "no server").line() == (
        "UNAVAILABLE: no server"
    )
