"""The ``agentrt audit`` commands: provenance trees, usages, chain verification, bundles.

``agentrt audit RUN_ID`` is short for ``agentrt audit run RUN_ID``. ``verify`` takes a run id
(verified by the server) or the path of an exported bundle, which is verified offline with
nothing but the file: a path that exists is a bundle, anything else must be a run id.

They call the server through the SDK's audit API (:mod:`agentrt_sdk.audit_api`). Exit codes,
as every client command (:mod:`runtime_service.cli.entry`): 0 success; 1 the server refused
or a verification failed, reported as one ``agentrt: <reason>`` line on stderr naming what
failed (:mod:`runtime_service.cli.errors`); 2 the command line or a file is wrong (missing,
unreadable, unwritable).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import Message

from agentrt.audit.v1 import audit_service_pb2 as pb
from agentrt.audit.v1 import message_pb2 as apb
from agentrt.registry.v1 import message_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import message_pb2 as mpb
from agentrt_core import proto_json
from agentrt_core.actors import display_actor
from agentrt_core.ids import has_prefix
from agentrt_core.jcs import digest_bytes
from agentrt_core.trace_context import parse, trace_id_of
from agentrt_sdk import AgentrtClient
from runtime_service.cli import render
from runtime_service.cli.bundle_verify import KEY_HELP, add_verify_bundle, verify_bundle_file
from runtime_service.cli.client import (
    Body,
    Subparsers,
    add_target_argument,
    add_timeout_argument,
    guarded,
    run_reported,
)
from runtime_service.cli.entry import EXIT_USAGE
from runtime_service.cli.errors import CommandFailed
from runtime_service.cli.log_commands import trusted_keys
from runtime_service.cli.render import enum_label, published_by, verified_text, when

__all__ = ["add_commands", "normalise_argv"]

#: A provenance record of a long run is larger than gRPC's default 4 MiB message limit.
_RECEIVE_OPTIONS = (("grpc.max_receive_message_length", 8 * 1024 * 1024),)

_SUBCOMMANDS = ("run", "step", "artifact", "blob", "usages", "verify", "verify-bundle", "export")
#: Options of the audit commands that take a value (to find the first positional).
_VALUED = ("--target", "--timeout", "--max-steps", "-o", "--output")


# -- wiring ----------------------------------------------------------------------------------


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """Rewrite ``audit RUN_ID …`` to ``audit run RUN_ID …`` (argparse cannot have a
    positional beside subcommands)."""
    args = list(argv)
    if not args or args[0] != "audit":
        return args
    i = 1
    while i < len(args):
        token = args[i]
        if token in _VALUED:
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            if token not in _SUBCOMMANDS:
                args.insert(1, "run")
            return args
    return args


def add_commands(commands: Subparsers[argparse.ArgumentParser]) -> None:
    """Add ``agentrt audit …`` to the ``agentrt`` parser."""
    audit = commands.add_parser(
        "audit",
        help="provenance, usages, event chain verification and bundles (read only)",
        description="Audit runs: `agentrt audit RUN_ID` prints the run's execution tree "
        "(short for `agentrt audit run RUN_ID`).",
    )
    sub = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    def client(name: str, help_text: str, body: Body) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text, description=help_text)
        add_target_argument(parser)
        add_timeout_argument(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(handler=guarded(body, _RECEIVE_OPTIONS))
        return parser

    for name, what, field in (
        ("run", "a run's execution tree: agent version, thread, run, attempts, steps", "run_id"),
        ("step", "a step's provenance chain, then its run's tree", "step_id"),
        ("artifact", "an artifact's chain: step, attempt, run, agent version", "artifact_id"),
        ("blob", "every step, checkpoint and artifact that produced or used a blob", "blob_digest"),
    ):
        parser = client(name, what, _provenance)
        parser.add_argument("target_id", metavar=field.upper())
        parser.add_argument(
            "--max-steps", type=int, default=0, metavar="N", help="steps per run (default 1000)"
        )
        parser.set_defaults(field=field)

    usages = client(
        "usages", "runs and steps that used a component, schema, agent or model", _usages
    )
    usages.add_argument(
        "ref", nargs="?", metavar="REF", help="a component: name@version, name@sha256:…, sha256:…"
    )
    which = usages.add_mutually_exclusive_group()
    which.add_argument("--schema", metavar="DIGEST", help="a tool input schema digest instead")
    which.add_argument("--agent", metavar="DIGEST", help="an agent version digest instead")
    which.add_argument("--model", metavar="ID", help="a model id instead")
    match = usages.add_mutually_exclusive_group()
    match.add_argument("--requested", action="store_true", help="--model: requested ids only")
    match.add_argument("--reported", action="store_true", help="--model: reported ids only")
    usages.add_argument("--since", type=_time, metavar="TIME", help="from TIME (ISO 8601, UTC)")
    usages.add_argument("--until", type=_time, metavar="TIME", help="before TIME (ISO 8601)")
    usages.add_argument(
        "--limit", type=int, default=100, metavar="N", help="at most N records (default 100)"
    )
    usages.add_argument("--page-token", default="", metavar="TOKEN", help="continue a listing")

    verify = client(
        "verify",
        "verify a run's event chain (server) or an exported bundle (offline, no server)",
        _verify_run,
    )
    verify.add_argument("subject", metavar="RUN_ID|BUNDLE")
    verify.add_argument("--key", action="append", default=[], metavar="KEY", help=KEY_HELP)
    verify.set_defaults(handler=_verify)
    add_verify_bundle(sub)

    export = client("export", "export a run as a self-contained, verifiable bundle", _export)
    export.add_argument("run_id", metavar="RUN_ID")
    export.add_argument("-o", "--output", metavar="FILE", help="write here (default stdout)")
    export.add_argument("--jsonl", action="store_true", help="JSON Lines instead of one document")


def _time(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from exc
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _print_json(message: Message) -> None:
    print(json_format.MessageToJson(message, preserving_proto_field_name=True))


# -- provenance ------------------------------------------------------------------------------


async def _provenance(client: AgentrtClient, args: argparse.Namespace) -> int:
    if args.max_steps < 0:
        raise CommandFailed("--max-steps must not be negative", EXIT_USAGE)
    response = await client.audit.provenance(
        max_steps=args.max_steps, **{args.field: args.target_id}
    )
    if args.json:
        _print_json(response)
        return 0
    if args.field == "blob_digest":
        _print_blob(args.target_id, response)
        return 0
    for record in response.records:
        if args.field in ("artifact_id", "step_id"):
            for line in chain_lines(record):
                print(line)
            if args.field == "step_id":
                print()
        if args.field != "artifact_id":
            for line in tree_lines(record):
                print(line)
    return 0


def _print_blob(digest: str, response: pb.GetProvenanceResponse) -> None:
    if not response.blob_references:
        print(f"blob {digest}: stored, but no step, checkpoint or artifact refers to it")
        return
    print(f"blob {digest}")
    for ref in response.blob_references:
        role = proto_json.display_name(apb.BlobRole, ref.role).lower().replace("_", " ")
        extra = ref.artifact_id or ref.checkpoint_id
        print(f"  {role:<11} run {ref.run_id}  step {ref.step_id}{'  ' + extra if extra else ''}")
    for record in response.records:
        print()
        for line in chain_lines(record):
            print(line)


def _names_by_digest(version: rpb.AgentVersion) -> dict[str, str]:
    closure = version.closure
    entries = [closure.system_prompt, closure.model_policy, *closure.skills, *closure.tools]
    return {e.digest: f"{e.name}@{e.version}" if e.name else "(inline)" for e in entries}


def _agent_lines(record: apb.ProvenanceRecord) -> list[str]:
    version = record.agent_version
    if not version.digest:
        return [f"agent {record.run.agent.agent_digest} (not in this registry)"]
    publish = version.publish
    source = publish.provenance
    published = f"published {when(publish.publish_time)} by {published_by(publish)}"
    if source.source_repo or source.commit:
        published += f", {source.source_repo or '-'} at {source.commit or '-'}"
    if source.pipeline_url:
        published += f", pipeline {source.pipeline_url}"
    at_creation = ", ".join(
        f"{t.tag} (event {t.event_sequence}, since {when(t.since_time)})"
        for t in record.tags_at_run_creation
    )
    return [
        f"agent {version.agent_id}@{version.version_label} {version.digest}",
        f"  {published}",
        f"  verified provenance: {verified_text(publish.verified_provenance)}",
        f"  tags at run creation: {at_creation or 'none'}; "
        f"now: {', '.join(version.tags) or 'none'}",
    ]


def _run_lines(run: mpb.Run, indent: str) -> list[str]:
    agent = run.agent
    how = f"via tag {agent.resolved_via_tag}" if agent.resolved_via_tag else "pinned"
    status = enum_label(enum_pb2.RunStatus, run.status)
    if run.terminal_reason:
        status += f" ({enum_label(enum_pb2.TerminalReason, run.terminal_reason)})"
    goal = json.dumps(run.goal.objective)
    if run.goal.scope:
        goal += f" scope {', '.join(run.goal.scope)}"
    budget = run.budget
    limits = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("max_steps", budget.max_steps),
            ("max_model_tokens", budget.max_model_tokens),
            ("max_cost_usd", budget.max_cost_usd),
        )
        if value
    )
    usage = run.usage
    creator = run.creator_principal or "- (no principal recorded)"
    return [
        f"{indent}run {run.id} {status}",
        f"{indent}  agent ref {agent.requested_ref} -> {agent.version_label} {how} "
        f"at {when(agent.resolve_time)}",
        f"{indent}  goal {goal}; input revision {run.input_revision}",
        *(
            f"{indent}  amended to revision {a.input_revision} at {when(a.create_time)} by "
            f"{display_actor(a.actor_principal, a.actor)}"
            + (f": {json.dumps(a.note)}" if a.note else "")
            for a in run.amendments
        ),
        f"{indent}  budget {limits or 'unlimited'}; used {run.step_count} steps, "
        f"{usage.input_tokens + usage.output_tokens} tokens, ${usage.cost_usd:.4f}",
        f"{indent}  created {when(run.create_time)} by {creator}, ended {when(run.end_time)}"
        + (f": {run.terminal_message}" if run.terminal_message else ""),
        *([f"{indent}  trace {trace_id_of(run.traceparent)}"] if run.traceparent else []),
    ]


def _attempt_line(attempt: mpb.Attempt, indent: str) -> str:
    status = enum_label(enum_pb2.AttemptStatus, attempt.status)
    reason = enum_label(enum_pb2.AttemptReason, attempt.reason)
    line = (
        f"{indent}attempt {attempt.number} {attempt.id} {reason} "
        f"worker {display_actor(attempt.worker_principal, attempt.worker_id)} "
        f"epoch {attempt.lease_epoch} {status} {when(attempt.start_time)}"
        f"..{when(attempt.end_time)}"
    )
    if attempt.error.message:
        line += f" ({attempt.error.message})"
    if attempt.traceparent:
        parsed = parse(attempt.traceparent)
        if parsed is not None:
            line += f" trace {parsed.trace_id} span {parsed.span_id}"
    return line


def step_lines(step: mpb.Step, names: dict[str, str], indent: str) -> list[str]:
    """``#3 TOOL_CALL read_file SUCCEEDED`` and one line per resolved version."""
    kind = enum_label(enum_pb2.StepType, step.type)
    status = enum_label(enum_pb2.StepStatus, step.status)
    if step.error_class:
        status += f" ({enum_label(enum_pb2.ErrorClass, step.error_class)})"
    what = step.tool_name or step.completion_check or step.operation
    lines = [f"{indent}#{step.sequence} {kind}{' ' + what if what else ''} {status}  {step.id}"]
    v = step.versions
    if v.HasField("model"):
        m = v.model
        model = m.requested_model_id
        if m.reported_model_id and m.reported_model_id != m.requested_model_id:
            model += f" -> reported {m.reported_model_id}"
        elif m.reported_model_id:
            model += " (reported the same)"
        reason = enum_label(enum_pb2.CandidateReason, m.reason)
        policy = names.get(m.policy_digest, m.policy_digest)
        lines.append(
            f"{indent}   model {model} via {m.candidate_name}/{m.provider} ({reason}), "
            f"policy {policy}"
        )
    if v.system_prompt_digest:
        prompt = names.get(v.system_prompt_digest, "")
        lines.append(
            f"{indent}   system prompt {prompt + ' ' if prompt else ''}{v.system_prompt_digest}"
        )
    if v.skills:
        lines.append(f"{indent}   skills {', '.join(f'{s.name}@{s.version}' for s in v.skills)}")
    if v.tools:
        tools = ", ".join(
            f"{t.name}@{t.version}"
            + (f" {enum_label(enum_pb2.PermissionDecision, t.decision)}" if t.decision else "")
            for t in v.tools
        )
        lines.append(f"{indent}   tools {tools}")
    refs = [f"{n} {d}" for n, d in (("input", step.input_ref), ("output", step.output_ref)) if d]
    if refs:
        lines.append(f"{indent}   {'; '.join(refs)}")
    if step.approval.decision:
        decision = enum_label(enum_pb2.ApprovalDecision, step.approval.decision)
        approver = display_actor(step.approval.approver_principal, step.approval.approver)
        lines.append(f"{indent}   approval {decision} by {approver}")
    if step.error_message:
        lines.append(f"{indent}   error: {' '.join(step.error_message.split())}")
    if step.trace_id:
        # From the record to its span in the tracing backend (docs/operations.md, "Traces").
        lines.append(f"{indent}   trace {step.trace_id} span {step.span_id}")
    return lines


