"""Tag-policy conditions on attestation predicates (agentrt_core.attestation_policy): the
grammar, JSON equality (a number is not a boolean) and numeric ordering only."""

from __future__ import annotations

import pytest

from agentrt_core.attestation_policy import Attested, Condition, Requirement, unmet


@pytest.mark.parametrize(
    ("text", "predicate", "holds"),
    [
        ("passed = true", {"passed": True}, True),
        ("passed = true", {"passed": 1}, False),
        ("passed = true", {}, False),
        ("passed != true", {"passed": False}, True),
        ("score >= 0.9", {"score": 0.9}, True),
        ("score >= 0.9", {"score": 0.89}, False),
        ("score >= 0.9", {"score": "0.95"}, False),
        ("score >= 0.9", {"score": True}, False),
        ("score > 1", {"score": 2}, True),
        ("count = 3", {"count": 3.0}, True),
        ("metrics.pass_rate < 0.5", {"metrics": {"pass_rate": 0.25}}, True),
        ("metrics.pass_rate < 0.5", {"metrics": 0.25}, False),
        ('suite = "swe-bench"', {"suite": "swe-bench"}, True),
        ("result = null", {"result": None}, True),
    ],
)
def test_conditions(text: str, predicate: dict[str, object], holds: bool) -> None:
    assert Condition.parse(text).holds(predicate) is holds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("passed", "write '<field> <op> <JSON value>'"),
        ("score >= high", "is not a JSON value"),
        ('score >= "x"', "compares numbers only"),
        ("tags = [1]", "compare with a string, number, boolean or null"),
        ("1abc = 1", "write"),
    ],
)
def test_malformed_conditions_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Condition.parse(text)


def test_unmet_requires_type_signer_and_condition_together() -> None:
    need = Requirement("eval/v1", "eval-*", Condition.parse("passed = true"))
    assert unmet([need], [Attested("eval/v1", "eval-bot", {"passed": True})]) == []
    assert unmet([need], [Attested("eval/v1", "ci", {"passed": True})]) == [need]
    assert unmet([need], [Attested("slsa/v1", "eval-bot", {"passed": True})]) == [need]
    assert unmet([need], [Attested("eval/v1", "eval-bot", {"passed": False})]) == [need]
    assert unmet([Requirement("eval/v1")], [Attested("eval/v1", "anyone", {})]) == []
