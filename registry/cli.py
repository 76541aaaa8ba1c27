"""The registry commands of ``agentrt``: publish, digest, show, tag, diff, versions.

``publish`` is what a CI job runs: it publishes the components a bundle file declares, then
the agent, prints the agent digest alone on stdout (so ``DIGEST=$(agentrt publish f.yaml)``
works) and optionally moves a tag with a compare-and-swap expectation. ``digest`` computes
the same digest offline with the same code the server runs (:mod:`agentrt_core.publishing`).

Exit codes: 0 success; 1 the registry refused (a gRPC error, a reference the server was
asked for and does not have), reported as one ``agentrt: <reason>`` line on stderr; 2 the
command line or the file is wrong, found without asking a server (missing, not YAML, not a
bundle, a rule violation, a reference no given file declares) -- so the same file fails
``digest`` and ``publish`` with the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format, timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt.registry.v1 import registry_service_pb2_grpc as pb_grpc
from agentrt_core import proto_json, registry_map
from agentrt_core.bundle import (
    AGENT_PREFIX,
    BundleError,
    digest_bundle,
    digest_components,
    load,
)
from agentrt_core.connect import DEFAULT_PORT, cannot_reach, client_channel, resolve_target
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.model import Component
from agentrt_core.publishing import check_definition

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "ServerComponentSource",
    "add_commands",
    "add_timeout_argument",
    "ci_provenance",
    "default_identity",
    "key_value",
]

EXIT_FAILED = 1
EXIT_USAGE = 2

#: Seconds each call may take; generous, since a publish can wait behind the writer.
DEFAULT_TIMEOUT = 30.0

Handler = Callable[[argparse.Namespace], int]
Subparsers = argparse._SubParsersAction  # argparse exports no public name for it


class CommandFailed(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- wiring ----------------------------------------------------------------------------------


def add_commands(
    commands: Subparsers[argparse.ArgumentParser],
    add_target_argument: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add the registry commands to the ``agentrt`` parser.

    Args:
        commands: The top-level subparsers of ``agentrt``.
        add_target_argument: Adds the shared ``--target`` flag. Passed in rather than
            imported because ``registry`` must not depend on ``runtime_service``.
    """

    def client(name: str, help_text: str, handler: Handler) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        add_target_argument(parser)
        add_timeout_argument(parser)
        parser.set_defaults(handler=_guarded(handler))
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
    digest.set_defaults(handler=_guarded(_digest))

    show = client("show", "show an agent version by label, digest or tag", _show)
    show.add_argument("ref", metavar="REF", help="coding_agent@agent_v7, …@sha256:…, agent:tag")
    show_format = show.add_mutually_exclusive_group()
    show_format.add_argument("--json", action="store_true", help="the full response as JSON")
    show_format.add_argument(
        "--digest", action="store_true", help="print only the digest REF resolves to"
    )

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


def add_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--timeout`` flag of every client command (the operator commands share it)."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"per call (default {DEFAULT_TIMEOUT:g})",
    )


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


def key_value(text: str) -> tuple[str, str]:
    """``K=V`` as a pair, for an argparse ``type`` (labels, metadata)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _guarded(handler: Handler) -> Handler:
    """Turn every expected failure into one stderr line and an exit code, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except BundleError as exc:
            return _fail(str(exc), EXIT_USAGE)
        except CommandFailed as exc:
            return _fail(str(exc), exc.code)
        except InvalidArgument as exc:
            return _fail(_violation(exc), EXIT_FAILED)
        except NotFound as exc:
            return _fail(exc.message, EXIT_FAILED)
        except grpc.RpcError as exc:
            return _fail(_rpc_message(exc, args), EXIT_FAILED)

    return run


def _fail(message: str, code: int) -> int:
    print(f"agentrt: {_one_line(message)}", file=sys.stderr)
    return code


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _violation(error: InvalidArgument) -> str:
    if error.violations:
        first = error.violations[0]
        more = f" (and {len(error.violations) - 1} more)" if len(error.violations) > 1 else ""
        return f"{first.field}: {first.description}{more}"
    return error.message


