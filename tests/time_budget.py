"""The whole suite's time budget (issue 26): `make test` fails when the suite took longer than
``tests/time_budget.toml`` allows, so the change that adds the next slow fixture or test is
the one that finds out, not a developer weeks later.

It applies only to a run of the whole suite as ``make test`` starts it (the default test
paths, nothing deselected, every test passed): a subset, a ``-k``, or a failing run says
nothing about the budget. ``AGENTRT_TEST_TIME_BUDGET`` overrides the file: a number of
seconds, or ``off`` for runs slowed on purpose (coverage, a machine kept busy to prove the
suite is robust), which say so.
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path

import pytest

BUDGET_FILE = Path(__file__).with_name("time_budget.toml")
ENV_SWITCH = "AGENTRT_TEST_TIME_BUDGET"

_started = time.monotonic()
_deselected = 0
#: Whether the budget was exceeded, and the line that says so (None: it did not apply).
_verdict: tuple[bool, str] | None = None


def budget() -> tuple[float, str]:
    """The budget in seconds, and where it was set."""
    override = os.environ.get(ENV_SWITCH, "")
    if override and override.lower() != "off":
        return float(override), ENV_SWITCH
    with BUDGET_FILE.open("rb") as f:
        return float(tomllib.load(f)["whole_suite_seconds"]), str(BUDGET_FILE)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.monotonic()


def pytest_deselected(items: list[pytest.Item]) -> None:
    global _deselected
    _deselected += len(items)


def _applies(session: pytest.Session) -> bool:
    config = session.config
    if os.environ.get(ENV_SWITCH, "").lower() == "off":
        return False
    # An xdist worker runs part of the suite; the controller judges the whole.
    if hasattr(config, "workerinput"):
        return False
    return (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not config.getoption("keyword")
        and not config.getoption("markexpr")
        and _deselected == 0
        and session.testscollected > 0
        and session.testsfailed == 0
        and session.exitstatus == pytest.ExitCode.OK
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _verdict
    if not _applies(session):
        return
    took = time.monotonic() - _started
    allowed, source = budget()
    if took <= allowed:
        _verdict = (False, f"time budget: the whole suite took {took:.1f} s of its {allowed:g} s")
        return
    _verdict = (
        True,
        f"time budget exceeded: the whole suite took {took:.1f} s, its budget is "
        f"{allowed:g} s ({source}). --durations lists the slowest tests; "
        "docs/testing.md says how to make a test that needs a server cheap.",
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _verdict is not None:
        exceeded, line = _verdict
        terminalreporter.write_line(line, red=exceeded, bold=exceeded)
