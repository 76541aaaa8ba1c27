"""The signed evidence an audit bundle carries, and its offline check with a public key.

A bundle is self-consistent (``audit_bundle.verify_bundle``); its ``evidence`` member makes it
*the record*: the run's attestation, signed by the server when the run ended, and the agent
version's entry in the registry log with its inclusion proof against a signed checkpoint.
:func:`verify_evidence` checks both with nothing but the verifier keys, and that they speak of
this bundle: the attested chain head is the bundle's, the attested agent is the bundle's, the
log entry publishes the bundle's agent digest. docs/audit.md, "Bundles".
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrt_core import dsse, log_verify
from agentrt_core.log_entries import AGENT_VERSION
from agentrt_core.signed_note import Verifier


def evidence_document(
    *,
    envelope: Mapping[str, Any],
    final: bool,
    checkpoint_note: str,
    index: int,
    leaf: bytes,
    tree_size: int,
    hashes: Sequence[bytes],
) -> dict[str, Any]:
    """The ``evidence`` member of a bundle."""
    return {
        "attestation": {"envelope": dict(envelope), "final": final},
        "registry_log": {
            "checkpoint": checkpoint_note,
            "agent_version_entry": {
                "index": index,
                "leaf": leaf.decode(),
                "tree_size": tree_size,
                "hashes": [base64.b64encode(h).decode() for h in hashes],
            },
        },
    }


@dataclass
class EvidenceReport:
    """What :func:`verify_evidence` proved; ``failures`` is empty when all of it holds."""

    key_ids: list[str] = field(default_factory=list)
    #: The run had ended when attested (else the attestation is of the run as it stood).
    final: bool = False
    log_origin: str = ""
    log_size: int = 0
    entry_index: int = -1
    failures: list[str] = field(default_factory=list)


def verify_evidence(document: Mapping[str, Any], verifiers: Sequence[Verifier]) -> EvidenceReport:
    report = EvidenceReport()
    fail = report.failures.append
    evidence = document.get("evidence")
    if not isinstance(evidence, dict):
        fail("the bundle carries no signed evidence (exported by a server before issue 31?)")
        return report
    run, head, agent = (_member(document, key) for key in ("run", "chain_head", "agent"))
    _attestation(evidence.get("attestation"), verifiers, run, head, agent, report)
    _log_entry(evidence.get("registry_log"), verifiers, agent, report)
    return report


def _member(document: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def _attestation(
    raw: Any,
    verifiers: Sequence[Verifier],
    run: Mapping[str, Any],
    head: Mapping[str, Any],
    agent: Mapping[str, Any],
    report: EvidenceReport,
) -> None:
    fail = report.failures.append
    if not isinstance(raw, dict) or not isinstance(raw.get("envelope"), dict):
        fail("evidence.attestation: no envelope")
        return
    try:
        payload, signed = dsse.open_envelope(raw["envelope"], verifiers)
        statement = dsse.parse_statement(payload)
    except dsse.EnvelopeError as exc:
        fail(f"attestation: {exc}")
        return
    report.key_ids = [v.key_id for v in signed]
    report.final = raw.get("final") is True
    predicate = statement.get("predicate")
    if statement.get("predicateType") != "https://agentrt.dev/run-provenance/v1" or not isinstance(
        predicate, dict
    ):
        fail("attestation: not an agentrt run-provenance statement")
        return
    run_id = str(run.get("id", ""))
    subjects = {
        s.get("name"): (s.get("digest") or {}).get("sha256")
        for s in statement.get("subject", [])
        if isinstance(s, dict)
    }
    bundle_head = str(head.get("hash", "")).removeprefix("sha256:")
    if subjects.get(f"agentrt-run:{run_id}") != bundle_head:
        fail(
            f"attestation: the signed chain head of run {run_id} is "
            f"{subjects.get(f'agentrt-run:{run_id}')}, the bundle's is {bundle_head}"
        )
    attested_agent = (predicate.get("agent") or {}).get("digest")
    if attested_agent != agent.get("digest"):
        fail(
            f"attestation: signed for agent {attested_agent}, the bundle's is {agent.get('digest')}"
        )


def _log_entry(
    raw: Any, verifiers: Sequence[Verifier], agent: Mapping[str, Any], report: EvidenceReport
) -> None:
    fail = report.failures.append
    entry = raw.get("agent_version_entry") if isinstance(raw, dict) else None
    if not isinstance(entry, dict):
        fail("evidence.registry_log: no agent version entry")
        return
    try:
        hashes = [base64.b64decode(str(h), validate=True) for h in entry.get("hashes", [])]
        proven = log_verify.inclusion(
            note=str(raw.get("checkpoint", "")),
            verifiers=verifiers,
            index=int(entry.get("index", -1)),
            leaf_data=str(entry.get("leaf", "")).encode(),
            tree_size=int(entry.get("tree_size", 0)),
            hashes=hashes,
        )
    except (log_verify.VerificationError, binascii.Error, ValueError, TypeError) as exc:
        fail(f"registry log: {exc}")
        return
    report.log_origin, report.log_size = proven.checkpoint.origin, proven.checkpoint.size
    report.entry_index = proven.index
    fields = proven.leaf.fields
    if proven.leaf.type != AGENT_VERSION or fields.get("digest") != agent.get("digest"):
        fail(
            f"registry log: entry {proven.index} does not publish the bundle's agent "
            f"{agent.get('digest')}"
        )
    elif (fields["agent_id"], fields["version_label"]) != (
        agent.get("agent_id"),
        agent.get("version_label"),
    ):
        fail(f"registry log: entry {proven.index} publishes it under another label")