def _rpc_message(error: grpc.RpcError, args: argparse.Namespace) -> str:
    """``CODE: details``, plus digests from ``ErrorInfo`` metadata the message leaves out."""
    call: Any = error  # a failed call is both an RpcError and a grpc.Call
    code = call.code()
    details = call.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{code.name}: {cannot_reach(args, resolve_target(args.target), details)}"
    for key, value in _error_metadata(call).items():
        if key.endswith("_digest") and value and value not in details:
            details += f" ({key.replace('_', ' ')}: {value})"
    return f"{code.name}: {details}"


def _error_metadata(call: Any) -> dict[str, str]:
    try:
        status = rpc_status.from_call(call)
    except (ValueError, AttributeError):
        return {}
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return dict(info.metadata)
    return {}


@contextlib.contextmanager
def _registry(args: argparse.Namespace) -> Iterator[pb_grpc.RegistryServiceStub]:
    with client_channel(args, resolve_target(args.target)) as channel:
        yield pb_grpc.RegistryServiceStub(channel)


# -- provenance ------------------------------------------------------------------------------


def ci_provenance(environ: Mapping[str, str]) -> dict[str, str]:
    """Provenance a CI system states in its environment (GitHub Actions, then GitLab CI).

    Args:
        environ: The environment to read.

    Returns:
        Any of ``publisher``, ``source_repo``, ``commit``, ``pipeline_url`` that are known.
    """
    found: dict[str, str] = {}
    if environ.get("GITHUB_REPOSITORY"):
        server = environ.get("GITHUB_SERVER_URL") or "https://github.com"
        repo = f"{server.rstrip('/')}/{environ['GITHUB_REPOSITORY']}"
        found["source_repo"] = repo
        if environ.get("GITHUB_RUN_ID"):
            found["pipeline_url"] = f"{repo}/actions/runs/{environ['GITHUB_RUN_ID']}"
    elif environ.get("CI_PROJECT_URL"):
        found["source_repo"] = environ["CI_PROJECT_URL"]
    if environ.get("GITHUB_SHA"):
        found["commit"] = environ["GITHUB_SHA"]
    elif environ.get("CI_COMMIT_SHA"):
        found["commit"] = environ["CI_COMMIT_SHA"]
    if "pipeline_url" not in found and environ.get("CI_PIPELINE_URL"):
        found["pipeline_url"] = environ["CI_PIPELINE_URL"]
    publisher = environ.get("GITHUB_ACTOR") or environ.get("GITLAB_USER_LOGIN")
    if publisher:
        found["publisher"] = publisher
    return found


def default_identity() -> str:
    """Who a command acts as when not told: the CI's actor, else the login name."""
    from_ci = ci_provenance(os.environ).get("publisher")
    if from_ci:
        return from_ci
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in a bare container
        return ""


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


def _publish(args: argparse.Namespace) -> int:
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
    with _registry(args) as stub:
        for component, digested in zip(bundle.components, local, strict=True):
            response = stub.PublishComponent(
                pb.PublishComponentRequest(component=component.proto, provenance=provenance),
                timeout=args.timeout,
            )
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
        response_agent = stub.PublishAgentVersion(
            pb.PublishAgentVersionRequest(definition=agent, provenance=provenance),
            timeout=args.timeout,
        )
        version = response_agent.agent_version
        print(version.digest, flush=True)
        label = f"{version.agent_id}@{version.version_label}"
        print(f"{'created' if response_agent.created else 'unchanged'} {label}", file=sys.stderr)
        if not response_agent.created:
            _warn_provenance_kept(label, version.publish.provenance, provenance)
        if args.tag:
            request = _set_tag_request(
                args,
                version.agent_id,
                args.tag,
                version.digest,
                actor=provenance.publisher,
                reason=f"agentrt publish {label}",
            )
            request.provenance.CopyFrom(provenance)
            not_moved = (
                f"{label} is published ({version.digest}) but tag {args.tag!r} was not moved"
            )
            try:
                moved = stub.SetTag(request, timeout=args.timeout)
            except grpc.RpcError as exc:
                raise CommandFailed(f"{not_moved}: {_rpc_message(exc, args)}") from exc
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


