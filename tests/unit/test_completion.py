"""Completion checks decided from ledger facts (``agentrt_core.completion``), and what a
completion policy with conditions must name to be published (``agentrt_core.publishing``)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt_core.canonical import ComponentKind
from agentrt_core.completion import (
    Attestation,
    Check,
    LedgerFacts,
    Outcome,
    StepMark,
    checks_of,
    evaluate,
)
from agentrt_core.errors import InvalidArgument
from agentrt_core.model import ComponentDraft
from agentrt_core.publishing import digest_component

ARTIFACT = Check("diff", condition="ARTIFACT_EXISTS", artifact_kind="diff")
TESTS = Check("tests", condition="TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", tool="run_tests")
OPEN = Check("open", condition="NO_OPEN_STEPS")
ATTESTED = Check("reviewed")


def one(check: Check, facts: LedgerFacts) -> Any:
    [result] = evaluate((check,), facts)
    return result


def test_checks_are_read_from_the_policy_spec() -> None:
    spec = {"checks": [{"name": "reviewed"}, {"name": "diff", **_needs("ARTIFACT_EXISTS")}]}
    assert checks_of(spec) == (
        ATTESTED,
        Check("diff", condition="ARTIFACT_EXISTS", artifact_kind="diff"),
    )
    assert checks_of(None) == ()
    assert not ATTESTED.by_runtime and ARTIFACT.by_runtime


def _needs(condition: str) -> dict[str, str]:
    return {"condition": condition, "artifact_kind": "diff"}


def test_an_artifact_of_the_kind_is_the_evidence() -> None:
    assert one(ARTIFACT, LedgerFacts()).outcome is Outcome.FAILED
    found = one(ARTIFACT, LedgerFacts(artifacts={"diff": ["art_1", "art_2"]}))
    assert (found.outcome, found.artifact_ids) == (Outcome.PASSED, ("art_1", "art_2"))
    other = one(ARTIFACT, LedgerFacts(artifacts={"report": ["art_3"]}))
    assert other.outcome is Outcome.FAILED


@pytest.mark.parametrize(
    ("success", "side_effect", "outcome"),
    [
        (None, None, Outcome.FAILED),
        (None, StepMark("stp_p", 3), Outcome.FAILED),
        (StepMark("stp_t", 5), None, Outcome.PASSED),
        (StepMark("stp_t", 5), StepMark("stp_p", 3), Outcome.PASSED),
        (StepMark("stp_t", 5), StepMark("stp_t", 5), Outcome.PASSED),  # the tool's own
        (StepMark("stp_t", 5), StepMark("stp_p", 7), Outcome.FAILED),
    ],
)
def test_a_tool_must_succeed_after_the_last_side_effect(
    success: StepMark | None, side_effect: StepMark | None, outcome: Outcome
) -> None:
    facts = LedgerFacts(
        tool_successes={"run_tests": success} if success else {}, last_side_effect=side_effect
    )
    result = one(TESTS, facts)
    assert result.outcome is outcome
    if success is not None:
        assert result.step_ids[0] == success.step_id


def test_open_steps_are_named() -> None:
    assert one(OPEN, LedgerFacts()).outcome is Outcome.PASSED
    left = one(OPEN, LedgerFacts(open_steps=["stp_a"]))
    assert (left.outcome, left.step_ids) == (Outcome.FAILED, ("stp_a",))


def test_an_attested_check_follows_the_workers_latest_word() -> None:
    def by(status: str, retryable: bool = False) -> Any:
        attestation = Attestation("stp_c", status, retryable, "worker-7")
        return one(ATTESTED, LedgerFacts(attestations={"reviewed": attestation}))

    assert one(ATTESTED, LedgerFacts()).outcome is Outcome.MISSING
    passed = by("SUCCEEDED")
    assert (passed.outcome, passed.step_ids, passed.attested_by) == (
        Outcome.PASSED,
        ("stp_c",),
        "worker-7",
    )
    assert by("FAILED", retryable=True).outcome is Outcome.MISSING
    assert by("FAILED").outcome is Outcome.FAILED


def _policy(*checks: dict[str, Any]) -> ComponentDraft:
    return ComponentDraft(
        ComponentKind.COMPLETION_POLICY, "done", "1", "", {"checks": list(checks)}
    )


def test_a_condition_names_exactly_what_it_looks_for() -> None:
    ok = _policy(
        {"name": "a", "condition": "ARTIFACT_EXISTS", "artifact_kind": "diff"},
        {"name": "b", "condition": "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", "tool": "run_tests"},
        {"name": "c", "condition": "NO_OPEN_STEPS"},
        {"name": "d"},
    )
    digest_component(ok)
    bad = _policy(
        {"name": "a", "condition": "ARTIFACT_EXISTS"},
        {"name": "b", "condition": "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", "artifact_kind": "x"},
        {"name": "c", "condition": "NO_OPEN_STEPS", "tool": "run_tests"},
        {"name": "d", "tool": "run_tests"},
        {"name": "e", "condition": "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS", "tool": "Not A Name"},
    )
    with pytest.raises(InvalidArgument) as info:
        digest_component(bad)
    fields = sorted(v.field for v in info.value.violations)
    assert fields == [
        "component.spec.completion_policy.checks[0].artifact_kind",
        "component.spec.completion_policy.checks[1].artifact_kind",
        "component.spec.completion_policy.checks[1].tool",
        "component.spec.completion_policy.checks[2].tool",
        "component.spec.completion_policy.checks[3].tool",
        "component.spec.completion_policy.checks[4].tool",
    ]
