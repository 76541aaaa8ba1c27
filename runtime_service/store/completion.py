"""What a run's completion checks need from its ledger (``agentrt_core.completion``): one
query per kind of fact the policy's checks name, each over the run's own rows, read in the
FinishAttempt transaction that holds the run's lock."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_core.completion import (
    ARTIFACT_EXISTS,
    KIND_LABEL,
    NO_OPEN_STEPS,
    TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS,
    Attestation,
    Check,
    LedgerFacts,
    StepMark,
)
from runtime_service.store.ledger import ArtifactRow, StepRow
from runtime_service.store.tables import AttemptRow


def read_facts(session: Session, run_id: str, checks: tuple[Check, ...]) -> LedgerFacts:
    """The facts ``checks`` need about run ``run_id`` (nothing when there are no checks)."""
    facts = LedgerFacts()
    conditions = {c.condition for c in checks}
    if any(not c.by_runtime for c in checks):
        facts.attestations = _attestations(session, run_id)
    if ARTIFACT_EXISTS in conditions:
        kinds = {c.artifact_kind for c in checks if c.condition == ARTIFACT_EXISTS}
        facts.artifacts = _artifacts(session, run_id, kinds)
    if TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS in conditions:
        tools = {c.tool for c in checks if c.condition == TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS}
        facts.tool_successes = {
            tool: mark for tool in tools if (mark := _tool_success(session, run_id, tool))
        }
        facts.last_side_effect = _mark(
            session,
            sa.select(StepRow.id, StepRow.sequence)
            .where(StepRow.run_id == run_id, StepRow.side_effect.is_(True))
            .order_by(StepRow.sequence.desc())
            .limit(1),
        )
    if NO_OPEN_STEPS in conditions:
        facts.open_steps = list(
            session.scalars(
                sa.select(StepRow.id)
                .where(
                    StepRow.run_id == run_id,
                    StepRow.status.in_(("STARTED", "WAITING_APPROVAL")),
                )
                .order_by(StepRow.sequence)
            )
        )
    return facts


def _attestations(session: Session, run_id: str) -> dict[str, Attestation]:
    """Each check's latest COMPLETION_CHECK step that ended SUCCEEDED or FAILED."""
    rows = session.execute(
        sa.select(
            StepRow.completion_check,
            StepRow.id,
            StepRow.status,
            StepRow.retryable,
            AttemptRow.worker_principal,
        )
        .join(AttemptRow, AttemptRow.id == StepRow.attempt_id)
        .where(
            StepRow.run_id == run_id,
            StepRow.type == "COMPLETION_CHECK",
            StepRow.status.in_(("SUCCEEDED", "FAILED")),
        )
        .order_by(StepRow.sequence)
    ).all()
    # In sequence order: each check's last row is its latest.
    return {
        name: Attestation(step_id, status, bool(retry), who)
        for name, step_id, status, retry, who in rows
    }


def _artifacts(session: Session, run_id: str, kinds: set[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    rows = session.execute(
        sa.select(ArtifactRow.id, ArtifactRow.labels_json)
        .where(ArtifactRow.run_id == run_id)
        .order_by(ArtifactRow.create_time, ArtifactRow.id)
    ).all()
    for artifact_id, labels_json in rows:
        kind = json.loads(labels_json or "{}").get(KIND_LABEL)
        if kind in kinds:
            found.setdefault(kind, []).append(artifact_id)
    return found


def _tool_success(session: Session, run_id: str, tool: str) -> StepMark | None:
    return _mark(
        session,
        sa.select(StepRow.id, StepRow.sequence)
        .where(
            StepRow.run_id == run_id,
            StepRow.type == "TOOL_CALL",
            StepRow.tool_name == tool,
            StepRow.status == "SUCCEEDED",
        )
        .order_by(StepRow.sequence.desc())
        .limit(1),
    )


def _mark(session: Session, query: sa.Select[str, int]) -> StepMark | None:
    row = session.execute(query).first()
    return StepMark(row[0], row[1]) if row is not None else None
