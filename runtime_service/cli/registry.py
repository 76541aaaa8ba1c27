"""The registry commands of ``agentrt``: publish, digest, tag (show, diff, versions and
tag-history are :mod:`runtime_service.cli.registry_reads`).

``publish`` is what a CI job runs: it publishes the components a bundle file declares, then
the agent, prints the agent digest alone on stdout (so ``DIGEST=$(agentrt publish f.yaml)``
works) and optionally moves a tag with a compare-and-swap expectation. ``digest`` computes
the same digest offline with the same code the server runs (:mod:`agentrt_core.publishing`).
Both call the server through the SDK's registry API (:mod:`agentrt_sdk.registry_api`).

Exit codes (:mod:`runtime_service.cli.entry`): 0 success; 1 the registry refused (a reference
the server was asked for and does not have, too), reported as one ``agentrt: <reason>`` line
on stderr (:mod:`runtime_service.cli.errors`); 2 the command line or the file is wrong, found
without asking a server (missing, not YAML, not a bundle, a rule violation, a reference no
given file declares) -- so the same file fails ``digest`` and ``publish`` with the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

from agentrt.registry.v1 import message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_core import proto_json, registry_map
from agentrt_core.bundle import AGENT_PREFIX, Bundle, digest_bundle, digest_components, load
from agentrt_core.connect import DEFAULT_PORT, resolve_target
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.model import Component
from agentrt_core.publishing import DigestedAgent, check_definition
from agentrt_sdk import AgentrtClient, AgentrtError, NotFoundError
from agentrt_sdk.registry_api import Registry
from runtime_service.cli import registry_reads
from runtime_service.cli.client import (
    Body,
    Subparsers,
    add_target_argument,
    add_timeout_argument,
    ci_provenance,
    default_identity,
    guarded,
    key_value,
    open_client,
    run_reported,
)
from runtime_service.cli.entry import EXIT_FAILED, EXIT_USAGE
from runtime_service.cli.errors import CommandFailed, describe

__all__ = ["ServerComponentSource", "add_commands"]

T = TypeVar("T")


# -- wiring ----------------------------------------------------------------------------------


def add_commands(commands: Subparsers[argparse.ArgumentParser]) -> None:
    """Add the registry commands to the ``agentrt`` parser."""

    def client(name: str, help_text: str, body: Body) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        add_target_argument(parser)
        add_timeout_argument(parser)
        parser.set_defaults(handler=guarded(body))
        return parser

    publish = client(
        "publish", "publish a bundle file's components and agent (prints the digest)", _publish
    )
    publish.add_argument("file", metavar="FILE.yaml")
    publish.add_argument("--tag", help="then move this tag to the published version")
    _add_expectation(publish, "(with --tag)")
    publish.add_argument("--publisher", metavar="ID", help=_from_env("publisher identity"))
    publish.add_argument("--source-repo", metavar="URL", help=_from_env("source repository"))
    publish.add_argument("--commit", metavar="SHA", help=_from_env("source commit"))
    publish.add_argument("--pipeline-url", metavar="URL", help=_from_env("CI pipeline run"))
    publish.add_argument(
        "--label",
        metavar="K=V",
        action="append",
        default=[],
        type=key_value,
        help="provenance label (repeatable)",
    )
    publish.add_argument(
        "-v", "--verbose", action="store_true", help="report each component on stderr"
    )

    digest = commands.add_parser(
        "digest",
        help="compute a bundle's agent digest offline, as publish would",
        description="Compute a bundle's agent digest offline, exactly as publish would.",
    )
    digest.add_argument("file", metavar="FILE.yaml")
    digest.add_argument(
        "--with",
        dest="with_files",
        metavar="OTHER.yaml",
        action="append",
        default=[],
        help="another bundle whose components references may resolve to (repeatable)",
    )
    digest.add_argument(
        "--target",
        metavar="HOST:PORT",
        help="resolve references no file declares against this server (read only; a HOST "
        f"without :PORT means port {DEFAULT_PORT}); without it, nothing is contacted",
    )
    add_timeout_argument(digest)
    digest.add_argument("--closure", action="store_true", help="also print the resolved closure")
    digest.set_defaults(handler=_digest_handler)

    registry_reads.add_show(client)

    tag = client("tag", "move (or create) a tag, compare-and-swap", _tag)
    tag.add_argument("agent", metavar="AGENT")
    tag.add_argument("tag", metavar="TAG")
    tag.add_argument(
        "digest",
        metavar="DIGEST",
        help="sha256:…, or a reference to resolve first (agent_v8, coding_agent:canary)",
    )
    _add_expectation(tag, "")
    tag.add_argument(
        "--actor",
        metavar="X",
        help="a display label for who moves it (default: the publisher identity); the history "
        "records the authenticated principal beside it",
    )
    tag.add_argument("--reason", metavar="Y", default="", help="why, for the tag history")

    registry_reads.add_listings(client)


def _add_expectation(parser: argparse.ArgumentParser, suffix: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--expect",
        metavar="DIGEST",
        help=f"the tag must point at DIGEST now, or already at the new digest (then nothing "
        f"is written, so a retry succeeds) {suffix}".strip(),
    )
    group.add_argument(
        "--expect-absent",
        action="store_true",
        help=f"the tag must not exist yet, not even at the new digest {suffix}".strip(),
    )


def _from_env(what: str) -> str:
    return f"{what} (default: from GitHub Actions / GitLab CI variables when set)"


def _violation(error: InvalidArgument) -> str:
    """A rule the file breaks, found offline: the first violation, and how many more."""
    if error.violations:
        first = error.violations[0]
        more = f" (and {len(error.violations) - 1} more)" if len(error.violations) > 1 else ""
        return f"{first.field}: {first.description}{more}"
    return error.message


def _provenance(args: argparse.Namespace) -> message_pb2.Provenance:
    # Explicit flags win over what the CI environment says.
    from_env = ci_provenance(os.environ)
    return message_pb2.Provenance(
        publisher=args.publisher or from_env.get("publisher") or default_identity(),
        source_repo=args.source_repo or from_env.get("source_repo", ""),
        commit=args.commit or from_env.get("commit", ""),
        pipeline_url=args.pipeline_url or from_env.get("pipeline_url", ""),
        labels=dict(args.label),
    )


# -- publish ---------------------------------------------------------------------------------


async def _publish(client: AgentrtClient, args: argparse.Namespace) -> int:
    if (args.expect or args.expect_absent) and not args.tag:
        raise CommandFailed("--expect and --expect-absent need --tag", EXIT_USAGE)
    bundle = load(args.file)
    agent, definition = bundle.require_agent()
    # Validate everything locally first, so a bad file publishes nothing at all.
    try:
        local = digest_components(bundle)
        check_definition(definition, prefix=AGENT_PREFIX)
    except InvalidArgument as exc:
        raise CommandFailed(f"{bundle.source}: {_violation(exc)}", EXIT_USAGE) from exc
    provenance = _provenance(args)
    registry = client.registry
    for component, digested in zip(bundle.components, local, strict=True):
        response = await registry.publish_component(component.proto, provenance=provenance)
        published = response.component
        if args.verbose:
            state = "created" if response.created else "unchanged"
            print(f"{component.ref}  {published.digest}  {state}", file=sys.stderr)
        if published.digest != digested.digest:
            # Offline digests promise to equal the server's; say so loudly if they do not.
            print(
                f"agentrt: warning: {component.ref}: the server computed {published.digest}, "
                f"this client {digested.digest} (client and server versions differ?)",
                file=sys.stderr,
            )
    response_agent = await registry.publish_agent(agent, provenance=provenance)
    version = response_agent.agent_version
    print(version.digest, flush=True)
    label = f"{version.agent_id}@{version.version_label}"
    print(f"{'created' if response_agent.created else 'unchanged'} {label}", file=sys.stderr)
    if not response_agent.created:
        _warn_provenance_kept(label, version.publish.provenance, provenance)
    if args.tag:
        not_moved = f"{label} is published ({version.digest}) but tag {args.tag!r} was not moved"
        try:
            moved = await _move_tag(
                registry,
                args,
                version.agent_id,
                args.tag,
                version.digest,
                actor=provenance.publisher,
                reason=f"agentrt publish {label}",
                provenance=provenance,
            )
        except AgentrtError as exc:
            raise CommandFailed(f"{not_moved}: {describe(exc, client.target)}") from exc
        try:
            _check_absent(args, moved)
        except CommandFailed as exc:
            raise CommandFailed(f"{not_moved}: {exc}") from exc
        print(_tag_line(moved), file=sys.stderr)
    return 0


def _warn_provenance_kept(
    label: str, recorded: message_pb2.Provenance, sent: message_pb2.Provenance
) -> None:
    """Say which stated provenance an identical re-publish did not record.

    A version's provenance is its first publish's and is never rewritten (docs/api.md), so a
    ``--publisher`` or ``--commit`` given now would otherwise vanish without a word.
    """
    kept, dropped = [], []
    for name in ("publisher", "source_repo", "commit", "pipeline_url"):
        said, was = getattr(sent, name), getattr(recorded, name)
        if said and said != was:
            kept.append(f"{name} {json.dumps(was)}")
            dropped.append(f"{name} {json.dumps(said)}")
    if sent.labels and dict(sent.labels) != dict(recorded.labels):
        kept.append(f"labels {json.dumps(dict(sorted(recorded.labels.items())))}")
        dropped.append(f"labels {json.dumps(dict(sorted(sent.labels.items())))}")
    if dropped:
        print(
            f"agentrt: warning: {label} was published before and keeps its recorded "
            f"provenance ({', '.join(kept)}); this publish's {', '.join(dropped)} "
            "were not recorded",
            file=sys.stderr,
        )


# -- tag -------------------------------------------------------------------------------------


async def _move_tag(
    registry: Registry,
    args: argparse.Namespace,
    agent_id: str,
    tag: str,
    digest: str,
    *,
    actor: str,
    reason: str,
    provenance: message_pb2.Provenance | None,
) -> pb.SetTagResponse:
    """SetTag with the command's ``--expect`` / ``--expect-absent``."""
    return await registry.move_tag(
        agent_id,
        tag,
        digest,
        expected_digest=args.expect or None,
        expect_absent=args.expect_absent,
        actor=actor,
        reason=reason,
        provenance=provenance,
    )


