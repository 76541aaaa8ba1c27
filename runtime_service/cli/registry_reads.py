"""The registry commands that only read: show, diff, versions, tag-history (the commands that
write are :mod:`runtime_service.cli.registry`). Each prints lines for people, or with
``--json`` the server's response as JSON (proto field names)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from google.protobuf import json_format
from google.protobuf.message import Message

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_core import proto_json
from agentrt_sdk import AgentrtClient
from runtime_service.cli.client import Body
from runtime_service.cli.errors import CommandFailed, one_line
from runtime_service.cli.render import published_by, timestamp_text, verified_text

__all__ = ["add_listings", "add_show", "closure_lines"]

#: Adds one client command: its name, help and body (``registry.add_commands``'s helper).
AddClient = Callable[[str, str, Body], argparse.ArgumentParser]


def add_show(client: AddClient) -> None:
    """Add ``show``."""
    show = client("show", "show an agent version by label, digest or tag", _show)
    show.add_argument("ref", metavar="REF", help="coding_agent@agent_v7, …@sha256:…, agent:tag")
    show_format = show.add_mutually_exclusive_group()
    show_format.add_argument("--json", action="store_true", help="the full response as JSON")
    show_format.add_argument(
        "--digest", action="store_true", help="print only the digest REF resolves to"
    )


def add_listings(client: AddClient) -> None:
    """Add ``diff``, ``versions`` and ``tag-history``."""
    diff = client("diff", "compare two agent versions component by component", _diff)
    diff.add_argument("base", metavar="A")
    diff.add_argument("target_ref", metavar="B")
    diff.add_argument("--json", action="store_true", help="the full response as JSON")

    versions = client("versions", "list an agent's versions, newest first", _versions)
    versions.add_argument("agent", metavar="AGENT")
    versions.add_argument("--json", action="store_true", help="the full response as JSON")

    history = client(
        "tag-history", "list the moves and deletions of an agent's tags, newest first", _history
    )
    history.add_argument("agent", metavar="AGENT")
    history.add_argument("--tag", default="", help="only this tag's history")
    history.add_argument("--json", action="store_true", help="the full response as JSON")


def _print_json(message: Message) -> None:
    print(json_format.MessageToJson(message, preserving_proto_field_name=True))


# -- show ------------------------------------------------------------------------------------


async def _show(client: AgentrtClient, args: argparse.Namespace) -> int:
    response = await client.registry.resolve(args.ref)
    if args.json:
        _print_json(response)
        return 0
    version, resolution = response.agent_version, response.resolution
    if args.digest:
        print(version.digest)
        return 0
    how = proto_json.display_name(enum_pb2.ReferenceKind, resolution.kind).lower()
    if resolution.kind == enum_pb2.REFERENCE_KIND_TAG:
        how += f" {resolution.tag}, event {resolution.tag_event_sequence}"
    provenance = version.publish.provenance
    verified = version.publish.verified_provenance
    rows = [
        ("agent", version.agent_id),
        ("label", version.version_label),
        ("digest", version.digest),
        (
            "resolved",
            f"{resolution.requested_ref} ({how}) at {timestamp_text(resolution.resolve_time)}",
        ),
        ("tags", ", ".join(version.tags) or "-"),
        (
            "published",
            f"{timestamp_text(version.publish.publish_time)} by {published_by(version.publish)}",
        ),
        ("verified", verified_text(verified)),
        ("source", provenance.source_repo),
        ("commit", provenance.commit),
        ("pipeline", provenance.pipeline_url),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(provenance.labels.items()))),
        ("description", one_line(version.definition.description)),
    ]
    for key, value in rows:
        if value:
            print(f"{key:<12} {value}")
    print("closure")
    for line in closure_lines(version.closure):
        print(f"  {line}")
    return 0


def closure_lines(closure: message_pb2.ResolvedClosure) -> list[str]:
    """``slot  name@version  digest  [schema …]  [(requested …)]`` per component, aligned."""
    entries: list[tuple[str, message_pb2.ResolvedComponent]] = []
    if closure.HasField("system_prompt"):
        entries.append(("system_prompt", closure.system_prompt))
    if closure.HasField("model_policy"):
        entries.append(("model_policy", closure.model_policy))
    entries += [(f"skills[{c.name}]", c) for c in closure.skills]
    entries += [(f"tools[{c.name}]", c) for c in closure.tools]
    if closure.HasField("permission_policy"):
        entries.append(("permission_policy", closure.permission_policy))
    if closure.HasField("completion_policy"):
        entries.append(("completion_policy", closure.completion_policy))
    rows = [
        (slot, f"{c.name}@{c.version}" if c.name else "(inline)", c.digest, _closure_extra(c))
        for slot, c in entries
    ]
    slot_width = max((len(r[0]) for r in rows), default=0)
    ref_width = max((len(r[1]) for r in rows), default=0)
    return [
        f"{slot:<{slot_width}}  {ref:<{ref_width}}  {digest}{extra}".rstrip()
        for slot, ref, digest, extra in rows
    ]


def _closure_extra(c: message_pb2.ResolvedComponent) -> str:
    extra = f"  schema {c.schema_digest}" if c.schema_digest else ""
    # A range or a digest reference resolved to a version: show what was asked for.
    if c.requested_ref and c.requested_ref != f"{c.name}@{c.version}":
        extra += f"  (requested {c.requested_ref})"
    return extra


# -- diff ------------------------------------------------------------------------------------


async def _diff(client: AgentrtClient, args: argparse.Namespace) -> int:
    response = await client.registry.diff(args.base, args.target_ref)
    if args.json:
        _print_json(response)
        return 0
    if not response.changes:
        print("identical")
    for change in response.changes:
        print(_change_line(change))
    return 0


def _change_line(change: message_pb2.FieldChange) -> str:
    kind = proto_json.display_name(enum_pb2.ChangeType, change.type)

    def side(value: str) -> str:
        # Descriptions are free text: quote them so the change stays on one line.
        return json.dumps(value) if change.path == "description" else value

    base, target = side(change.base_value), side(change.target_value)
    if change.type == enum_pb2.CHANGE_TYPE_ADDED:
        line = f"{kind} {change.path}  {target}"
    elif change.type == enum_pb2.CHANGE_TYPE_REMOVED:
        line = f"{kind} {change.path}  {base}"
    else:
        line = f"{kind} {change.path}  {base} -> {target}"
    before, after = change.base_schema_digest, change.target_schema_digest
    if before and after and before != after:
        line += f"  (schema {before} -> {after})"
    elif (before or after) and change.type != enum_pb2.CHANGE_TYPE_MODIFIED:
        line += f"  (schema {before or after})"
    return line


# -- versions, tag-history -------------------------------------------------------------------


async def _versions(client: AgentrtClient, args: argparse.Namespace) -> int:
    versions = await client.registry.versions(args.agent)
    if not versions:
        # An agent exists only through its versions, so an empty list means the name is
        # unknown (a typo, or another server): a script must not read it as success.
        raise CommandFailed(f"NOT_FOUND: agent {args.agent!r} has no published versions")
    if args.json:
        _print_json(pb.ListAgentVersionsResponse(agent_versions=versions))
        return 0
    rows = [
        (
            v.version_label,
            v.digest,
            timestamp_text(v.publish.publish_time),
            ",".join(v.tags) or "-",
            v.publish.principal or "-",
            "verified" if v.publish.verified_provenance.verified else "unverified",
        )
        for v in versions
    ]
    width = max(len(r[0]) for r in rows)
    by_width = max(len(r[4]) for r in rows)
    for label, digest, time, tags, by, verified in rows:
        print(f"{label:<{width}}  {digest}  {time}  {by:<{by_width}}  {verified}  {tags}")
    return 0


async def _history(client: AgentrtClient, args: argparse.Namespace) -> int:
    events = await client.registry.tag_history(args.agent, args.tag)
    if args.json:
        _print_json(pb.ListTagHistoryResponse(events=events))
        return 0
    for e in events:
        kind = proto_json.display_name(enum_pb2.TagEventType, e.type)
        target = e.to_digest if e.to_digest else f"(was {e.from_digest})"
        by = e.actor or "(not recorded)"
        if e.actor_label and e.actor_label != e.actor:
            by += f" (says {json.dumps(e.actor_label)})"
        reason = f"  {json.dumps(e.reason)}" if e.reason else ""
        print(
            f"{e.sequence:>4}  {timestamp_text(e.event_time)}  {kind:<6}  {e.tag}  {target}"
            f"  by {by}{reason}"
        )
    return 0
