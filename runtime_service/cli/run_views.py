"""How the operator commands show a run: its one-line status, the runs table, and ``runs
show``'s details, attempts and steps (the commands are :mod:`runtime_service.cli.operator`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt_core.actors import display_actor
from runtime_service.cli import render
from runtime_service.cli.render import Column

__all__ = ["agent_text", "print_run", "runs_table", "status_text"]


def agent_text(run: message_pb2.Run) -> str:
    agent = run.agent
    text = f"{agent.agent_id}@{agent.version_label}"
    if agent.resolved_via_tag:
        text += f" (via :{agent.resolved_via_tag})"
    return text


def status_text(run: message_pb2.Run) -> str:
    status = render.enum_label(enum_pb2.RunStatus, run.status)
    if run.terminal_reason:
        status += f" ({render.enum_label(enum_pb2.TerminalReason, run.terminal_reason)})"
    requested = [
        name
        for name, flag in (("cancel", run.cancel_requested), ("pause", run.pause_requested))
        if flag
    ]
    if requested:
        status += f" [{', '.join(requested)} requested]"
    return status


def runs_table(title: str, runs: list[message_pb2.Run]) -> Any:
    return render.table(
        title,
        # At 120 columns the run and thread ids, status and objective fit; at 80 the thread's
        # id is left out before the objective is.
        (
            Column("RUN"),
            Column("THREAD", hide=3),
            Column("AGENT", text=True, hide=5),
            Column("STATUS", text=True),
            Column("ATTEMPTS", hide=7),
            Column("STEPS", hide=6),
            Column("CREATED", hide=4),
            Column("OBJECTIVE", text=True, hide=2),
        ),
        (
            (
                r.id,
                r.thread_id,
                agent_text(r),
                status_text(r),
                str(r.attempt_count),
                str(r.step_count),
                render.when(r.create_time),
                r.goal.objective,
            )
            for r in runs
        ),
    )


def print_run(
    out: Console,
    run: message_pb2.Run,
    attempts: list[message_pb2.Attempt],
    steps: list[message_pb2.Step],
) -> None:
    """``runs show`` for people: the run's details, then its attempts and steps as tables."""
    usage = run.usage
    budget = run.budget
    limits = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("steps", budget.max_steps),
            ("tokens", budget.max_model_tokens),
            ("usd", budget.max_cost_usd),
        )
        if value
    )
    out.print(
        render.key_values(
            [
                ("run", run.id),
                ("thread", run.thread_id),
                ("status", status_text(run)),
                ("agent", f"{agent_text(run)} {run.agent.agent_digest}"),
                ("requested", run.agent.requested_ref),
                ("objective", run.goal.objective),
                ("scope", ", ".join(run.goal.scope)),
                ("criteria", "; ".join(run.goal.acceptance_criteria)),
                ("input revision", str(run.input_revision)),
                ("budget", limits or "unlimited"),
                (
                    "usage",
                    f"{run.step_count} steps, {usage.input_tokens} in + {usage.output_tokens} out"
                    f" tokens, ${usage.cost_usd:.4f}",
                ),
                ("created", f"{render.when(run.create_time)} by {run.creator_principal or '-'}"),
                ("started", render.when(run.start_time)),
                ("ended", render.when(run.end_time) if run.end_time.seconds else ""),
                ("message", run.terminal_message),
                ("result", run.result_summary),
                ("checkpoint", run.latest_checkpoint_id),
            ]
        )
    )
    number = {a.id: str(a.number) for a in attempts}
    out.print(
        render.table(
            "attempts",
            (
                Column("#"),
                Column("ATTEMPT"),
                Column("REASON", hide=5),
                Column("WORKER", text=True, hide=3),
                Column("STATUS", text=True),
                Column("STARTED", hide=4),
                Column("ENDED", hide=6),
                Column("RESUMED FROM", hide=7),
                Column("ERROR", text=True, hide=2),
            ),
            (
                (
                    str(a.number),
                    a.id,
                    render.enum_label(enum_pb2.AttemptReason, a.reason),
                    display_actor(a.worker_principal, a.worker_id),
                    render.enum_label(enum_pb2.AttemptStatus, a.status),
                    render.when(a.start_time),
                    render.when(a.end_time),
                    a.resume_from_checkpoint_id or "-",
                    a.error.message,
                )
                for a in attempts
            ),
        )
    )
    out.print(
        render.table(
            "steps",
            # The step's id stays longest: `agentrt approve RUN STEP` needs it.
            (
                Column("SEQ"),
                Column("ATTEMPT", hide=6),
                Column("TYPE"),
                Column("OPERATION", text=True, hide=4),
                Column("STATUS", text=True),
                Column("MODEL", text=True, hide=5),
                Column("STEP", hide=1),
                Column("DETAIL", text=True, hide=2),
            ),
            (
                (
                    str(s.sequence),
                    number.get(s.attempt_id, "?"),
                    render.enum_label(enum_pb2.StepType, s.type),
                    s.tool_name or s.completion_check or s.operation or "-",
                    _step_status(s),
                    render.model_text(s.versions.model),
                    s.id,
                    _step_detail(s),
                )
                for s in steps
            ),
        )
    )


def _step_status(step: message_pb2.Step) -> str:
    status = render.enum_label(enum_pb2.StepStatus, step.status)
    if step.error_class:
        status += f" ({render.enum_label(enum_pb2.ErrorClass, step.error_class)})"
    return status


def _step_detail(step: message_pb2.Step) -> str:
    if step.approval.decision:
        decision = render.enum_label(enum_pb2.ApprovalDecision, step.approval.decision)
        by = display_actor(step.approval.approver_principal, step.approval.approver)
        return f"{decision} by {by}" + (
            f": {step.approval.comment}" if step.approval.comment else ""
        )
    if step.approval_step_id:
        return f"approved by step {step.approval_step_id}"
    return " ".join((step.error_message or step.summary).split())