def _check_absent(args: argparse.Namespace, response: pb.SetTagResponse) -> None:
    """Fail ``--expect-absent`` when the tag already existed at the requested digest.

    The server answers such a call with success and no event, so that a retried request whose
    first answer was lost does not fail (registry_service.proto, SetTag). A command is never
    a retry of an earlier one, so here an unchanged tag means the tag was there before.
    """
    if args.expect_absent and not response.HasField("event"):
        tag = response.tag
        raise CommandFailed(
            f"FAILED_PRECONDITION: tag {tag.agent_id}:{tag.name} already exists (at "
            f"{tag.digest}, event {tag.event_sequence}); --expect-absent requires that it does not"
        )


def _tag_line(response: pb.SetTagResponse) -> str:
    tag = response.tag
    moved = "" if response.HasField("event") else "unchanged, "
    return f"{tag.agent_id}:{tag.name} -> {tag.digest} ({moved}event {tag.event_sequence})"


async def _tag(client: AgentrtClient, args: argparse.Namespace) -> int:
    digest = args.digest
    if not digest.startswith("sha256:"):
        # A label alone (agent_v8) is taken as a version of AGENT.
        ref = digest if ("@" in digest or ":" in digest) else f"{args.agent}@{digest}"
        digest = (await client.registry.get(ref)).digest
    # A deploy job moving a tag records its pipeline just as a publish does.
    ci = ci_provenance(os.environ)
    provenance = message_pb2.Provenance()
    for key, value in ci.items():
        setattr(provenance, key, value)
    response = await _move_tag(
        client.registry,
        args,
        args.agent,
        args.tag,
        digest,
        actor=args.actor or default_identity(),
        reason=args.reason,
        provenance=provenance if ci else None,
    )
    _check_absent(args, response)
    print(_tag_line(response))
    return 0


