"""What every client command of ``agentrt`` shares: its flags, who it acts as, and how it
runs against a server.

A client command is an async body given an :class:`agentrt_sdk.AgentrtClient` made from the
flags (``--target``, ``--token``, TLS, ``--timeout``): it calls the server only through the
SDK, so the registry, operator and audit commands share its retry rule and its typed errors,
and :func:`guarded` reports every expected failure with :mod:`runtime_service.cli.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentrt_core import connect
from agentrt_core.bundle import BundleError
from agentrt_core.connect import DEFAULT_PORT, DEFAULT_TARGET, ENV_TARGET, ClientTls
from agentrt_sdk import AgentrtClient, AgentrtError
from runtime_service.cli.entry import EXIT_USAGE
from runtime_service.cli.errors import CommandFailed, fail, report

__all__ = [
    "DEFAULT_TIMEOUT",
    "Body",
    "Handler",
    "Subparsers",
    "add_target_argument",
    "add_timeout_argument",
    "ci_provenance",
    "default_identity",
    "guarded",
    "key_value",
    "open_client",
]

#: Seconds each call may take; generous, since a publish can wait behind the writer.
DEFAULT_TIMEOUT = 30.0

Handler = Callable[[argparse.Namespace], int]
Body = Callable[[AgentrtClient, argparse.Namespace], Awaitable[int]]
Subparsers = argparse._SubParsersAction  # argparse exports no public name for it


# -- flags -----------------------------------------------------------------------------------


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--target`` flag every client command shares, and how to reach it over TLS."""
    parser.add_argument(
        "--target",
        metavar="HOST:PORT",
        help=f"server address (env {ENV_TARGET}; default {DEFAULT_TARGET}); a HOST without"
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


def add_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--timeout`` flag of every client command."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"per call (default {DEFAULT_TIMEOUT:g})",
    )


def key_value(text: str) -> tuple[str, str]:
    """``K=V`` as a pair, for an argparse ``type`` (labels, metadata)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# -- who and where from ----------------------------------------------------------------------


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


# -- running ---------------------------------------------------------------------------------


def open_client(args: argparse.Namespace, options: Sequence[tuple[str, Any]] = ()) -> AgentrtClient:
    """An SDK client made from the command's flags (and the environment they default to).

    Called inside the event loop that uses it (gRPC's asyncio channels belong to one loop).

    Raises:
        CommandFailed: the TLS flags do not go together (exit 2).
    """
    try:
        tls = ClientTls.resolve(
            getattr(args, "tls_ca", None),
            getattr(args, "tls_cert", None),
            getattr(args, "tls_key", None),
        )
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
    return AgentrtClient(
        args.target,
        token=getattr(args, "token", None),
        tls=tls,
        timeout=args.timeout,
        options=options,
    )


def guarded(body: Body, options: Sequence[tuple[str, Any]] = ()) -> Handler:
    """A handler that runs ``body`` with a client made from the flags; every expected failure
    becomes the one-line report and its exit code, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        target = ""

        async def call() -> int:
            nonlocal target
            async with open_client(args, options) as client:
                target = client.target
                return await body(client, args)

        return run_reported(lambda: asyncio.run(call()), lambda: target)

    return run


def run_reported(run: Callable[[], int], target: Callable[[], str]) -> int:
    """``run()``'s exit code, with the failures every command reports alike turned into their
    one line: the server's refusals (:func:`errors.report`), the command's own
    (:class:`CommandFailed`), a bad bundle file and an unreadable TLS file (exit 2)."""
    try:
        return run()
    except AgentrtError as error:
        return report(error, target())
    except CommandFailed as exc:
        return fail(str(exc), exc.code)
    except BundleError as exc:
        return fail(str(exc), EXIT_USAGE)
    except BrokenPipeError:
        raise  # stdout closed by its reader: entry.quiet_exits ends the command (141)
    except OSError as exc:  # a TLS file named by a flag or the environment
        return fail(f"{exc.filename}: {exc.strerror}", EXIT_USAGE)