def tree_lines(record: apb.ProvenanceRecord) -> list[str]:
    """The execution tree: agent version → thread → run → attempts → steps."""
    lines = _agent_lines(record)
    thread = record.thread
    lines.append(f"  thread {thread.id} {json.dumps(thread.title)}")
    lines += _run_lines(record.run, "    ")
    names = _names_by_digest(record.agent_version)
    steps_by_attempt: dict[str, list[mpb.Step]] = {}
    for step in record.steps:
        steps_by_attempt.setdefault(step.attempt_id, []).append(step)
    for attempt in record.attempts:
        lines.append(_attempt_line(attempt, "      "))
        for step in steps_by_attempt.get(attempt.id, []):
            lines += step_lines(step, names, "        ")
    if record.steps_truncated:
        lines.append(
            f"      ... more steps after #{record.steps[-1].sequence if record.steps else 0} "
            "(raise --max-steps)"
        )
    return lines


def chain_lines(record: apb.ProvenanceRecord) -> list[str]:
    """artifact → step → attempt → run → agent version, one line per link, details below."""
    lines: list[str] = []
    link = ""
    if record.HasField("artifact"):
        a = record.artifact
        labels = ", ".join(f"{k}={v}" for k, v in sorted(a.labels.items()))
        lines.append(
            f"artifact {a.id} {json.dumps(a.name)} {a.media_type} {a.size} bytes {a.blob_digest}"
            + (f" [{labels}]" if labels else "")
        )
        link = "  made by "
    if record.HasField("step"):
        first, *details = step_lines(record.step, _names_by_digest(record.agent_version), "")
        lines.append(f"{link}step {first}")
        lines += [f"     {line.strip()}" for line in details]
        link = "  in "
    if record.HasField("attempt"):
        lines.append(_attempt_line(record.attempt, link))
        link = "  of "
    first, *details = _run_lines(record.run, "")
    lines.append(link + first)
    lines += [f"     {line.strip()}" for line in details]
    first, *details = _agent_lines(record)
    lines.append(f"  {first}")
    lines += [f"     {line.strip()}" for line in details]
    return lines