def _set_tag_request(
    args: argparse.Namespace, agent_id: str, tag: str, digest: str, *, actor: str, reason: str
) -> pb.SetTagRequest:
    request = pb.SetTagRequest(
        agent_id=agent_id, tag=tag, digest=digest, actor=actor, reason=reason
    )
    if args.expect:
        request.expected_digest = args.expect
    elif args.expect_absent:
        request.expect_absent = True
    return request


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


# -- digest ----------------------------------------------------------------------------------


def _digest(args: argparse.Namespace) -> int:
    bundle = load(args.file)
    extra = [load(path) for path in args.with_files]
    try:
        if args.target:
            with client_channel(args, resolve_target(args.target)) as channel:
                server = ServerComponentSource(pb_grpc.RegistryServiceStub(channel), args.timeout)
                digested = digest_bundle(bundle, extra, server)
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
        for line in _closure_lines(registry_map.closure_to_proto(digested.closure)):
            print(line)
    return 0


class ServerComponentSource:
    """A :class:`agentrt_core.publishing.ComponentSource` that reads published components from a
    server (``GetComponent``, ``ListComponents``), for ``agentrt digest --target``."""

    def __init__(self, stub: pb_grpc.RegistryServiceStub, timeout: float) -> None:
        self._stub = stub
        self._timeout = timeout

    def by_version(self, name: str, version: str) -> Component | None:
        """The published ``name@version``, or None."""
        return self._get(f"{name}@{version}")

    def by_digest(self, digest: str) -> Component | None:
        """The published component with this digest, or None."""
        return self._get(digest)

    def versions(self, name: str) -> Sequence[Component]:
        """Every published version of ``name``."""
        found: list[Component] = []
        token = ""
        while True:
            page = self._stub.ListComponents(
                pb.ListComponentsRequest(name=name, page_size=1000, page_token=token),
                timeout=self._timeout,
            )
            found += [_component_from_proto(c) for c in page.components]
            token = page.next_page_token
            if not token:
                return found

    def _get(self, ref: str) -> Component | None:
        try:
            response = self._stub.GetComponent(
                pb.GetComponentRequest(ref=ref), timeout=self._timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return _component_from_proto(response.component)


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


# -- show, tag, diff, versions ---------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    with _registry(args) as stub:
        response = stub.GetAgentVersion(
            pb.GetAgentVersionRequest(ref=args.ref), timeout=args.timeout
        )
    if args.json:
        print(json_format.MessageToJson(response, preserving_proto_field_name=True))
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
        ("description", _one_line(version.definition.description)),
    ]
    for key, value in rows:
        if value:
            print(f"{key:<12} {value}")
    print("closure")
    for line in _closure_lines(version.closure):
        print(f"  {line}")
    return 0


def _closure_lines(closure: message_pb2.ResolvedClosure) -> list[str]:
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


