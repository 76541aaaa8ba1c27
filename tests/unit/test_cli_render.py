"""How the operator CLI shows events, enums and models (runtime_service/cli/render.py)."""

from __future__ import annotations

import io
import json

import pytest
from google.protobuf import timestamp_pb2
from rich.console import Console

from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from runtime_service.cli import render


def _event() -> event_pb2.Event:
    event = event_pb2.Event(
        sequence=7,
        run_id="run_1",
        event_type=enum_pb2.EVENT_TYPE_STEP_STARTED,
        event_time=timestamp_pb2.Timestamp(seconds=1_796_000_000, nanos=123_000_000),
    )
    started = event.step_started_attributes
    started.step_id = "stp_1"
    started.type = enum_pb2.STEP_TYPE_MODEL_CALL
    started.versions.model.candidate_name = "primary"
    started.versions.model.parameters.update({"temperature": 0.2})
    started.versions.skills.add(name="repo-debug")
    started.operation = "plan the fix " * 20
    return event


def test_event_line_shows_sequence_time_type_and_attributes_on_one_line() -> None:
    line = render.event_line(_event()).plain
    assert "\n" not in line
    assert line.split()[:3] == ["7", "2026-11-30T00:53:20.123Z", "step.started"]
    summary = render.event_summary(_event())
    assert "step_id=stp_1" in summary and "type=MODEL_CALL" in summary
    assert "versions.model.candidate_name=primary" in summary
    assert "versions.model.parameters={1 keys}" in summary and "versions.skills=[1]" in summary
    # Free text is cut, quoted, and stays on the line.
    operation = summary.split("operation=")[1]
    assert operation.startswith('"plan the fix') and "…" in operation
    assert len(json.loads(operation.split('" ')[0] + '"')) == render.SUMMARY_VALUE_CHARS


def test_event_line_is_one_line_whatever_a_label_key_or_a_value_holds() -> None:
    event = event_pb2.Event(sequence=1, event_type=enum_pb2.EVENT_TYPE_RUN_CREATED)
    event.run_created_attributes.labels["ticket\nid"] = "LOGIN\n500"
    event.run_created_attributes.goal.objective = "fix the login\r\nand keep tokens"
    line = render.event_line(event).plain
    assert "\n" not in line and "\r" not in line
    assert 'labels."ticket id"="LOGIN 500"' in line
    assert 'goal.objective="fix the login and keep tokens"' in line


def test_event_type_is_the_logs_dotted_name() -> None:
    event = event_pb2.Event(event_type=enum_pb2.EVENT_TYPE_THREAD_MESSAGE_APPENDED)
    event.thread_message_appended_attributes.message_id = "msg_1"
    assert render.event_type(event) == "thread.message_appended"
    newer = event_pb2.Event(event_type=enum_pb2.EVENT_TYPE_ARTIFACT_CREATED)
    assert render.event_type(newer) == "artifact_created"  # no attributes this client knows


def test_enum_labels_drop_the_prefix_and_unset_is_a_dash() -> None:
    assert render.enum_label(enum_pb2.RunStatus, enum_pb2.RUN_STATUS_WAITING_APPROVAL) == (
        "WAITING_APPROVAL"
    )
    assert render.enum_label(enum_pb2.RunStatus, 0) == "-"
    assert "UNSPECIFIED" not in " ".join(render.enum_choices(enum_pb2.RunStatus))
    assert render.enum_choices(enum_pb2.ConcurrencyPolicy) == [
        "REJECT",
        "ENQUEUE",
        "INTERRUPT",
        "ALLOW",
    ]


def test_model_text_names_the_candidate_and_a_different_reported_model() -> None:
    model = message_pb2.RecordedModel(
        candidate_name="fallback",
        provider="openai",
        requested_model_id="gpt-4.1",
        reported_model_id="gpt-4.1-2025-04-14",
        reason=enum_pb2.CANDIDATE_REASON_FALLBACK_AFTER_ERROR,
    )
    assert (
        render.model_text(model)
        == "gpt-4.1 -> gpt-4.1-2025-04-14 via fallback/openai (FALLBACK_AFTER_ERROR)"
    )
    assert render.model_text(message_pb2.RecordedModel()) == ""


