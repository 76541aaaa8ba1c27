"""The server-side commands of ``agentrt``: ``serve``, ``db upgrade`` and ``token create``.

They run the server, open its database or write its auth config, so they are the only
commands that import the server's packages; every other command is a client of a server
(:mod:`runtime_service.cli.client`). Errors an operator can act on (unreachable database,
port in use) end the process with one line on stderr and exit code 3, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys

from agentrt_base import tls
from agentrt_base.limits import Limits
from agentrt_base.roles import ROLES
from agentrt_base.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_LISTEN,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    ENV_AUTH_CONFIG,
    ENV_BLOB_QUOTA_BYTES,
    ENV_BLOB_UPLOAD_RATE,
    ENV_CONSOLE_LISTEN,
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
    resolve_log_format,
)
from runtime_service.cli.client import Subparsers
from runtime_service.cli.entry import (
    EXIT_CANNOT_START,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    sigint_deferred,
)
from runtime_service.cli.errors import fail
from runtime_service.runtime_settings import RuntimeSettings

__all__ = ["add_commands"]


def add_commands(commands: Subparsers[argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``db`` and ``token`` to the ``agentrt`` parser."""
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
        "--console-listen",
        metavar="HOST:PORT",
        help=f"serve the web console at http://HOST:PORT/ (env {ENV_CONSOLE_LISTEN}; off by"
        " default; loopback only unless --insecure; docs/console.md)",
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
    serve.add_argument(
        "--signing-key",
        action="append",
        metavar="PATH",
        help="an Ed25519 key file the server signs its log's checkpoints with; repeat to keep"
        " retired keys published after the signing one (env AGENTRT_SIGNING_KEYS, comma-"
        "separated; default: generated beside a SQLite database file; docs/audit.md)",
    )
    serve.add_argument(
        "--log-origin",
        metavar="ORIGIN",
        help="the registry log's name, the first line of its checkpoints, fixed when the log"
        " is created (env AGENTRT_LOG_ORIGIN; default agentrt/<installation id>)",
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
    create.add_argument("--role", action="append", default=[], choices=ROLES)
    create.add_argument("--scope", action="append", default=[], metavar="AGENT_PATTERN")
    create.add_argument("--namespace", action="append", default=[], metavar="NAMESPACE")
    create.add_argument(
        "--config", metavar="PATH", help=f"the auth config to append to (env {ENV_AUTH_CONFIG})"
    )
    create.set_defaults(handler=_cmd_token_create)


def _configure_logging(log_format: str = "text") -> None:
    from agentrt_base import log_format as formats  # reads the caller: authentication's

    formats.configure(log_format, sys.stderr)


def _settings(args: argparse.Namespace, listen: str | None) -> ServerSettings:
    """Flags, environment and defaults, with the password file's password in the URL.

    Raises:
        DatabaseUnavailable: the password file cannot be used (one line).
        ValueError: a malformed setting (one line).
    """
    from runtime_service.cli import database_url

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
        console_listen=getattr(args, "console_listen", None),
        signing_keys=getattr(args, "signing_key", None),
        log_origin=getattr(args, "log_origin", None),
    )
    path = database_url.password_file(args.database_password_file)
    if path is None:
        return settings
    url = database_url.with_password_from_file(settings.database_url, path)
    return dataclasses.replace(settings, database_url=url)


# The server's packages are imported by the handlers that need them, not at the top: the
# parser is built for every command, and a client-only install (no server extra) must be
# able to build it and run its client commands.


def _cmd_serve(args: argparse.Namespace) -> int:
    with sigint_deferred():  # a second of imports, C extensions among them (entry.py)
        from agentrt_base.db_failures import DatabaseUnavailable
        from runtime_service.listening import StartupError
        from runtime_service.server import serve

    try:
        # Logging first: reading the settings may warn (a password on the command line).
        _configure_logging(resolve_log_format(args.log_format, os.environ))
        settings = _settings(args, args.listen)
        stopped_by = asyncio.run(serve(settings))
    except (DatabaseUnavailable, StartupError, ValueError) as exc:
        return fail(str(exc), EXIT_CANNOT_START)
    return EXIT_INTERRUPTED if stopped_by == signal.SIGINT else 0


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    with sigint_deferred():
        from agentrt_base.db import Database
        from agentrt_base.db_failures import DatabaseUnavailable
        from runtime_service import migrate

    _configure_logging()
    try:
        settings = _settings(args, None)
        database = Database(settings.database_url, settings=settings.database)
    except (DatabaseUnavailable, ValueError) as exc:
        return fail(str(exc), EXIT_CANNOT_START)
    try:
        database.check()
        installation = migrate.upgrade(database)
        revision = migrate.current_revision(database)
    except DatabaseUnavailable as exc:
        return fail(str(exc), EXIT_CANNOT_START)
    finally:
        database.dispose()
    print(f"database {database.display_url()} at revision {revision} (installation {installation})")
    return 0


def _cmd_token_create(args: argparse.Namespace) -> int:
    from agentrt_base import auth

    path = args.config or os.environ.get(ENV_AUTH_CONFIG)
    if not path:
        return fail(f"token create: --config PATH (or {ENV_AUTH_CONFIG}) is required", EXIT_USAGE)
    token = auth.new_token()
    entry = auth.token_entry(args.principal, token, args.role, args.scope, args.namespace)
    try:
        with open(path, "a", encoding="utf-8") as config:
            config.write(entry)
        auth.AuthConfig.load(path)  # the file as the server will read it
    except (OSError, ValueError) as exc:
        return fail(f"token create: {exc}", EXIT_FAILED)
    # The token is shown this once; only its hash is kept.
    print(token)
    print(
        f"agentrt: token for {args.principal} appended to {path} (as its hash); send SIGHUP to"
        " a running server to take it in",
        file=sys.stderr,
    )
    return 0


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
