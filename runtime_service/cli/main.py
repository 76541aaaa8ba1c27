"""The ``agentrt`` command: ``serve``, ``db upgrade``, ``health``; later issues add their own.

Errors an operator can act on (unreachable database, port in use) end the process with one
line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentrt_base import auth, tls
from agentrt_base import log_format as log_format_module
from agentrt_base.db import Database
from agentrt_base.db_failures import DatabaseUnavailable
from agentrt_base.limits import Limits
from agentrt_base.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_LISTEN,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    ENV_AUTH_CONFIG,
    ENV_BLOB_QUOTA_BYTES,
    ENV_BLOB_UPLOAD_RATE,
    ENV_DATABASE_PASSWORD_FILE,
    ENV_DATABASE_URL,
    ENV_INSECURE,
    ENV_LISTEN,
    ENV_LOG_FORMAT,
    ENV_MAX_BLOB_BYTES,
    ENV_MAX_CONNECTIONS,
    ENV_MAX_LONG_POLLS,
    ENV_MAX_STREAMS_PER_CONNECTION,
    ENV_MAX_WATCHES,
    ENV_METRICS_LISTEN,
    ENV_NAMESPACE_BLOB_QUOTA_BYTES,
    ENV_RATE_BURST,
    ENV_RATE_LIMIT,
    LOG_FORMATS,
    MAX_CONNECTIONS_CEILING,
    ServerSettings,
)
from agentrt_core import connect
from agentrt_core.connect import (
    DEFAULT_PORT,
    ENV_TARGET,
    TargetError,
    cannot_reach,
    client_channel,
    resolve_target,
)
from registry import cli as registry_cli
from runtime_service import __version__
from runtime_service.cli import audit as audit_cli
from runtime_service.cli import database_url, entry
from runtime_service.cli import operator as operator_cli
from runtime_service.services.context import RuntimeSettings

# The exit codes, one table for every command: runtime_service/cli/entry.py.
EXIT_FAILED = entry.EXIT_FAILED
EXIT_USAGE = entry.EXIT_USAGE
EXIT_CANNOT_START = entry.EXIT_CANNOT_START

Command = Callable[[argparse.Namespace], int]


def _configure_logging(log_format: str = "text") -> None:
    log_format_module.configure(log_format, sys.stderr)


def _fail(message: str, code: int) -> int:
    print(f"agentrt: {message}", file=sys.stderr)
    return code


def _settings(args: argparse.Namespace, listen: str | None) -> ServerSettings:
    """Flags, environment and defaults, with the password file's password in the URL.

    Raises:
        DatabaseUnavailable: the password file cannot be used (one line).
        ValueError: a malformed setting (one line).
    """
    database_url.warn_if_password_in_arguments(args.database_url)
    settings = ServerSettings.resolve(
        listen=listen,
        database_url=args.database_url,
        # serve's flags only; db upgrade has none of them.
        max_blob_bytes=getattr(args, "max_blob_bytes", None),
        blob_quota_bytes=getattr(args, "blob_quota_bytes", None),
        namespace_blob_quota_bytes=getattr(args, "namespace_blob_quota_bytes", None),
        blob_upload_rate=getattr(args, "blob_upload_rate", None),
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
        client_ca=getattr(args, "client_ca", None),
        insecure=getattr(args, "insecure", False),
        auth_config=getattr(args, "auth_config", None),
        rate_limit=getattr(args, "rate_limit", None),
        rate_burst=getattr(args, "rate_burst", None),
        max_watches=getattr(args, "max_watches", None),
        max_long_polls=getattr(args, "max_long_polls", None),
        max_streams_per_connection=getattr(args, "max_streams_per_connection", None),
        max_connections=getattr(args, "max_connections", None),
        metrics_listen=getattr(args, "metrics_listen", None),
        log_format=getattr(args, "log_format", None),
    )
    path = database_url.password_file(args.database_password_file)
    if path is None:
        return settings
    url = database_url.with_password_from_file(settings.database_url, path)
    return dataclasses.replace(settings, database_url=url)


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime_service.server import StartupError, serve

    try:
        settings = _settings(args, args.listen)
        _configure_logging(settings.log_format)
        stopped_by = asyncio.run(serve(settings))
    except (DatabaseUnavailable, StartupError, ValueError) as exc:
        return _fail(str(exc), EXIT_CANNOT_START)
    return entry.EXIT_INTERRUPTED if stopped_by == signal.SIGINT else 0


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from runtime_service import migrate

    _configure_logging()
    try:
        settings = _settings(args, None)
        database = Database(settings.database_url, settings=settings.database)
    except (DatabaseUnavailable, ValueError) as exc:
        return _fail(str(exc), EXIT_CANNOT_START)
    try:
        database.check()
        installation = migrate.upgrade(database)
        revision = migrate.current_revision(database)
    except DatabaseUnavailable as exc:
        return _fail(str(exc), EXIT_CANNOT_START)
    finally:
        database.dispose()
    print(f"database {database.display_url()} at revision {revision} (installation {installation})")
    return 0


def _cmd_token_create(args: argparse.Namespace) -> int:
    path = args.config or os.environ.get(ENV_AUTH_CONFIG)
    if not path:
        return _fail(f"token create: --config PATH (or {ENV_AUTH_CONFIG}) is required", 2)
    token = auth.new_token()
    entry = auth.token_entry(args.principal, token, args.role, args.scope, args.namespace)
    try:
        with open(path, "a", encoding="utf-8") as config:
            config.write(entry)
        auth.AuthConfig.load(path)  # the file as the server will read it
    except (OSError, ValueError) as exc:
        return _fail(f"token create: {exc}", EXIT_FAILED)
    # The token is shown this once; only its hash is kept.
    print(token)
    print(
        f"agentrt: token for {args.principal} appended to {path} (as its hash); send SIGHUP to"
        " a running server to take it in",
        file=sys.stderr,
    )
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = resolve_target(args.target)
    with client_channel(args, target) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # its stub types lack the methods
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                details = cannot_reach(args, target, details)
            return _fail(f"{target}: {exc.code().name}: {details}", EXIT_FAILED)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(status)
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``agentrt`` command."""
    parser = argparse.ArgumentParser(
        prog="agentrt",
        description="agentrt: agent registry and run ledger over gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"agentrt {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    database_help = (
        f"database URL (env {ENV_DATABASE_URL}; default {DEFAULT_DATABASE_URL}); a password"
        " given here is visible to every user of the machine in the process list: set"
        f" {ENV_DATABASE_URL} or use --database-password-file instead"
    )
    password_help = (
        "file whose content is the database password, replacing the URL's"
        f" (env {ENV_DATABASE_PASSWORD_FILE})"
    )
    serve = commands.add_parser("serve", help="run the gRPC server")
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"address (env {ENV_LISTEN}; default {DEFAULT_LISTEN})",
    )
    serve.add_argument("--database-url", metavar="URL", help=database_help)
    serve.add_argument("--database-password-file", metavar="PATH", help=password_help)
    serve.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help=f"text (the default) or json, one object a line (env {ENV_LOG_FORMAT};"
        " docs/operations.md)",
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help=f"serve Prometheus metrics at http://HOST:PORT/metrics (env {ENV_METRICS_LISTEN};"
        " off by default; loopback only unless mTLS or --insecure; docs/operations.md)",
    )
    serve.add_argument(
        "--max-blob-bytes",
        type=int,
        metavar="N",
        help=f"largest blob PutBlob accepts (env {ENV_MAX_BLOB_BYTES}; "
        f"default {RuntimeSettings.max_blob_bytes} = 64 MiB)",
    )
    serve.add_argument(
        "--blob-quota-bytes",
        type=int,
        metavar="N",
        help=f"total size of all stored blobs (env {ENV_BLOB_QUOTA_BYTES}; "
        f"default {RuntimeSettings.blob_quota_bytes} = 10 GiB)",
    )
    serve.add_argument(
        "--namespace-blob-quota-bytes",
        type=int,
        metavar="N",
        help=f"blob bytes one namespace may hold (env {ENV_NAMESPACE_BLOB_QUOTA_BYTES}; "
        f"default {RuntimeSettings.namespace_blob_quota_bytes} = 2 GiB)",
    )
    serve.add_argument(
        "--blob-upload-rate",
        type=int,
        metavar="BYTES_PER_S",
        help=f"bytes per second all uploads together may take, so they cannot starve the "
        f"ledger; 0 = no limit (env {ENV_BLOB_UPLOAD_RATE}; "
        f"default {RuntimeSettings.blob_upload_rate} = 32 MiB/s)",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="PATH",
        help=f"serve TLS with this certificate (env {tls.ENV_TLS_CERT})",
    )
    serve.add_argument("--tls-key", metavar="PATH", help=f"its key (env {tls.ENV_TLS_KEY})")
    serve.add_argument(
        "--client-ca",
        metavar="PATH",
        help="require client certificates signed by this CA (mTLS; env "
        f"{tls.ENV_CLIENT_CA}); the files are read again when they change",
    )
    serve.add_argument(
        "--auth-config",
        metavar="PATH",
        help=f"the principals file (tokens, client certificates); read again on SIGHUP (env"
        f" {ENV_AUTH_CONFIG}; docs/security.md)",
    )
    _add_limit_arguments(serve)
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="listen on an address other machines can reach without authenticating callers,"
        f" or with bearer tokens over plaintext (env {ENV_INSECURE}=1); refused otherwise",
    )
    serve.set_defaults(handler=_cmd_serve)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    upgrade = db_commands.add_parser("upgrade", help="apply migrations, then exit")
    upgrade.add_argument("--database-url", metavar="URL", help=database_help)
    upgrade.add_argument("--database-password-file", metavar="PATH", help=password_help)
    upgrade.set_defaults(handler=_cmd_db_upgrade)

    token = commands.add_parser("token", help="API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create = token_commands.add_parser(
        "create",
        help="make a token for a principal: print it once, append its hash to the auth config",
    )
    create.add_argument("principal", metavar="NAME")
    create.add_argument("--role", action="append", default=[], choices=auth.ROLES)
    create.add_argument("--scope", action="append", default=[], metavar="AGENT_PATTERN")
    create.add_argument("--namespace", action="append", default=[], metavar="NAMESPACE")
    create.add_argument(
        "--config", metavar="PATH", help=f"the auth config to append to (env {ENV_AUTH_CONFIG})"
    )
    create.set_defaults(handler=_cmd_token_create)

    health = commands.add_parser("health", help="ask a server whether it is serving")
    add_target_argument(health)
    health.add_argument("--service", default="", help="one service's name (default: the server)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    health.set_defaults(handler=_cmd_health)

    demo = commands.add_parser(
        "demo",
        help="play the login-fix case with real worker processes and print its audit tree",
        description=(
            "Starts a server (unless --target), publishes coding_agent@agent_v7, runs the"
            " login-fix case with two worker processes (the first killed with SIGKILL), a"
            " model fallback and an approval, then a follow-up run, and prints the audit tree"
            " read back from the server."
        ),
    )
    demo.add_argument(
        "--target", default=None, help="HOST:PORT of a running server (default: start one)"
    )
    demo.add_argument(
        "--database-url",
        default=None,
        help="the started server's database (default: an SQLite file in a temporary folder)",
    )
    demo.add_argument("--json", action="store_true", help="print the facts as JSON")
    demo.add_argument("--keep", action="store_true", help="keep the logs and workspace")
    demo.set_defaults(handler=_cmd_demo)

    registry_cli.add_commands(commands, add_target_argument)
    audit_cli.add_commands(commands, add_target_argument)
    operator_cli.add_commands(commands, add_target_argument)
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentrt_sdk.demo import play

    return play.main(args.target, args.database_url, args.json, args.keep)


def _add_limit_arguments(serve: argparse.ArgumentParser) -> None:
    """Every principal's limits and the transport's caps (docs/security.md, "Limits"); 0 is
    unlimited for each. A principal's entry in the auth config may set its own."""
    default = Limits()
    limits = serve.add_argument_group("limits (0 = unlimited)")
    limits.add_argument(
        "--rate-limit",
        type=float,
        metavar="CALLS_PER_S",
        help=f"sustained calls a second (env {ENV_RATE_LIMIT}; default"
        f" {default.requests_per_second:g})",
    )
    limits.add_argument(
        "--rate-burst",
        type=int,
        metavar="N",
        help=f"calls allowed at once above the rate (env {ENV_RATE_BURST}; default"
        f" {default.burst})",
    )
    limits.add_argument(
        "--max-watches",
        type=int,
        metavar="N",
        help=f"open WatchRun/WatchThread streams (env {ENV_MAX_WATCHES}; default"
        f" {default.watches})",
    )
    limits.add_argument(
        "--max-long-polls",
        type=int,
        metavar="N",
        help=f"AcquireRun calls in flight (env {ENV_MAX_LONG_POLLS}; default {default.long_polls})",
    )
    limits.add_argument(
        "--max-streams-per-connection",
        type=int,
        metavar="N",
        help=f"HTTP/2 streams open on one connection, for everybody (env"
        f" {ENV_MAX_STREAMS_PER_CONNECTION}; default {DEFAULT_MAX_STREAMS_PER_CONNECTION})",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help=f"connections held at once, for everybody (env {ENV_MAX_CONNECTIONS}; default"
        f" half the open-file limit, at most {MAX_CONNECTIONS_CEILING})",
    )


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--target`` flag every client command shares, and how to reach it over TLS."""
    parser.add_argument(
        "--target",
        metavar="HOST:PORT",
        help=f"server address (env {ENV_TARGET}; default {DEFAULT_LISTEN}); a HOST without"
        f" :PORT means port {DEFAULT_PORT}",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"API token sent as `authorization: Bearer` (env {connect.ENV_TOKEN}; the environment"
        " keeps it out of the process list)",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PATH",
        help=f"CA of the server's certificate: connect over TLS (env {connect.ENV_TLS_CA})",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PATH",
        help="client certificate, for a server that requires one"
        f" (env {connect.ENV_TLS_CLIENT_CERT})",
    )
    parser.add_argument(
        "--tls-key",
        metavar="PATH",
        help=f"the client certificate's key (env {connect.ENV_TLS_CLIENT_KEY})",
    )


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    """The commands ``parser`` takes (``agentrt``'s, ``agentrt runs``'), None for a leaf."""
    for action in parser._actions:  # argparse has no public way to list them
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def _group_named(
    parser: argparse.ArgumentParser, argv: list[str]
) -> argparse.ArgumentParser | None:
    """The parser of the command group ``argv`` names and stops at (``[]`` is ``agentrt``
    itself, ``["runs"]`` ``agentrt runs``), or None when ``argv`` is anything else."""
    current = parser
    for token in argv:
        commands = _commands(current)
        if commands is None or token not in commands:
            return None
        current = commands[token]
    return current if _commands(current) is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``agentrt`` command (the console script is :func:`entry.main`, which imports
    this module inside its guard); Ctrl-C and a closed stdout end it quietly (130, 141)."""
    if argv is None:  # a process of its own (`python -m runtime_service.cli.main`)
        entry.take_sigint()

    def run() -> int:
        # `agentrt audit RUN_ID` is short for `agentrt audit run RUN_ID`.
        raw = audit_cli.normalise_argv(sys.argv[1:] if argv is None else argv)
        parser = build_parser()
        group = _group_named(parser, raw)
        if group is not None:
            # A person typing `agentrt` (or `agentrt runs`) alone wants the commands, not
            # argparse's "COMMAND is required". It is still a bad command line (exit 2, as
            # argparse's usage errors), and the help goes to stderr: a script running
            # `agentrt $EMPTY` fails and gets nothing on stdout, where only results go.
            group.print_help(sys.stderr)
            return EXIT_USAGE
        args = parser.parse_args(raw)
        handler: Command = args.handler
        try:
            return handler(args)
        except TargetError as exc:  # every client command (and the SDK) resolves it alike
            return _fail(str(exc), EXIT_USAGE)

    return entry.quiet_exits(run)


if __name__ == "__main__":
    sys.exit(main())
