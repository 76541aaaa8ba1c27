"""The whole-suite time budget (tests/time_budget.py) fails a whole run that takes too long,
and says nothing about a subset."""

from __future__ import annotations

import pytest

from tests import time_budget

pytest_plugins = ("pytester",)


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeini("[pytest]\ntestpaths = checks\n")
    checks = pytester.mkpydir("checks")
    (checks / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(0.6)\n\ndef test_b():\n    pass\n"
    )
    # Without this checkout's other plugins (hypothesis, xdist...): a second each to load.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester


def _run(suite: pytest.Pytester, budget: str, *args: str) -> pytest.RunResult:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(time_budget.ENV_SWITCH, budget)
        return suite.runpytest_subprocess("-p", "tests.time_budget", *args)


def test_a_whole_run_over_its_budget_fails_saying_so(suite: pytest.Pytester) -> None:
    result = _run(suite, "0.3")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "time budget exceeded: the whole suite took *, its budget is 0.3 s"
            f" ({time_budget.ENV_SWITCH})*",
            "*2 passed*",
        ]
    )


def test_a_whole_run_within_its_budget_passes(suite: pytest.Pytester) -> None:
    result = _run(suite, "60")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["time budget: the whole suite took * s of its 60 s"])


@pytest.mark.parametrize(
    "args", [("checks/test_slow.py",), ("-k", "test_a"), ("-m", "not slow")], ids=str
)
def test_a_part_of_the_suite_is_not_judged(suite: pytest.Pytester, args: tuple[str, ...]) -> None:
    result = _run(suite, "0.3", *args)
    assert result.ret == pytest.ExitCode.OK
    assert "time budget" not in result.stdout.str()


def test_off_turns_it_off(suite: pytest.Pytester) -> None:
    result = _run(suite, "off")
    assert result.ret == pytest.ExitCode.OK
    assert "time budget" not in result.stdout.str()


def test_the_recorded_budget_is_the_issue_target_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(time_budget.ENV_SWITCH, raising=False)
    # Issue 26: the whole suite in at most 12 minutes on this machine.
    seconds, _ = time_budget.budget()
    assert 0 < seconds <= 12 * 60