# -- usages ----------------------------------------------------------------------------------


async def _usages(client: AgentrtClient, args: argparse.Namespace) -> int:
    given = [x for x in (args.ref, args.schema, args.agent, args.model) if x]
    if len(given) != 1:
        raise CommandFailed(
            "give exactly one of REF (a component), --schema DIGEST, --agent DIGEST or --model ID",
            EXIT_USAGE,
        )
    if (args.requested or args.reported) and not args.model:
        raise CommandFailed("--requested and --reported go with --model", EXIT_USAGE)
    if args.limit < 1:
        raise CommandFailed("--limit must be at least 1", EXIT_USAGE)
    query: dict[str, str] = {}
    match = apb.MODEL_MATCH_UNSPECIFIED
    if args.schema:
        query["tool_schema_digest"] = args.schema
    elif args.agent:
        query["agent_digest"] = args.agent
    elif args.model:
        query["model_id"] = args.model
        match = (
            apb.MODEL_MATCH_REQUESTED
            if args.requested
            else apb.MODEL_MATCH_REPORTED
            if args.reported
            else apb.MODEL_MATCH_ANY
        )
    else:
        query["component_ref"] = args.ref
    found = pb.FindUsagesResponse()
    token = args.page_token
    while len(found.usages) < args.limit:
        page = await client.audit.find_usages_page(
            **query,
            model_match=match,
            start_time=args.since,
            end_time=args.until,
            page_size=min(1000, args.limit - len(found.usages)),
            page_token=token,
        )
        found.usages.extend(page.usages)
        token = page.next_page_token
        if not token:
            break
    found.next_page_token = token
    if args.json:
        _print_json(found)
        return 0
    for usage in found.usages:
        if usage.step_id:
            kind = enum_label(enum_pb2.StepType, usage.step_type)
            where = f"#{usage.step_sequence} {kind} {usage.step_id}"
        else:
            where = "(run)"
        print(f"{when(usage.time)}  {usage.run_id}  {where}  {usage.matched}")
    if not found.usages:
        print("no usages found", file=sys.stderr)
    if token:
        print(f"more: --page-token {token}", file=sys.stderr)
    return 0


