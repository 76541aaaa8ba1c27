"""The ``agentrt`` command: its parser, ``health`` and ``demo``, and how a command runs.

The server-side commands (``serve``, ``db``, ``token``) are
:mod:`runtime_service.cli.server_commands`; the client commands, which call a server through
the SDK, are :mod:`runtime_service.cli.registry`, :mod:`runtime_service.cli.operator` and
:mod:`runtime_service.cli.audit`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentrt_core.connect import TargetError, cannot_reach, client_channel, resolve_target
from runtime_service import __version__
from runtime_service.cli import audit as audit_cli
from runtime_service.cli import entry, log_commands, server_commands
from runtime_service.cli import operator as operator_cli
from runtime_service.cli import registry as registry_cli
from runtime_service.cli.client import add_target_argument
from runtime_service.cli.entry import EXIT_FAILED, EXIT_USAGE
from runtime_service.cli.errors import fail

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]


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
            return fail(f"{target}: {exc.code().name}: {details}", EXIT_FAILED)
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
    server_commands.add_commands(commands)

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

    registry_cli.add_commands(commands)
    log_commands.add_commands(commands)
    audit_cli.add_commands(commands)
    operator_cli.add_commands(commands)
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentrt_sdk.demo import play

    return play.main(args.target, args.database_url, args.json, args.keep)


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
            return fail(str(exc), EXIT_USAGE)

    return entry.quiet_exits(run)


if __name__ == "__main__":
    sys.exit(main())