def timestamp_text(stamp: timestamp_pb2.Timestamp, *, precise: bool = False) -> str:
    """A timestamp as every command prints one: ISO 8601 UTC (``2026-12-02T07:01:02Z``, with
    milliseconds when ``precise``); ``-`` when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    moment = proto_json.from_timestamp(stamp)
    text = moment.isoformat(timespec="milliseconds" if precise else "seconds")
    return text.replace("+00:00", "Z")


def _tag(args: argparse.Namespace) -> int:
    with _registry(args) as stub:
        digest = args.digest
        if not digest.startswith("sha256:"):
            # A label alone (agent_v8) is taken as a version of AGENT.
            ref = digest if ("@" in digest or ":" in digest) else f"{args.agent}@{digest}"
            found = stub.GetAgentVersion(pb.GetAgentVersionRequest(ref=ref), timeout=args.timeout)
            digest = found.agent_version.digest
        request = _set_tag_request(
            args,
            args.agent,
            args.tag,
            digest,
            actor=args.actor or default_identity(),
            reason=args.reason,
        )
        # A deploy job moving a tag records its pipeline just as a publish does.
        ci = ci_provenance(os.environ)
        for key, value in ci.items():
            setattr(request.provenance, key, value)
        response = stub.SetTag(request, timeout=args.timeout)
    _check_absent(args, response)
    print(_tag_line(response))
    return 0


def _diff(args: argparse.Namespace) -> int:
    with _registry(args) as stub:
        response = stub.DiffAgentVersions(
            pb.DiffAgentVersionsRequest(base_ref=args.base, target_ref=args.target_ref),
            timeout=args.timeout,
        )
    if args.json:
        print(json_format.MessageToJson(response, preserving_proto_field_name=True))
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


def _versions(args: argparse.Namespace) -> int:
    everything = pb.ListAgentVersionsResponse()
    token = ""
    with _registry(args) as stub:
        while True:
            page = stub.ListAgentVersions(
                pb.ListAgentVersionsRequest(agent_id=args.agent, page_size=1000, page_token=token),
                timeout=args.timeout,
            )
            everything.agent_versions.extend(page.agent_versions)
            token = page.next_page_token
            if not token:
                break
    if not everything.agent_versions:
        # An agent exists only through its versions, so an empty list means the name is
        # unknown (a typo, or another server): a script must not read it as success.
        raise CommandFailed(f"NOT_FOUND: agent {args.agent!r} has no published versions")
    if args.json:
        print(json_format.MessageToJson(everything, preserving_proto_field_name=True))
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
        for v in everything.agent_versions
    ]
    width = max(len(r[0]) for r in rows)
    by_width = max(len(r[4]) for r in rows)
    for label, digest, time, tags, by, verified in rows:
        print(f"{label:<{width}}  {digest}  {time}  {by:<{by_width}}  {verified}  {tags}")
    return 0


def published_by(publish: message_pb2.PublishRecord) -> str:
    """``principal`` and, when it differs, the name the publisher gave: ``ci@acme (says
    "alice")``. The principal is who the server authenticated; the name is a label."""
    principal = publish.principal or "(not recorded)"
    said = publish.provenance.publisher
    return f"{principal} (says {json.dumps(said)})" if said and said != principal else principal


def verified_text(verified: message_pb2.VerifiedProvenance) -> str:
    """One line for a publish's verified provenance (an OIDC token's claims), or says it has
    none: the source, commit and pipeline rows beside it are what the publisher stated."""
    if not verified.verified:
        return "no (self-declared provenance only)"
    parts = [verified.repository or verified.subject]
    if verified.ref:
        parts.append(f"ref {verified.ref}")
    if verified.commit_sha:
        parts.append(f"commit {verified.commit_sha}")
    if verified.workflow:
        parts.append(f"workflow {verified.workflow}")
    return f"yes: {', '.join(parts)} (issuer {verified.issuer})"


def _history(args: argparse.Namespace) -> int:
    everything = pb.ListTagHistoryResponse()
    token = ""
    with _registry(args) as stub:
        while True:
            page = stub.ListTagHistory(
                pb.ListTagHistoryRequest(
                    agent_id=args.agent, tag=args.tag, page_size=1000, page_token=token
                ),
                timeout=args.timeout,
            )
            everything.events.extend(page.events)
            token = page.next_page_token
            if not token:
                break
    if args.json:
        print(json_format.MessageToJson(everything, preserving_proto_field_name=True))
        return 0
    for e in everything.events:
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
