"""Completion checks, pure: what the bound completion policy's checks say about a run when its
worker claims completion (FinishAttempt SUCCEEDED_COMPLETE_RUN).

A check is either attested by the worker (a COMPLETION_CHECK step it records) or evaluated by
the runtime from the ledger (its ``condition``: an artifact of a kind exists; a tool call
succeeded after the last step with side effects; no step is left open). The store reads the
facts the policy's checks need (``store/completion.py``), :func:`evaluate` decides each check
from them, and ``services/leases.py`` acts on the verdict. Each check is:

* PASSED, with its evidence: the step and artifact ids it rests on, and for an attested check
  the principal of the worker whose attempt attested it;
* FAILED, for good: it cannot pass any more in this run. A runtime-evaluated check fails for
  good when it does not hold at the claim (the claim is the worker saying the work is done,
  and the ledger says it is not); an attested one when the worker's latest word on it (its
  latest COMPLETION_CHECK step that ended SUCCEEDED or FAILED) is FAILED and not retryable.
  Any such check ends the run FAILED (COMPLETION_CHECKS_FAILED);
* MISSING: not attested yet (no step, or the latest failed retryable): the claim is refused
  (COMPLETION_CHECKS_MISSING) and changes nothing, so the worker can still attest it.

No SQL, no protobuf, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: A check the worker attests (no condition in the policy).
ATTESTED = "ATTESTED"
ARTIFACT_EXISTS = "ARTIFACT_EXISTS"
TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS = "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS"
NO_OPEN_STEPS = "NO_OPEN_STEPS"
#: The label whose value is an artifact's kind (ARTIFACT_EXISTS).
KIND_LABEL = "kind"


@dataclass(frozen=True)
class Check:
    """One check of a completion policy, as the policy's spec holds it."""

    name: str
    description: str = ""
    condition: str = ATTESTED
    artifact_kind: str = ""
    tool: str = ""

    @property
    def by_runtime(self) -> bool:
        return self.condition != ATTESTED


def checks_of(policy_spec: dict[str, Any] | None) -> tuple[Check, ...]:
    """The checks of a completion policy's normalised spec (None: no policy, no checks)."""
    if policy_spec is None:
        return ()
    return tuple(
        Check(
            name=c["name"],
            description=c.get("description", ""),
            condition=c.get("condition", ATTESTED),
            artifact_kind=c.get("artifact_kind", ""),
            tool=c.get("tool", ""),
        )
        for c in policy_spec.get("checks", [])
    )


# -- what the ledger says ----------------------------------------------------------------------


@dataclass(frozen=True)
class Attestation:
    """The worker's latest word on a check: its latest COMPLETION_CHECK step that ended
    SUCCEEDED or FAILED (a CANCELLED one said nothing)."""

    step_id: str
    status: str
    retryable: bool
    #: The principal of the worker whose attempt recorded it (Attempt.worker_principal).
    worker_principal: str


@dataclass(frozen=True)
class StepMark:
    step_id: str
    sequence: int


@dataclass
class LedgerFacts:
    """What the checks of a policy need from a run's ledger (only what they need is read)."""

    #: By check name.
    attestations: dict[str, Attestation] = field(default_factory=dict)
    #: Artifact ids of the run by kind label, oldest first (the kinds the checks name).
    artifacts: dict[str, list[str]] = field(default_factory=dict)
    #: The latest SUCCEEDED TOOL_CALL step by tool (the tools the checks name).
    tool_successes: dict[str, StepMark] = field(default_factory=dict)
    #: The run's latest step with side effects.
    last_side_effect: StepMark | None = None
    #: The run's steps STARTED or WAITING_APPROVAL, in sequence order.
    open_steps: list[str] = field(default_factory=list)


# -- the verdict -------------------------------------------------------------------------------


class Outcome(StrEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"  # for good: see the module doc
    MISSING = "MISSING"  # not attested yet


@dataclass(frozen=True)
class CheckResult:
    check: Check
    outcome: Outcome
    #: The evidence: the steps and artifacts the result rests on.
    step_ids: tuple[str, ...] = ()
    artifact_ids: tuple[str, ...] = ()
    #: An attested check: the principal of the worker that attested it.
    attested_by: str = ""
    #: Why, in words (for the run's terminal message and the refusal).
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED


def evaluate(checks: tuple[Check, ...], facts: LedgerFacts) -> list[CheckResult]:
    """Each check's result, in policy order."""
    return [_evaluate(check, facts) for check in checks]


def _evaluate(check: Check, facts: LedgerFacts) -> CheckResult:
    if check.condition == ARTIFACT_EXISTS:
        found = tuple(facts.artifacts.get(check.artifact_kind, ()))
        if found:
            return CheckResult(
                check,
                Outcome.PASSED,
                artifact_ids=found,
                detail=f"{len(found)} artifact(s) of kind {check.artifact_kind!r}",
            )
        return CheckResult(
            check, Outcome.FAILED, detail=f"no artifact of kind {check.artifact_kind!r}"
        )
    if check.condition == TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS:
        success = facts.tool_successes.get(check.tool)
        last = facts.last_side_effect
        if success is None:
            return CheckResult(check, Outcome.FAILED, detail=f"no call of {check.tool!r} succeeded")
        evidence = (success.step_id,) + ((last.step_id,) if last is not None else ())
        # The tool's own call may have side effects: it is then the last such step itself.
        if last is not None and last.sequence > success.sequence:
            return CheckResult(
                check,
                Outcome.FAILED,
                step_ids=evidence,
                detail=f"step {last.step_id} has side effects after the last successful call "
                f"of {check.tool!r} ({success.step_id})",
            )
        return CheckResult(
            check,
            Outcome.PASSED,
            step_ids=evidence,
            detail=f"{check.tool!r} succeeded ({success.step_id}) after the last step with "
            + (f"side effects ({last.step_id})" if last is not None else "side effects (none)"),
        )
    if check.condition == NO_OPEN_STEPS:
        if facts.open_steps:
            return CheckResult(
                check,
                Outcome.FAILED,
                step_ids=tuple(facts.open_steps),
                detail=f"{len(facts.open_steps)} step(s) left open",
            )
        return CheckResult(check, Outcome.PASSED, detail="no step left open")
    latest = facts.attestations.get(check.name)
    if latest is None:
        return CheckResult(check, Outcome.MISSING, detail="no COMPLETION_CHECK step ended")
    if latest.status == "SUCCEEDED":
        outcome, detail = Outcome.PASSED, "attested"
    elif latest.retryable:
        outcome, detail = Outcome.MISSING, f"its latest step {latest.step_id} failed (retryable)"
    else:
        outcome, detail = Outcome.FAILED, f"its latest step {latest.step_id} failed, not retryable"
    return CheckResult(
        check,
        outcome,
        step_ids=(latest.step_id,),
        attested_by=latest.worker_principal,
        detail=detail,
    )
