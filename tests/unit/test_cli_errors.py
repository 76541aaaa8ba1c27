"""The one renderer of a refused call (``runtime_service.cli.errors``): what every client
command prints for an SDK typed error, and its exit code."""

from __future__ import annotations

import grpc
import pytest

from agentrt_sdk.errors import (
    AlreadyExistsError,
    ErrorDetails,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from runtime_service.cli import errors
from runtime_service.cli.entry import EXIT_FAILED

TARGET = "127.0.0.1:50051"


def test_the_line_is_code_message_and_a_reason_that_says_more() -> None:
    plain = NotFoundError(grpc.StatusCode.NOT_FOUND, "run 'run_x' not found")
    assert errors.describe(plain, TARGET) == "NOT_FOUND: run 'run_x' not found"
    taken = AlreadyExistsError(
        grpc.StatusCode.ALREADY_EXISTS,
        "coding_agent@agent_v7 is taken\nby other content",
        ErrorDetails(reason="LABEL_TAKEN", metadata={"existing_digest": "sha256:ab"}),
    )
    # One line, and the digest the message leaves out, for a script to read.
    assert errors.describe(taken, TARGET) == (
        "ALREADY_EXISTS: coding_agent@agent_v7 is taken by other content [LABEL_TAKEN]"
        " (existing digest: sha256:ab)"
    )


def test_unavailable_names_the_address_dialled() -> None:
    down = UnavailableError(grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert errors.describe(down, TARGET) == (
        f"UNAVAILABLE: cannot reach {TARGET}: connection refused"
    )


def test_each_field_violation_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    bad = InvalidArgumentError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid request: goal.objective: required (and 1 more)",
        ErrorDetails(
            field_violations=(
                FieldViolation("goal.objective", "required"),
                FieldViolation('labels["a b"]', "not a\nlabel key"),
            )
        ),
    )
    assert errors.report(bad, TARGET) == EXIT_FAILED
    assert capsys.readouterr().err.splitlines() == [
        "agentrt: INVALID_ARGUMENT: invalid request: goal.objective: required (and 1 more)",
        'agentrt:   labels["a b"]: not a label key',
    ]


def test_a_command_failure_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert errors.fail("two\n  lines", 2) == 2
    assert capsys.readouterr().err == "agentrt: two lines\n"