# -- verify ----------------------------------------------------------------------------------


def _verify(args: argparse.Namespace) -> int:
    """A path that exists is a bundle, verified with nothing but the file (no client, no
    server); anything else is a run the server verifies."""
    path = Path(args.subject)
    if path.exists():
        keys = trusted_keys(args.key) or None
        return run_reported(lambda: verify_bundle_file(path, args.json, keys), lambda: "")
    return guarded(_verify_run, _RECEIVE_OPTIONS)(args)


async def _verify_run(client: AgentrtClient, args: argparse.Namespace) -> int:
    subject: str = args.subject
    if not has_prefix(subject, "run"):
        raise CommandFailed(f"{subject}: no such file, and not a run id (run_…)", EXIT_USAGE)
    response = await client.audit.verify(subject)
    if args.json:
        _print_json(response)
    if response.HasField("first_break"):
        b = response.first_break
        rows = len(response.row_mismatches)
        raise CommandFailed(
            f"run {subject}: event chain broken at sequence {b.sequence}: {b.reason} "
            f"(expected {b.expected_hash or '-'}, found {b.found_hash or '-'}; "
            f"{response.event_count} events verified before it)"
            + (f"; {rows} served fields differ from the chain" if rows else "")
        )
    if not response.intact:
        first = response.row_mismatches[0]
        more = len(response.row_mismatches) - 1
        raise CommandFailed(
            f"run {subject}: {first.kind} {first.id}: {first.field} is {first.stored} but the "
            f"chain committed to {first.committed}" + (f" (and {more} more)" if more else "")
        )
    if not args.json:
        print(
            f"run {subject}: intact, {response.event_count} events, head {response.head_hash}, "
            f"{response.rows_checked} served rows agree with the chain"
        )
        if response.not_covered:
            print(
                f"  not covered by this run's chain (created before its events recorded them): "
                f"{', '.join(response.not_covered)}"
            )
    return 0


