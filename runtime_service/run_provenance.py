"""A run's provenance as an in-toto Statement v1: what produced what, signed by the server.

The subjects are the run's artifacts (by their blob's SHA-256) and the run's record itself
(``agentrt-run:<id>``, by its event chain's head hash, so a run without artifacts still has a
subject); the predicate, of type :data:`PREDICATE_TYPE`, names the run, the agent version it
was bound to and how its reference resolved, every attempt, every step's resolved model,
skills and tools, the chain head and the usage totals. ``docs/run-provenance.schema.json`` is
its JSON Schema; docs/audit.md ("Run attestations") explains each field.

Pure: built from the records one snapshot read, with no clock of its own, so two replicas
attesting one ended run make byte-identical statements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentrt_core.event_chain import format_time
from agentrt_core.jcs import canonical_bytes
from runtime_service.records import Artifact, Attempt, Run, Step

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://agentrt.dev/run-provenance/v1"
RUN_SUBJECT_PREFIX = "agentrt-run:"


def _time(value: Any) -> str | None:
    return format_time(value) if value is not None else None


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _step(step: Step) -> dict[str, Any]:
    model = None
    if step.model_policy_digest:
        model = {
            "policy_digest": step.model_policy_digest,
            "candidate": step.candidate_name,
            "provider": step.provider,
            "requested": step.requested_model_id,
            "reported": step.reported_model_id,
        }
    return {
        "id": step.id,
        "sequence": step.sequence,
        "attempt_id": step.attempt_id,
        "type": step.type,
        "status": step.status,
        "model": model,
        "system_prompt_digest": step.system_prompt_digest,
        "skills": [
            {"name": s["name"], "version": s["version"], "digest": s["digest"]}
            for s in json.loads(step.skills_json or "[]")
        ],
        "tools": [
            {
                "name": t["name"],
                "version": t["version"],
                "digest": t["digest"],
                "schema_digest": t["schema_digest"],
            }
            for t in json.loads(step.tools_json or "[]")
        ],
        "input_tokens": step.input_tokens,
        "output_tokens": step.output_tokens,
    }


def statement(
    *,
    installation_id: str,
    run: Run,
    attempts: Sequence[Attempt],
    steps: Sequence[Step],
    artifacts: Sequence[Artifact],
) -> bytes:
    """The Statement's bytes (RFC 8785: one spelling, so a signature covers exactly it)."""
    subjects = [
        {"name": f"{RUN_SUBJECT_PREFIX}{run.id}", "digest": {"sha256": _hex(run.last_event_hash)}}
    ]
    subjects += [
        {"name": f"artifact:{a.id}:{a.name}", "digest": {"sha256": _hex(a.blob_digest)}}
        for a in artifacts
    ]
    predicate = {
        "ledger": {"installation_id": installation_id, "runtime_version": run.runtime_version},
        "run": {
            "id": run.id,
            "thread_id": run.thread_id,
            "namespace": run.namespace,
            "status": run.status,
            "terminal_reason": run.terminal_reason,
            "creator": run.creator_principal,
            "create_time": _time(run.create_time),
            "end_time": _time(run.end_time),
        },
        "agent": {
            "digest": run.agent_digest,
            "agent_id": run.agent_id,
            "version_label": run.agent_version_label,
            "requested_ref": run.agent_requested_ref,
            "reference_kind": run.agent_reference_kind,
            "tag": run.agent_resolved_via_tag,
            "tag_event_sequence": run.agent_tag_event_sequence,
            "resolve_time": _time(run.agent_resolve_time),
        },
        "attempts": [
            {
                "id": a.id,
                "number": a.number,
                "reason": a.reason,
                "worker": a.worker_principal or a.worker_id,
                "lease_epoch": a.lease_epoch,
                "status": a.status,
                "start_time": _time(a.start_time),
                "end_time": _time(a.end_time),
            }
            for a in attempts
        ],
        "steps": [_step(s) for s in steps],
        "chain": {"last_sequence": run.last_event_sequence, "head_hash": run.last_event_hash},
        "usage": {
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cost_usd": run.cost_usd,
            "steps": run.last_step_sequence,
            "attempts": run.attempt_count,
        },
    }
    return canonical_bytes(
        {
            "_type": STATEMENT_TYPE,
            "subject": subjects,
            "predicateType": PREDICATE_TYPE,
            "predicate": predicate,
        }
    )