# -- digest ----------------------------------------------------------------------------------


def _digest_handler(args: argparse.Namespace) -> int:
    return run_reported(lambda: _digest(args), lambda: resolve_target(args.target))


def _digest(args: argparse.Namespace) -> int:
    bundle = load(args.file)
    extra = [load(path) for path in args.with_files]
    try:
        if args.target:
            digested = asyncio.run(_digest_online(args, bundle, extra))
        else:
            digested = digest_bundle(bundle, extra)
    except InvalidArgument as exc:
        raise CommandFailed(f"{bundle.source}: {_violation(exc)}", EXIT_USAGE) from exc
    except NotFound as exc:
        field = exc.metadata.get("field", AGENT_PREFIX)
        where = " or ".join([bundle.source, *(b.source for b in extra)])
        hint = (
            "publish it first (agentrt publish)"
            if args.target
            else "declare it under 'components:', add the file that does with --with, "
            "or resolve it against a server with --target HOST:PORT after agentrt publish"
        )
        searched = f"{where} or {args.target}" if args.target else where
        # publishing reports the first unresolved reference and counts the others.
        more = exc.message[exc.message.find(" (and ") :] if " (and " in exc.message else ""
        # Offline, the files are all there is: they are incomplete. With --target, the
        # server was asked and has no such component.
        raise CommandFailed(
            f"{field}: {exc.resource_name!r}{more} matches no component in {searched}; {hint}",
            EXIT_FAILED if args.target else EXIT_USAGE,
        ) from exc
    print(digested.digest)
    if args.closure:
        for line in registry_reads.closure_lines(registry_map.closure_to_proto(digested.closure)):
            print(line)
    return 0