def test_user_text_is_not_markup_and_pipes_are_not_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A COLUMNS the caller sets wins (pytest-xdist's workers run with COLUMNS=80).
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = render.console(out)
    console.print(
        render.table(
            "",
            (render.Column("THREAD"), render.Column("TITLE", text=True)),
            [("thr_1", "login [bold]returns[/bold] 500")],
        )
    )
    assert "login [bold]returns[/bold] 500" in out.getvalue()
    assert console.width == render.PIPE_WIDTH


def test_json_line_uses_proto_field_names_on_one_line() -> None:
    line = render.json_line(message_pb2.Run(id="run_1", thread_id="thr_1", step_count=3))
    assert "\n" not in line
    assert json.loads(line) == {"id": "run_1", "thread_id": "thr_1", "step_count": "3"}


def test_transfer_shows_progress_on_a_terminal_and_nothing_elsewhere() -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    with render.Transfer("exporting run_1", terminal) as shown:
        shown.sized(2048)
        shown.advance(1024)
        shown.advance(1024)
        terminal_progress = shown._progress
    assert terminal_progress is not None
    [task] = terminal_progress.tasks
    assert (task.total, task.completed, task.description) == (2048, 2048, "exporting run_1")
    assert "exporting run_1" in screen.getvalue()

    piped = io.StringIO()
    with render.Transfer("exporting run_1", Console(file=piped)) as shown:
        shown.sized(10)
        shown.advance(10)
        assert shown._progress is None
    assert piped.getvalue() == ""


RUN_ID = "run_01M901J7Y106C2SW55KY4TKQG1"
THREAD_ID = "thr_01M901J7WSSZNKW62KHDMFA80G"
OBJECTIVE = "fix the login failure and keep legacy-token compatibility"


def _runs(width: int) -> list[str]:
    """A runs table like `agentrt runs list`'s, printed at ``width``."""
    out = io.StringIO()
    Column = render.Column
    render_table = render.table(
        "",
        (
            Column("RUN"),
            Column("THREAD", hide=4),
            Column("AGENT", text=True, hide=5),
            Column("STATUS", text=True),
            Column("STEPS", hide=6),
            Column("CREATED", hide=3),
            Column("OBJECTIVE", text=True, hide=2),
        ),
        [
            (
                RUN_ID,
                THREAD_ID,
                "coding_agent@agent_v7 (via :prod)",
                "QUEUED",
                "0",
                "2026-12-04T08:08:38Z",
                OBJECTIVE,
            ),
        ],
    )
    Console(file=out, width=width).print(render_table)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_table_ids_are_whole_on_one_line_and_words_are_not_broken(width: int) -> None:
    lines = _runs(width)
    assert all(len(line) <= width for line in lines), lines
    text = "\n".join(lines)
    for ident in (RUN_ID, THREAD_ID, "2026-12-04T08:08:38Z"):
        # No piece of it stands alone: never wrapped, never cut.
        tokens = text.replace("│", " ").split()
        assert not [t for t in tokens if t != ident and len(t) >= 4 and t in ident], text
    assert RUN_ID in text and "2026-12-04T08:08:38Z" in text
    # Text wraps between words only.
    words = text.replace("│", " ").split()
    assert all(word in words for word in OBJECTIVE.split()), text


def test_table_leaves_out_the_highest_ranked_columns_and_says_so() -> None:
    wide = "\n".join(_runs(200))
    assert THREAD_ID in wide and "not shown" not in wide
    # A short text column is given its whole line before a long one takes the rest.
    assert "coding_agent@agent_v7 (via :prod)" in wide
    at_120 = "\n".join(_runs(120))
    assert THREAD_ID in at_120 and "coding_agent" not in at_120 and "STEPS" in at_120
    assert "not shown at this width: AGENT" in at_120
    at_80 = " ".join(" ".join(_runs(80)).split())
    assert THREAD_ID not in at_80 and "legacy-token" in at_80
    assert "not shown at this width: THREAD, AGENT, STEPS" in at_80


def test_a_value_too_long_to_sit_beside_its_key_goes_below_it_whole() -> None:
    digest = "sha256:" + "d" * 64
    rows = [
        ("run", RUN_ID),
        ("agent", f"coding_agent@agent_v7 {digest}"),
        ("empty", ""),
        ("input revision", "1"),  # the keys' column is as wide as `runs show`'s
    ]
    narrow, wide = io.StringIO(), io.StringIO()
    Console(file=narrow, width=80).print(render.key_values(rows))
    Console(file=wide, width=120).print(render.key_values(rows))
    lines = [line.rstrip() for line in narrow.getvalue().splitlines()]
    assert lines[0].split() == ["run", RUN_ID]
    assert lines[1:4] == ["agent", "  coding_agent@agent_v7", f"  {digest}"]
    assert lines[4].split() == ["input", "revision", "1"]
    assert [line.split() for line in wide.getvalue().splitlines()] == [
        ["run", RUN_ID],
        ["agent", "coding_agent@agent_v7", digest],
        ["input", "revision", "1"],
    ]
