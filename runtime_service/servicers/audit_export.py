"""An audit bundle's document and bytes, built from what ``AuditService.bundle_contents`` read.

Transport: the run, its thread, attempts, steps, artifacts and checkpoints appear in the
bundle as the API shows them (their protobuf messages in JSON form, field names as in the
proto), so the mapping to messages lives here, beside the servicer, not in the use case.
The document's layout and its encodings are :mod:`agentrt_core.audit_bundle`'s, shared
with the offline verifier (``agentrt audit verify BUNDLE``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from agentrt_core import audit_bundle, audit_rows
from agentrt_core.audit_bundle import Format
from agentrt_core.event_chain import format_time
from agentrt_core.jcs import digest_bytes
from agentrt_core.proto_json import message_json
from runtime_service import proto_map as pm
from runtime_service.records import BundledAgent, BundledComponent
from runtime_service.services.audit import BundleContents, RunVerification, TagAtTime


@dataclass(frozen=True)
class ExportedBundle:
    run_id: str
    format: Format
    media_type: str
    data: bytes
    digest: str
    installation_id: str
    export_time: dt.datetime


def export(
    contents: BundleContents, fmt: Format, evidence: dict[str, Any] | None = None
) -> ExportedBundle:
    """The bundle of ``contents`` encoded as ``fmt``, with its digest. CPU work (a long run's
    bundle takes a while): the servicer runs it off the event loop."""
    rows = served_rows(contents)
    document = audit_bundle.build_document(
        installation_id=contents.installation_id,
        export_time=format_time(contents.export_time),
        run=rows["run"],
        thread=message_json(pm.thread(contents.thread)),
        attempts=rows["attempts"],
        steps=rows["steps"],
        artifacts=rows["artifacts"],
        checkpoints=rows["checkpoints"],
        inputs=rows["inputs"],
        events=contents.events,
        chain_head=(contents.run.last_event_sequence, contents.run.last_event_hash),
        agent=_agent_json(contents.agent, contents.tags_at_run_creation),
        components=[_component_json(c) for c in contents.components],
        evidence=evidence,
    )
    data = audit_bundle.encode(document, fmt)
    return ExportedBundle(
        contents.run.id,
        fmt,
        audit_bundle.media_type(fmt),
        data,
        digest_bytes(data),
        contents.installation_id,
        contents.export_time,
    )


def served_rows(contents: BundleContents | RunVerification) -> dict[str, Any]:
    """A run's rows as the read APIs serve them (their messages' proto3 JSON): what a bundle
    holds, and what ``VerifyRun`` compares with the chain (``audit_rows.compare``)."""
    return {
        "run": message_json(pm.run(contents.run)),
        "attempts": [message_json(pm.attempt(a)) for a in contents.attempts],
        "steps": [message_json(pm.step(s)) for s in contents.steps],
        "artifacts": [message_json(pm.artifact(a)) for a in contents.artifacts],
        "checkpoints": [message_json(pm.checkpoint(c)) for c in contents.checkpoints],
        "inputs": [message_json(pm.input_(i)) for i in contents.inputs],
    }


def compare_rows(verification: RunVerification) -> audit_rows.RowReport:
    """``VerifyRun``'s row check: the served rows, and the usage index rows (which bundles do
    not carry), against the run's chain, by the same function the offline bundle check runs.
    CPU work: the servicer runs it off the loop."""
    run = verification.run
    rows = served_rows(verification)
    rows["usages"] = [
        {**u, "start_time": format_time(u["start_time"])} for u in verification.usages
    ]
    return audit_rows.compare(rows, verification.events, run_id=run.id, thread_id=run.thread_id)


def _agent_json(agent: BundledAgent, tags: list[TagAtTime]) -> dict[str, Any]:
    return {
        "agent_id": agent.agent_id,
        "version_label": agent.version_label,
        "digest": agent.digest,
        "description": agent.description,
        "definition": agent.definition,
        "closure": agent.closure,
        "publish_time": format_time(agent.publish_time),
        "provenance": agent.provenance,
        # Who published (the authenticated principal) and, for a publish made with an OIDC
        # token, its verified claims: beside the self-declared provenance, never digested.
        "principal": agent.principal,
        "verified_provenance": agent.verified_provenance,
        "tags_at_run_creation": [
            {
                "tag": t.tag,
                "event_sequence": t.event_sequence,
                "since_time": format_time(t.since_time),
            }
            for t in tags
        ],
    }


def _component_json(component: BundledComponent) -> dict[str, Any]:
    return {
        "kind": component.kind,
        "name": component.name,
        "version": component.version,
        "description": component.description,
        "spec": component.spec,
        "digest": component.digest,
        "schema_digest": component.schema_digest,
    }
