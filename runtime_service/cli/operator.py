"""The operator commands of ``agentrt``: threads, runs, inputs, approvals and watching.

They are built on the client SDK (:class:`agentrt_sdk.AgentrtClient`), so they share its
retry rule (a create carries one ``request_id`` over every retry), its typed errors and its
resuming watches. Each command prints a table for people, or with ``--json`` one JSON object
per line (proto field names) for scripts; a command that creates something prints the new id
alone on stdout, so ``RUN=$(agentrt runs create …)`` works.

Exit codes, as every client command (docs/api.md; the table is :mod:`runtime_service.cli.entry`):
0 success; 1 the server refused (one ``agentrt: CODE: message [REASON]`` line on stderr, then
one line per field violation: :mod:`runtime_service.cli.errors`); 2 a bad command line; 130
interrupted (Ctrl-C), 141 stdout closed by its reader.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt_sdk import AgentrtClient
from runtime_service.cli import render
from runtime_service.cli.client import (
    Body,
    Subparsers,
    add_target_argument,
    add_timeout_argument,
    default_identity,
    guarded,
    key_value,
)
from runtime_service.cli.errors import CommandFailed
from runtime_service.cli.render import Column
from runtime_service.cli.run_views import agent_text, print_run, runs_table, status_text

__all__ = ["add_commands"]

#: The run statuses ``runs list --status`` accepts (the enum's names without the prefix).
RUN_STATUSES = render.enum_choices(enum_pb2.RunStatus)
#: The thread concurrency policies ``threads create --concurrency`` accepts.
CONCURRENCY_POLICIES = render.enum_choices(enum_pb2.ConcurrencyPolicy)


# -- wiring ----------------------------------------------------------------------------------


def add_commands(commands: Subparsers[argparse.ArgumentParser]) -> None:
    """Add ``threads``, ``runs``, ``send``, ``approve`` and ``watch`` to the ``agentrt`` parser."""

    def client(
        group: Subparsers[argparse.ArgumentParser], name: str, help_text: str, body: Body
    ) -> argparse.ArgumentParser:
        parser = group.add_parser(name, help=help_text, description=help_text)
        add_target_argument(parser)
        add_timeout_argument(parser)
        parser.add_argument("--json", action="store_true", help="one JSON object per line")
        parser.set_defaults(handler=guarded(body))
        return parser

    threads = commands.add_parser("threads", help="conversations: create, list, show")
    thread_commands = threads.add_subparsers(
        dest="threads_command", required=True, metavar="COMMAND"
    )
    create = client(thread_commands, "create", "create a thread (prints its id)", _thread_create)
    create.add_argument("title", metavar="TITLE")
    create.add_argument("--message", metavar="TEXT", help="then append this user message")
    create.add_argument("--namespace", default="", metavar="NS", help="the thread's namespace")
    create.add_argument(
        "--metadata", metavar="K=V", action="append", default=[], type=key_value, help="repeatable"
    )
    create.add_argument(
        "--concurrency",
        choices=CONCURRENCY_POLICIES,
        metavar="POLICY",
        help="what a new run does while another of the thread is active: "
        f"{', '.join(CONCURRENCY_POLICIES)} (default: the server's, REJECT)",
    )
    listing = client(thread_commands, "list", "list threads, newest first", _thread_list)
    listing.add_argument("--namespace", default="", metavar="NS", help="only this namespace")
    _add_limit(listing)
    show = client(thread_commands, "show", "a thread, its messages and its runs", _thread_show)
    show.add_argument("thread_id", metavar="THREAD")

    runs = commands.add_parser("runs", help="runs: create, list, show, cancel, pause, resume")
    run_commands = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    create = client(
        run_commands, "create", "queue a run of an agent in a thread (prints its id)", _run_create
    )
    create.add_argument("thread_id", metavar="THREAD")
    create.add_argument("agent_ref", metavar="AGENT_REF", help="coding_agent:prod, …@agent_v7, …")
    create.add_argument("objective", metavar="OBJECTIVE")
    create.add_argument("--scope", action="append", default=[], metavar="S", help="repeatable")
    create.add_argument(
        "--criterion",
        action="append",
        default=[],
        metavar="TEXT",
        help="an acceptance criterion (repeatable)",
    )
    create.add_argument("--max-steps", type=int, default=0, metavar="N", help="budget")
    create.add_argument("--max-tokens", type=int, default=0, metavar="N", help="budget")
    create.add_argument("--max-cost", type=float, default=0.0, metavar="USD", help="budget")
    create.add_argument("--priority", type=int, default=0, metavar="N")
    create.add_argument("--max-attempts", type=int, default=0, metavar="N")
    create.add_argument(
        "--label", metavar="K=V", action="append", default=[], type=key_value, help="repeatable"
    )
    create.add_argument(
        "--request-id",
        default="",
        metavar="ID",
        help="idempotency key: the same id creates the run once (default: a fresh one)",
    )
    listing = client(run_commands, "list", "list runs, newest first", _run_list)
    listing.add_argument("--thread", default="", metavar="THREAD", help="only this thread's")
    listing.add_argument(
        "--status",
        action="append",
        default=[],
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only these statuses (repeatable; {', '.join(RUN_STATUSES)})",
    )
    listing.add_argument("--agent", default="", metavar="AGENT", help="only this agent's")
    listing.add_argument("--namespace", default="", metavar="NS", help="only this namespace")
    _add_limit(listing)
    show = client(run_commands, "show", "a run with its attempts and steps", _run_show)
    show.add_argument("run_id", metavar="RUN")
    for name, verb in (
        ("cancel", "cancel a run (its worker stops at its next call)"),
        ("pause", "pause a run (its worker stops at its next call; resume continues it)"),
        ("resume", "queue a paused run again"),
    ):
        control = client(run_commands, name, verb, _run_control)
        control.add_argument("run_id", metavar="RUN")
        control.add_argument("--reason", default="", metavar="TEXT", help="why, for the history")
        _add_actor(control)
        control.set_defaults(action=name)

    send = client(commands, "send", "send a run an input: a steer or a follow-up", _send)
    send.add_argument("run_id", metavar="RUN")
    kind = send.add_mutually_exclusive_group(required=True)
    kind.add_argument("--steer", metavar="TEXT", help="for the run's next model call")
    kind.add_argument("--follow-up", metavar="TEXT", help="the run's next turn")
    _add_actor(send)

    approve = client(commands, "approve", "approve (or deny) a step waiting for approval", _approve)
    approve.add_argument("run_id", metavar="RUN")
    approve.add_argument(
        "step_id",
        nargs="?",
        metavar="STEP",
        help="the APPROVAL_REQUEST step (default: the one step of RUN waiting for approval)",
    )
    approve.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="without STEP: wait up to SECONDS for the run to ask for an approval",
    )
    approve.add_argument("--deny", action="store_true", help="deny instead of approving")
    approve.add_argument("--comment", default="", metavar="TEXT", help="recorded with it")
    _add_actor(approve)

    watch = client(
        commands,
        "watch",
        "follow a run's events live until it ends, or a thread's until interrupted; "
        "reconnects by itself and shows each event once",
        _watch,
    )
    which = watch.add_mutually_exclusive_group(required=True)
    which.add_argument("run_id", nargs="?", metavar="RUN")
    which.add_argument("--thread", metavar="THREAD", help="a thread's events (all its runs)")
    watch.add_argument(
        "--after", type=int, default=0, metavar="SEQ", help="a run's events after SEQ only"
    )


def _add_actor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--actor",
        metavar="NAME",
        help="a display label for who does it (default: your login name); the ledger records "
        "the authenticated principal beside it",
    )


def _actor(args: argparse.Namespace) -> str:
    return str(args.actor or default_identity())


def _add_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N (default 50; 0 = all)"
    )


def _limit(args: argparse.Namespace) -> int | None:
    return args.limit if args.limit > 0 else None


def _note_limit(args: argparse.Namespace, shown: int) -> None:
    """Say so when a listing stopped at ``--limit`` (there may be more)."""
    if args.limit > 0 and shown >= args.limit:
        print(f"agentrt: the first {shown} shown; --limit N or --limit 0 for more", file=sys.stderr)


# -- threads ---------------------------------------------------------------------------------


async def _thread_create(client: AgentrtClient, args: argparse.Namespace) -> int:
    policy = (
        enum_pb2.ConcurrencyPolicy.Value(f"CONCURRENCY_POLICY_{args.concurrency}")
        if args.concurrency
        else enum_pb2.CONCURRENCY_POLICY_UNSPECIFIED
    )
    thread = await client.threads.create(
        args.title,
        namespace=args.namespace,
        metadata=dict(args.metadata),
        concurrency_policy=policy,
    )
    message = None
    if args.message is not None:
        message = await client.threads.append_message(thread.id, args.message)
    if args.json:
        render.print_json([thread, *([message] if message else [])])
        return 0
    print(thread.id, flush=True)
    print(
        f"created thread {thread.id}" + (f" with message {message.id}" if message else ""),
        file=sys.stderr,
    )
    return 0


async def _thread_list(client: AgentrtClient, args: argparse.Namespace) -> int:
    threads = await client.threads.list(namespace=args.namespace, limit=_limit(args))
    if args.json:
        render.print_json(threads)
        return 0
    render.console().print(
        render.table(
            "",
            (
                Column("THREAD"),
                Column("TITLE", text=True),
                Column("NAMESPACE", hide=3),
                Column("POLICY", hide=2),
                Column("CREATED", hide=1),
            ),
            (
                (
                    t.id,
                    t.title,
                    t.namespace,
                    render.enum_label(enum_pb2.ConcurrencyPolicy, t.concurrency_policy),
                    render.when(t.create_time),
                )
                for t in threads
            ),
        )
    )
    _note_limit(args, len(threads))
    return 0


async def _thread_show(client: AgentrtClient, args: argparse.Namespace) -> int:
    thread = await client.threads.get(args.thread_id)
    messages = await client.threads.messages(thread.id)
    runs = await client.runs.list(thread_id=thread.id)
    if args.json:
        render.print_json(
            [
                {
                    "thread": render.as_dict(thread),
                    "messages": [render.as_dict(m) for m in messages],
                    "runs": [render.as_dict(r) for r in runs],
                }
            ]
        )
        return 0
    out = render.console()
    out.print(
        render.key_values(
            [
                ("thread", thread.id),
                ("title", thread.title),
                ("namespace", thread.namespace),
                (
                    "policy",
                    render.enum_label(enum_pb2.ConcurrencyPolicy, thread.concurrency_policy),
                ),
                ("created", render.when(thread.create_time)),
                ("metadata", ", ".join(f"{k}={v}" for k, v in sorted(thread.metadata.items()))),
            ]
        )
    )
    out.print(
        render.table(
            "messages",
            (
                Column("MESSAGE"),
                Column("ROLE"),
                Column("RUN", hide=2),
                Column("TIME", hide=1),
                Column("CONTENT", text=True),
            ),
            (
                (
                    m.id,
                    render.enum_label(enum_pb2.MessageRole, m.role),
                    m.run_id or "-",
                    render.when(m.create_time),
                    m.content,
                )
                for m in messages
            ),
        )
    )
    out.print(runs_table("runs", runs))
    return 0


# -- runs ------------------------------------------------------------------------------------


async def _run_create(client: AgentrtClient, args: argparse.Namespace) -> int:
    budget = message_pb2.Budget(
        max_steps=args.max_steps, max_model_tokens=args.max_tokens, max_cost_usd=args.max_cost
    )
    run = await client.runs.create(
        args.thread_id,
        args.agent_ref,
        args.objective,
        scope=args.scope,
        acceptance_criteria=args.criterion,
        budget=budget if budget.ByteSize() else None,
        priority=args.priority,
        max_attempts=args.max_attempts,
        labels=dict(args.label),
        request_id=args.request_id,
    )
    if args.json:
        render.print_json([run])
        return 0
    print(run.id, flush=True)
    print(
        f"created run {run.id}: {agent_text(run)} {status_text(run)}",
        file=sys.stderr,
    )
    return 0


async def _run_list(client: AgentrtClient, args: argparse.Namespace) -> int:
    runs = await client.runs.list(
        thread_id=args.thread,
        statuses=[enum_pb2.RunStatus.Value(f"RUN_STATUS_{s}") for s in args.status],
        agent_id=args.agent,
        namespace=args.namespace,
        limit=_limit(args),
    )
    if args.json:
        render.print_json(runs)
        return 0
    render.console().print(runs_table("", runs))
    _note_limit(args, len(runs))
    return 0


async def _run_show(client: AgentrtClient, args: argparse.Namespace) -> int:
    run = await client.runs.get(args.run_id)
    attempts = await client.runs.attempts(run.id)
    steps = await client.runs.steps(run.id)
    if args.json:
        render.print_json(
            [
                {
                    "run": render.as_dict(run),
                    "attempts": [render.as_dict(a) for a in attempts],
                    "steps": [render.as_dict(s) for s in steps],
                }
            ]
        )
        return 0
    print_run(render.console(), run, attempts, steps)
    return 0


async def _run_control(client: AgentrtClient, args: argparse.Namespace) -> int:
    act = {"cancel": client.runs.cancel, "pause": client.runs.pause, "resume": client.runs.resume}
    run = await act[args.action](args.run_id, args.reason, actor=_actor(args))
    if args.json:
        render.print_json([run])
        return 0
    print(f"run {run.id}: {status_text(run)}")
    return 0


# -- inputs and approvals --------------------------------------------------------------------


async def _send(client: AgentrtClient, args: argparse.Namespace) -> int:
    if args.steer is not None:
        sent = await client.runs.steer(args.run_id, args.steer, sender=_actor(args))
    else:
        sent = await client.runs.follow_up(args.run_id, args.follow_up, sender=_actor(args))
    if args.json:
        render.print_json([sent])
        return 0
    print(sent.id, flush=True)
    kind = render.enum_label(enum_pb2.InputKind, sent.kind)
    status = render.enum_label(enum_pb2.InputStatus, sent.status)
    print(f"sent {kind} {sent.id} to run {sent.run_id} ({status})", file=sys.stderr)
    return 0


class _NoApproval(Exception):
    """The run has no (single) step waiting for approval to pick."""


async def _waiting_step(client: AgentrtClient, run_id: str, wait: float) -> str:
    """The id of the run's one step waiting for approval, waiting up to ``wait`` seconds for
    the run to ask for one (its worker records the request, then ends its attempt)."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        run = await client.runs.get(run_id)
        if run.status == enum_pb2.RUN_STATUS_WAITING_APPROVAL:
            steps = await client.runs.steps(run_id)
            waiting = [s.id for s in steps if s.status == enum_pb2.STEP_STATUS_WAITING_APPROVAL]
            if len(waiting) == 1:
                return waiting[0]
            raise _NoApproval(
                f"run {run_id} has {len(waiting)} steps waiting for approval: name one"
                f" ({', '.join(waiting)})"
            )
        if run.HasField("end_time") or asyncio.get_running_loop().time() >= deadline:
            raise _NoApproval(f"run {run_id} is {status_text(run)}: no step waits for approval")
        await asyncio.sleep(0.2)


