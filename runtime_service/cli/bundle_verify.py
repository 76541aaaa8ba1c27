"""Offline verification of an exported audit bundle: ``agentrt audit verify FILE`` (the
bundle is self-consistent) and ``agentrt audit verify-bundle FILE --key KEY`` (and it is the
record the server signed: its run attestation and its agent version's registry-log entry,
checked with the key). No server is asked; docs/audit.md, "Offline verification".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrt_core import audit_bundle
from agentrt_core.bundle_evidence import EvidenceReport, verify_evidence
from agentrt_core.jcs import digest_bytes
from agentrt_core.signed_note import Verifier
from runtime_service.cli.client import Subparsers, run_reported
from runtime_service.cli.entry import EXIT_USAGE
from runtime_service.cli.errors import CommandFailed
from runtime_service.cli.log_commands import KEY_HELP, trusted_keys

__all__ = ["KEY_HELP", "add_verify_bundle", "verify_bundle_file"]


def add_verify_bundle(sub: Subparsers[argparse.ArgumentParser]) -> None:
    """Add ``agentrt audit verify-bundle``."""
    text = (
        "verify an exported bundle offline with the server's public key: its chain and "
        "digests, its run attestation's signature, its agent version's inclusion in the "
        "signed registry log"
    )
    parser = sub.add_parser("verify-bundle", help=text, description=text)
    parser.add_argument("file", type=Path, metavar="BUNDLE")
    parser.add_argument(
        "--key", action="append", required=True, metavar="KEY", help=KEY_HELP.split(";")[0]
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_verify_bundle_command)


def _verify_bundle_command(args: argparse.Namespace) -> int:
    keys = trusted_keys(args.key)
    return run_reported(lambda: verify_bundle_file(args.file, args.json, keys), lambda: "")


def verify_bundle_file(path: Path, as_json: bool, keys: list[Verifier] | None = None) -> int:
    """Verify ``path``; with ``keys``, its signed evidence too. Exit 1 naming the first
    failure (and how many more)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CommandFailed(f"{path}: cannot read: {exc.strerror}", EXIT_USAGE) from exc
    try:
        document = audit_bundle.decode(data)
        report = audit_bundle.verify_bundle(document)
    except audit_bundle.BundleFormatError as exc:
        raise CommandFailed(f"{path}: verification failed: {exc}") from exc
    evidence = verify_evidence(document, keys) if keys else None
    failures = report.failures + (evidence.failures if evidence else [])
    if as_json:
        print(json.dumps(_json(report, evidence, failures, digest_bytes(data)), indent=2))
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise CommandFailed(f"{path}: verification failed: {failures[0]}{more}")
    if not as_json:
        print(f"bundle {path}: verified offline ({digest_bytes(data)})")
        print(f"  run {report.run_id}, agent {report.agent} {report.agent_digest}")
        print(f"  {report.component_count} component digests recompute from their canonical form")
        print("  the agent digest recomputes from its closure and is the run's binding")
        print(f"  {report.step_count} steps: every recorded version is in the closure")
        print(f"  {report.rows_checked} rows are what the chain's events committed to")
        if report.not_covered:
            print(f"  not covered by the chain: {', '.join(report.not_covered)}")
        print(f"  {report.event_count} events chain to head {report.head_hash}")
        if evidence is not None:
            how = "when the run ended" if evidence.final else "before the run ended (not final)"
            print(f"  the run attestation, signed {how} by {', '.join(evidence.key_ids)},")
            print("    names this chain head and this agent")
            print(
                f"  the agent version is entry {evidence.entry_index} of the registry log "
                f"{evidence.log_origin}, proven against its signed checkpoint of "
                f"{evidence.log_size}"
            )
    return 0


def _json(
    report: audit_bundle.BundleReport,
    evidence: EvidenceReport | None,
    failures: list[str],
    digest: str,
) -> dict[str, object]:
    out: dict[str, object] = {
        "ok": not failures,
        "digest": digest,
        "run_id": report.run_id,
        "agent": report.agent,
        "agent_digest": report.agent_digest,
        "component_count": report.component_count,
        "step_count": report.step_count,
        "event_count": report.event_count,
        "head_hash": report.head_hash,
        "rows_checked": report.rows_checked,
        "not_covered": report.not_covered,
        "failures": failures,
    }
    if evidence is not None:
        out["evidence"] = {
            "key_ids": evidence.key_ids,
            "final": evidence.final,
            "log_origin": evidence.log_origin,
            "log_size": evidence.log_size,
            "entry_index": evidence.entry_index,
        }
    return out