async def _digest_online(
    args: argparse.Namespace, bundle: Bundle, extra: Sequence[Bundle]
) -> DigestedAgent:
    """``digest_bundle`` asking the server for what no file declares: it runs on a thread,
    and its source calls back into this loop, where the client lives."""
    async with open_client(args) as client:
        source = ServerComponentSource(client.registry, asyncio.get_running_loop())
        return await asyncio.to_thread(digest_bundle, bundle, extra, source)


class ServerComponentSource:
    """A :class:`agentrt_core.publishing.ComponentSource` that reads published components from a
    server (``GetComponent``, ``ListComponents``), for ``agentrt digest --target``.

    The publishing rules are synchronous and the SDK is not: the rules run on a thread of
    their own, and each read is sent to ``loop`` (where the client's channel lives) and
    waited for there.
    """

    def __init__(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        self._registry = registry
        self._loop = loop

    def by_version(self, name: str, version: str) -> Component | None:
        """The published ``name@version``, or None."""
        return self._get(f"{name}@{version}")

    def by_digest(self, digest: str) -> Component | None:
        """The published component with this digest, or None."""
        return self._get(digest)

    def versions(self, name: str) -> Sequence[Component]:
        """Every published version of ``name``."""
        return [_component_from_proto(c) for c in self._wait(self._registry.components(name))]

    def _get(self, ref: str) -> Component | None:
        try:
            return _component_from_proto(self._wait(self._registry.get_component(ref)))
        except NotFoundError:
            return None

    def _wait(self, call: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await call

        coroutine: Coroutine[Any, Any, T] = wrapped()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


def _component_from_proto(c: message_pb2.Component) -> Component:
    kind = registry_map.kind_from_proto(c.kind)
    return Component(
        kind=kind,
        name=c.name,
        version=c.version,
        digest=c.digest,
        description=c.description,
        spec=registry_map.spec_to_json(kind, c.spec, "component.spec"),
        schema_digest=c.schema_digest or None,
        publish_time=proto_json.from_timestamp(c.publish.publish_time),
        provenance=registry_map.provenance_from_proto(c.publish.provenance),
    )