# -- export ----------------------------------------------------------------------------------


async def _export(client: AgentrtClient, args: argparse.Namespace) -> int:
    to_stdout = not args.output or args.output == "-"
    if args.json and to_stdout:
        raise CommandFailed("--json describes a bundle written with -o FILE", EXIT_USAGE)
    info: pb.BundleInfo | None = None
    chunks: list[bytes] = []
    parts = client.audit.export_parts(
        args.run_id,
        format=pb.BUNDLE_FORMAT_JSONL if args.jsonl else pb.BUNDLE_FORMAT_JSON,
        timeout=args.timeout,
    )
    with render.Transfer(f"exporting {args.run_id}") as shown:
        async for part in parts:
            if part.WhichOneof("part") == "info":
                info = part.info
                shown.sized(info.size)
            else:
                chunks.append(part.chunk)
                shown.advance(len(part.chunk))
    data = b"".join(chunks)
    if info is None:
        raise CommandFailed("the server sent no bundle header")
    if len(data) != info.size or digest_bytes(data) != info.digest:
        raise CommandFailed(
            f"transfer damaged: got {len(data)} bytes {digest_bytes(data)}, the server sent "
            f"{info.size} bytes {info.digest}"
        )
    if to_stdout:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    target = Path(args.output)
    partial = target.with_name(target.name + ".partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, target)  # a reader never sees half a bundle
    except OSError as exc:
        raise CommandFailed(f"{target}: cannot write: {exc.strerror}", EXIT_USAGE) from exc
    if args.json:
        _print_json(info)
    else:
        print(f"wrote {target}: {info.size} bytes, {info.digest}", file=sys.stderr)
    return 0