async def _approve(client: AgentrtClient, args: argparse.Namespace) -> int:
    try:
        step_id = args.step_id or await _waiting_step(client, args.run_id, args.wait)
    except _NoApproval as exc:
        raise CommandFailed(str(exc)) from exc
    answer = await client.runs.resolve_approval(
        args.run_id,
        step_id,
        approve=not args.deny,
        approver=_actor(args),
        comment=args.comment,
    )
    if args.json:
        render.print_json([answer])
        return 0
    step, run = answer.step, answer.run
    print(
        f"step {step.id} {render.enum_label(enum_pb2.StepStatus, step.status)}; "
        f"run {run.id}: {status_text(run)}"
    )
    return 0


# -- watch -----------------------------------------------------------------------------------


async def _watch(client: AgentrtClient, args: argparse.Namespace) -> int:
    out = render.console()
    if args.thread:
        async for item in client.watch_thread(args.thread):
            if args.json:
                render.print_json([{"cursor": item.cursor, "event": render.as_dict(item.event)}])
            else:
                out.print(render.event_line(item.event, with_run=True), soft_wrap=True)
        return 0  # not reached: a thread's stream goes on until interrupted
    async for event in client.watch_run(args.run_id, after_sequence=args.after):
        if args.json:
            render.print_json([event])
        else:
            out.print(render.event_line(event), soft_wrap=True)
    return 0
