"""How the operator commands show things: rich tables for people, JSON lines for scripts.

Every value a user or an agent wrote (a thread title, an objective, a tool's arguments) goes
into a :class:`rich.text.Text`, never into a markup string, so ``[bold]`` in a title is
printed as written. Output that is not a terminal gets a wide fixed width (``COLUMNS``
overrides it) instead of rich's 80 columns, so a table piped to a file or read by a test is
not folded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from google.protobuf import timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from agentrt.registry.v1 import message_pb2 as registry_pb2
from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt_core import proto_json
from agentrt_core.event_chain import event_type_name

__all__ = [
    "Column",
    "Transfer",
    "as_dict",
    "console",
    "enum_choices",
    "enum_label",
    "event_line",
    "event_summary",
    "event_type",
    "json_line",
    "key_values",
    "model_text",
    "print_json",
    "published_by",
    "table",
    "timestamp_text",
    "verified_text",
    "when",
]

#: Width of output that is not a terminal (a pipe, a file, a test).
PIPE_WIDTH = 200
#: The longest attribute value an event summary shows before cutting it with "…" (a
#: digest, 71 characters, is shown whole).
SUMMARY_VALUE_CHARS = 80


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits 1 in silence; a closed stdout ends every agentrt command the
        # same way instead (runtime_service.cli.entry: 141), so it goes up as it came.
        raise BrokenPipeError


def console(stream: TextIO | None = None) -> Console:
    """A console on ``stream`` (stdout): no highlighting of numbers or paths in user content."""
    out = stream or sys.stdout
    wide = not out.isatty() and "COLUMNS" not in os.environ
    return _Console(file=out, width=PIPE_WIDTH if wide else None, highlight=False)


def as_dict(message: Message) -> dict[str, Any]:
    """``message`` as JSON-ready data, with the proto field names (``thread_id``)."""
    return proto_json.message_json(message)


def json_line(data: Message | Mapping[str, Any]) -> str:
    """One JSON object on one line (for ``--json``: one object per item or event)."""
    value = as_dict(data) if isinstance(data, Message) else data
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def print_json(items: Iterable[Message | Mapping[str, Any]]) -> None:
    for item in items:
        print(json_line(item), flush=True)


def enum_label(enum: Any, value: int) -> str:
    """``RUN_STATUS_WAITING_APPROVAL`` as ``WAITING_APPROVAL``; ``-`` when unset."""
    if not value:
        return "-"
    return proto_json.display_name(enum, value)


def enum_choices(enum: Any) -> list[str]:
    """The labels of every value of ``enum`` but the unspecified one (for ``choices``)."""
    return [enum_label(enum, value) for value in enum.values() if value]


def timestamp_text(stamp: timestamp_pb2.Timestamp, *, precise: bool = False) -> str:
    """A timestamp as every command prints one: ISO 8601 UTC (``2026-12-02T07:01:02Z``, with
    milliseconds when ``precise``); ``-`` when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    moment = proto_json.from_timestamp(stamp)
    text = moment.isoformat(timespec="milliseconds" if precise else "seconds")
    return text.replace("+00:00", "Z")


#: The short name the operator and audit commands use.
when = timestamp_text


def published_by(publish: registry_pb2.PublishRecord) -> str:
    """``principal`` and, when it differs, the name the publisher gave: ``ci@acme (says
    "alice")``. The principal is who the server authenticated; the name is a label."""
    principal = publish.principal or "(not recorded)"
    said = publish.provenance.publisher
    return f"{principal} (says {json.dumps(said)})" if said and said != principal else principal


def verified_text(verified: registry_pb2.VerifiedProvenance) -> str:
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


@dataclass(frozen=True)
class Column:
    """A column of :func:`table`, and the one rule for how its values may be laid out.

    Attributes:
        header: its heading.
        text: free text (a title, an objective, a status with its reason, a summary) that
            may wrap between words; a word longer than :data:`LONGEST_WHOLE_WORD` is folded.
            Otherwise every value is one token a person copies (an id, a digest, a time, a
            count): never wrapped, never cut, and the column is as wide as its widest value.
        hide: 0 for a column always shown. The others are shown lowest ``hide`` first, each
            while the width still holds it (whole values whole, text at least its longest
            word); the table's caption names those left out.
    """

    header: str
    text: bool = False
    hide: int = 0


#: A text column is at least as wide as its longest word, up to this many cells: a longer
#: word (a URL in an objective) is folded rather than widening the column past it.
LONGEST_WHOLE_WORD = 24
#: What a column costs beside its values: a space either side of the `│` between columns.
_SEPARATOR = 3


def table(title: str, columns: Sequence[Column], rows: Iterable[Sequence[str]]) -> _Fitted:
    """A table whose cells are plain text (no markup), laid out for the width it is printed
    at: ids whole on one line, text wrapped between words, and what cannot fit left out
    (named in the caption) rather than broken."""
    return _Fitted(title, tuple(columns), [tuple(row) for row in rows])


def _words_width(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _lines_width(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


class _Fitted:
    """:func:`table`'s renderable: it chooses columns and widths when rich tells it the
    width (a terminal's, ``COLUMNS``, or :data:`PIPE_WIDTH`), then draws a rich Table whose
    every column has a fixed width, so rich itself never squeezes an id."""

    def __init__(
        self, title: str, columns: tuple[Column, ...], rows: list[tuple[str, ...]]
    ) -> None:
        self.title = title
        self.columns = columns
        self.rows = rows

    def _cells(self, index: int) -> list[str]:
        return [row[index] for row in self.rows]

    def _least(self, index: int) -> int:
        """The narrowest column ``index`` may be."""
        column, cells = self.columns[index], self._cells(index)
        if not column.text:
            return max([cell_len(column.header), *(_lines_width(cell) for cell in cells)])
        words = min(max((_words_width(cell) for cell in cells), default=0), LONGEST_WHOLE_WORD)
        return max(_words_width(column.header), words, 1)

    def _most(self, index: int) -> int:
        return max(
            [_lines_width(self.columns[index].header), *map(_lines_width, self._cells(index))]
        )

    def layout(self, width: int) -> tuple[list[int], dict[int, int]]:
        """The columns shown at ``width`` (their indexes) and each one's width."""
        least = {i: self._least(i) for i in range(len(self.columns))}

        def need(indexes: list[int]) -> int:
            return sum(least[i] for i in indexes) + _SEPARATOR * (len(indexes) - 1)

        # The columns always shown (each table's fit in 70 cells; in a narrower terminal
        # rich cuts them). Then the others, lowest rank first, each one that still fits.
        shown = [i for i, column in enumerate(self.columns) if not column.hide]
        optional = [i for i, column in enumerate(self.columns) if column.hide]
        for index in sorted(optional, key=lambda i: (self.columns[i].hide, i)):
            if need(sorted([*shown, index])) <= width:
                shown = sorted([*shown, index])
        widths = {i: least[i] for i in shown}
        most = {i: self._most(i) for i in shown if self.columns[i].text}
        spare = width - need(shown)
        # Text columns grow to their longest line, the shortest need first, so a short agent
        # name stays on one line and a long objective wraps in what is left.
        for index in sorted(most, key=lambda i: (most[i] - widths[i], i)):
            grant = max(0, min(most[index] - widths[index], spare))
            widths[index] += grant
            spare -= grant
        return shown, widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, widths = self.layout(options.max_width)
        hidden = [c.header for i, c in enumerate(self.columns) if i not in shown]
        caption = (
            f"not shown at this width: {', '.join(hidden)} (a wider terminal or --json shows them)"
            if hidden
            else None
        )
        grid = Table(
            title=self.title or None,
            title_justify="left",
            caption=caption,
            caption_justify="left",
            show_edge=False,
            pad_edge=False,
        )
        for i in shown:
            column = self.columns[i]
            grid.add_column(
                Text(column.header, no_wrap=not column.text),
                width=widths[i],
                no_wrap=not column.text,
                overflow="fold",
            )
        for row in self.rows:
            grid.add_row(*(Text(row[i]) for i in shown))
        yield grid


def key_values(rows: Iterable[tuple[str, str]]) -> _KeyValues:
    """``key  value`` lines, the empty values left out. A value with a word too long to sit
    beside its key at the width it is printed at (a 71-character digest in 80 columns) goes
    on the lines below the key instead, so the word is not broken."""
    return _KeyValues([(key, value) for key, value in rows if value])


#: The spaces between a key and its value.
_KEY_GAP = 2


class _KeyValues:
    """:func:`key_values`' renderable: which values sit beside their keys is decided at the
    width rich gives it."""

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keys = max((cell_len(key) for key, _ in self.rows), default=0)
        room = options.max_width - keys - _KEY_GAP
        beside: list[tuple[str, str]] = []
        for key, value in self.rows:
            if _words_width(value) <= room:
                beside.append((key, value))
                continue
            if beside:
                yield self._grid(beside, keys)
                beside = []
            yield Text(key, style="bold")
            yield Padding(Text(value, overflow="fold"), (0, 0, 0, _KEY_GAP))
        if beside:
            yield self._grid(beside, keys)

    @staticmethod
    def _grid(rows: list[tuple[str, str]], keys: int) -> Table:
        grid = Table.grid(padding=(0, _KEY_GAP))
        grid.add_column(style="bold", no_wrap=True, width=keys)
        grid.add_column(overflow="fold")
        for key, value in rows:
            grid.add_row(Text(key), Text(value))
        return grid


def model_text(model: message_pb2.RecordedModel) -> str:
    """``claude-sonnet-4 via primary/anthropic (PRIMARY)``, with the reported id when the
    provider answered with another; empty for a step that is not a model call."""
    if not model.candidate_name and not model.requested_model_id:
        return ""
    text = model.requested_model_id or "?"
    if model.reported_model_id and model.reported_model_id != model.requested_model_id:
        text += f" -> {model.reported_model_id}"
    text += f" via {model.candidate_name}"
    if model.provider:
        text += f"/{model.provider}"
    if model.reason:
        text += f" ({enum_label(enum_pb2.CandidateReason, model.reason)})"
    return text


# -- events ----------------------------------------------------------------------------------


def event_type(event: event_pb2.Event) -> str:
    """``run.status_changed``: the dotted name the log and the bundles use (docs/audit.md)."""
    which = event.WhichOneof("attributes")
    if which is None:  # an event type newer than this client
        return enum_label(enum_pb2.EventType, event.event_type).lower()
    return event_type_name(getattr(event, which))


def _one_line(text: str) -> str:
    """Text a user or a worker wrote, as a summary shows it: its line breaks and runs of
    spaces one space (an event is one line, whatever a label key or a summary holds), cut
    with "…" past :data:`SUMMARY_VALUE_CHARS`, and quoted when it holds a space."""
    one_line = " ".join(text.split())
    if len(one_line) > SUMMARY_VALUE_CHARS:
        one_line = one_line[: SUMMARY_VALUE_CHARS - 1] + "…"
    return json.dumps(one_line, ensure_ascii=False) if " " in one_line else one_line


def _scalar(field: FieldDescriptor, value: Any) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum(field, value)
    if isinstance(value, str):
        return _one_line(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _enum(field: FieldDescriptor, value: int) -> str:
    assert field.enum_type is not None  # an enum field always has its enum type
    return proto_json.display_name(field.enum_type, value)


def _flatten(message: Message, prefix: str) -> list[str]:
    parts: list[str] = []
    for field, value in message.ListFields():
        key = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            parts += [
                f"{key}.{_one_line(k)}={_scalar(field.message_type.fields[1], v)}"
                for k, v in value.items()
            ]
        elif field.is_repeated:
            if field.message_type is not None:
                parts.append(f"{key}=[{len(value)}]")
            else:
                parts.append(f"{key}=[{', '.join(_scalar(field, v) for v in value)}]")
        elif field.message_type is not None:
            if field.message_type.full_name == "google.protobuf.Timestamp":
                parts.append(f"{key}={when(value)}")
            elif field.message_type.full_name == "google.protobuf.Struct":
                parts.append(f"{key}={{{len(value.fields)} keys}}")
            else:
                parts += _flatten(value, key + ".")
        else:
            parts.append(f"{key}={_scalar(field, value)}")
    return parts


def event_summary(event: event_pb2.Event) -> str:
    """Every set attribute of the event as ``key=value`` on one line (nested messages with
    dotted keys, long text cut), e.g. ``step_id=stp_… type=TOOL_CALL tool_name=apply_patch``."""
    which = event.WhichOneof("attributes")
    if which is None:
        return ""
    return " ".join(_flatten(getattr(event, which), ""))


def event_line(event: event_pb2.Event, *, with_run: bool = False) -> Text:
    """``  12  2026-12-02T07:01:02.123Z  step.started  step_id=…`` (and the run for a thread)."""
    head = f"{event.sequence:>5}  {when(event.event_time, precise=True)}  "
    line = Text(head)
    line.append(f"{event_type(event):<26}", style="bold")
    if with_run and event.run_id:
        line.append(f"  {event.run_id}")
    line.append("  " + event_summary(event))
    return line


class Transfer:
    """Progress of a download whose size arrives with its first message (an audit bundle):
    a spinner while the server builds it, then a bar of bytes received, on stderr. Nothing
    is shown when stderr is not a terminal, so scripts and logs get no control codes.

        with Transfer("exporting run_…") as shown:
            shown.sized(info.size)
            shown.advance(len(chunk))
    """

    def __init__(self, description: str, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self._console.is_terminal:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=self._console,
                transient=True,
            )
            self._task = self._progress.add_task(description, total=None)

    def sized(self, total: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=total)

    def advance(self, size: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, size)

    def __enter__(self) -> Transfer:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
