"""The run state machine (runtime_service/lifecycle.py), and docs/lifecycle.md's table of it.

The documentation test parses the Markdown transition table and compares it, row for row,
with ``lifecycle.TRANSITIONS``: a transition added, removed or changed in the code without
the docs (or the other way round) fails here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrt_core import event_chain, jcs
from agentrt_core.errors import FailedPrecondition
from runtime_service import lifecycle
from runtime_service.lifecycle import TERMINAL, Actor, RunStatus, Transition, Trigger

DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"
HEADER = (
    "from",
    "trigger",
    "to",
    "who",
    "terminal reason",
    "attempt ends as",
    "events written",
    "rpc / mechanism",
)
NONE = "—"
TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class DocRow:
    source: str
    trigger: str
    target: str
    actors: frozenset[str]
    reason: str | None
    attempt_end: str | None
    events: tuple[str, ...]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _first_ticked(cell: str, column: str) -> str | None:
    """The first `code` word of a cell, or None for a cell that is exactly the dash."""
    if cell == NONE:
        return None
    found = TICKED.search(cell)
    assert found is not None, f"{column} cell {cell!r}: expected `VALUE` or {NONE}"
    return found.group(1)


def parse_transition_table(text: str) -> list[DocRow]:
    """The rows of the one table whose header is :data:`HEADER`."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if tuple(c.lower() for c in _cells(line)) == HEADER]
    assert len(starts) == 1, f"expected exactly one transition table headed {HEADER}"
    rows: list[DocRow] = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(HEADER), f"row {line!r} has {len(cells)} cells"
        source, trigger, target = (_first_ticked(c, "status/trigger") for c in cells[:3])
        assert source and trigger and target, f"row {line!r}: from, trigger and to are required"
        rows.append(
            DocRow(
                source=source,
                trigger=trigger,
                target=target,
                actors=frozenset(TICKED.findall(cells[3])),
                reason=_first_ticked(cells[4], "terminal reason"),
                attempt_end=_first_ticked(cells[5], "attempt ends as"),
                events=tuple(TICKED.findall(cells[6])),
            )
        )
    return rows


def _as_doc_row(t: Transition) -> tuple[str, str, str, frozenset[str], str | None, str | None]:
    return (
        t.source.value,
        t.trigger.value,
        t.target.value,
        frozenset(a.value for a in t.actors),
        t.reason.value if t.reason else None,
        t.attempt_end,
    )


# -- the documentation -------------------------------------------------------------------------


def test_doc_table_lists_exactly_the_transitions() -> None:
    rows = parse_transition_table(DOC.read_text(encoding="utf-8"))
    documented = [(r.source, r.trigger, r.target, r.actors, r.reason, r.attempt_end) for r in rows]
    coded = [_as_doc_row(t) for t in lifecycle.TRANSITIONS]
    assert len(documented) == len(set(documented)), "a transition is documented twice"
    missing = set(coded) - set(documented)
    extra = set(documented) - set(coded)
    assert not missing, f"in lifecycle.TRANSITIONS but not in docs/lifecycle.md: {missing}"
    assert not extra, f"in docs/lifecycle.md but not in lifecycle.TRANSITIONS: {extra}"
    assert len(documented) == len(coded)


def test_doc_table_names_the_events_each_transition_writes() -> None:
    """transitions.apply writes attempt.ended when an attempt ends, then run.ended for a
    terminal target and run.status_changed otherwise; the table must say the same."""
    rows = parse_transition_table(DOC.read_text(encoding="utf-8"))
    by_key = {(t.source.value, t.trigger.value): t for t in lifecycle.TRANSITIONS}
    for row in rows:
        t = by_key[(row.source, row.trigger)]
        expected = [*(["attempt.ended"] if t.attempt_end else [])]
        expected.append("run.ended" if t.target.terminal else "run.status_changed")
        written = [e for e in row.events if e != "attempt.started"]
        assert written == expected, f"{row.source} --{row.trigger}--> events {row.events}"
        # attempt.started follows only the acquisition (written by AcquireRun itself).
        assert ("attempt.started" in row.events) == (t.trigger is Trigger.ACQUIRE)


def test_doc_diagram_has_an_arrow_for_every_status_change() -> None:
    text = DOC.read_text(encoding="utf-8")
    diagram = re.search(r"```mermaid\n(stateDiagram-v2\n.*?)```", text, re.S)
    assert diagram is not None, "docs/lifecycle.md has no Mermaid stateDiagram-v2"
    expected = {(t.source.value, t.target.value) for t in lifecycle.TRANSITIONS}
    expected.add(("[*]", RunStatus.QUEUED.value))
    expected |= {(s.value, "[*]") for s in TERMINAL}
    arrows = set(re.findall(r"^\s*(\[\*\]|\w+)\s*-->\s*(\[\*\]|\w+)", diagram.group(1), re.M))
    assert arrows == expected


def test_doc_worked_example_hashes_recompute() -> None:
    """Each example block is the exact canonical text of an event and its hash, chained."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```\n(\{.*?\})\n(sha256:[0-9a-f]{64})\n```", text)
    assert len(blocks) == 3
    previous = ""
    for sequence, (line, digest) in enumerate(blocks, start=1):
        document = json.loads(line)
        assert jcs.canonical_bytes(document) == line.encode(), "not the canonical form"
        assert "sha256:" + hashlib.sha256(line.encode()).hexdigest() == digest
        assert (document["sequence"], document["prev_hash"]) == (sequence, previous)
        assert document["type"] == "agentrt.event.v1"
        assert digest == event_chain.event_hash(
            event_id=document["id"],
            thread_id=document["thread_id"],
            run_id=document["run_id"],
            sequence=document["sequence"],
            event_type=document["event_type"],
            event_time=document["event_time"],
            attributes=document["attributes"],
            prev_hash=document["prev_hash"],
        )
        previous = digest


# -- the table itself --------------------------------------------------------------------------


def test_no_two_transitions_share_a_source_and_trigger() -> None:
    keys = [(t.source, t.trigger) for t in lifecycle.TRANSITIONS]
    assert len(keys) == len(set(keys))


def test_terminal_statuses_have_no_outgoing_transitions() -> None:
    """Any transition of an ended run is refused with the contract's one reason for an ended
    run, RUN_ENDED, as every other call that needs a live run is (lifecycle.require_live)."""
    assert {t.source for t in lifecycle.TRANSITIONS}.isdisjoint(TERMINAL)
    for status, trigger, actor in itertools.product(TERMINAL, Trigger, Actor):
        with pytest.raises(FailedPrecondition) as raised:
            lifecycle.transition(status, trigger, actor)
        assert raised.value.reason == "RUN_ENDED"
        assert raised.value.metadata == {"current_status": status.value, "trigger": trigger.value}
        assert "has ended" in raised.value.message
    with pytest.raises(FailedPrecondition) as raised:
        lifecycle.require_live(RunStatus.COMPLETED, "it takes no more input")
    assert raised.value.message == "run is COMPLETED (it has ended): it takes no more input"
    assert raised.value.metadata == {"current_status": "COMPLETED"}
    for live in set(RunStatus) - TERMINAL:
        lifecycle.require_live(live, "anything")


@pytest.mark.parametrize(
    ("status", "trigger", "cancel", "pause", "expected"),
    [
        (RunStatus.CANCELLED, Trigger.CANCEL, False, False, lifecycle.ClientAsk.UNCHANGED),
        (RunStatus.RUNNING, Trigger.CANCEL, True, False, lifecycle.ClientAsk.UNCHANGED),
        (RunStatus.RUNNING, Trigger.CANCEL, False, True, lifecycle.ClientAsk.REQUEST),
        (RunStatus.QUEUED, Trigger.CANCEL, False, False, lifecycle.ClientAsk.TRANSITION),
        (RunStatus.COMPLETED, Trigger.CANCEL, False, False, lifecycle.ClientAsk.TRANSITION),
        (RunStatus.PAUSED, Trigger.PAUSE, False, False, lifecycle.ClientAsk.UNCHANGED),
        (RunStatus.RUNNING, Trigger.PAUSE, False, True, lifecycle.ClientAsk.UNCHANGED),
        (RunStatus.RUNNING, Trigger.PAUSE, False, False, lifecycle.ClientAsk.REQUEST),
        (RunStatus.QUEUED, Trigger.PAUSE, False, False, lifecycle.ClientAsk.TRANSITION),
        (RunStatus.RUNNING, Trigger.RESUME, False, True, lifecycle.ClientAsk.WITHDRAW),
        (RunStatus.RUNNING, Trigger.RESUME, False, False, lifecycle.ClientAsk.TRANSITION),
        (RunStatus.PAUSED, Trigger.RESUME, False, False, lifecycle.ClientAsk.TRANSITION),
    ],
)
def test_what_a_clients_cancel_pause_or_resume_does(
    status: RunStatus, trigger: Trigger, cancel: bool, pause: bool, expected: object
) -> None:
    """A client never moves a RUNNING run: it asks (REQUEST), and asking again, or for what
    the run already is, changes nothing; everything else is the client's own transition,
    which ``transition`` may still refuse (a COMPLETED run's cancel: RUN_ENDED)."""
    ask = lifecycle.client_ask(status, trigger, cancel_requested=cancel, pause_requested=pause)
    assert ask is expected


def test_a_run_whose_cancel_is_pending_cannot_be_paused() -> None:
    with pytest.raises(FailedPrecondition) as raised:
        lifecycle.client_ask(
            RunStatus.RUNNING, Trigger.PAUSE, cancel_requested=True, pause_requested=False
        )
    assert raised.value.reason == "ILLEGAL_TRANSITION"


def test_a_reason_exactly_on_terminal_transitions() -> None:
    for t in lifecycle.TRANSITIONS:
        if t.target.terminal:
            assert t.reason is not None, f"{t.source} --{t.trigger}--> {t.target} needs a reason"
        else:
            assert t.reason is None, f"{t.source} --{t.trigger}--> {t.target} has a reason"


def test_an_attempt_ends_exactly_when_a_running_run_leaves_running() -> None:
    """Only RUNNING has an active attempt, and every way out of RUNNING ends it."""
    for t in lifecycle.TRANSITIONS:
        leaves_running = t.source is RunStatus.RUNNING and t.target is not RunStatus.RUNNING
        assert (t.attempt_end is not None) == leaves_running, t


def test_every_transition_has_someone_to_make_it() -> None:
    for t in lifecycle.TRANSITIONS:
        assert t.actors, t
        assert t.description, t


def test_every_status_is_reachable_and_every_active_status_can_end() -> None:
    edges = {(t.source, t.target) for t in lifecycle.TRANSITIONS}
    reached = {RunStatus.QUEUED}
    frontier = [RunStatus.QUEUED]
    while frontier:
        here = frontier.pop()
        for source, target in edges:
            if source is here and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(RunStatus)
    for status in set(RunStatus) - TERMINAL:
        assert lifecycle.can(status, Trigger.TIME_OUT), status
        assert lifecycle.can(status, Trigger.CANCEL), status
        assert lifecycle.can(status, Trigger.INTERRUPT), status


def test_legal_transitions_are_returned_for_each_allowed_actor() -> None:
    for t in lifecycle.TRANSITIONS:
        assert lifecycle.can(t.source, t.trigger)
        for actor in t.actors:
            assert lifecycle.transition(t.source, t.trigger, actor) is t


def test_the_wrong_actor_is_refused() -> None:
    refused = 0
    for t in lifecycle.TRANSITIONS:
        for actor in set(Actor) - t.actors:
            with pytest.raises(FailedPrecondition) as raised:
                lifecycle.transition(t.source, t.trigger, actor)
            assert raised.value.reason == "ILLEGAL_TRANSITION"
            assert raised.value.metadata == {
                "current_status": t.source.value,
                "trigger": t.trigger.value,
            }
            assert actor.value in raised.value.message
            refused += 1
    assert refused > 0
    # Examples worth naming: a client cannot complete a run, a worker cannot resume one.
    with pytest.raises(FailedPrecondition):
        lifecycle.transition(RunStatus.RUNNING, Trigger.COMPLETE, Actor.CLIENT)
    with pytest.raises(FailedPrecondition):
        lifecycle.transition(RunStatus.PAUSED, Trigger.RESUME, Actor.WORKER)
    with pytest.raises(FailedPrecondition):
        lifecycle.transition(RunStatus.RUNNING, Trigger.CANCEL, Actor.CLIENT)


def test_illegal_transitions_raise_failed_precondition_naming_the_status() -> None:
    illegal = [
        (status, trigger)
        for status, trigger in itertools.product(RunStatus, Trigger)
        if not lifecycle.can(status, trigger) and not status.terminal
    ]
    assert len(illegal) == (len(RunStatus) - len(TERMINAL)) * len(Trigger) - len(
        lifecycle.TRANSITIONS
    )
    for (status, trigger), actor in itertools.product(illegal, Actor):
        with pytest.raises(FailedPrecondition) as raised:
            lifecycle.transition(status, trigger, actor)
        error = raised.value
        assert error.reason == "ILLEGAL_TRANSITION"
        assert error.metadata == {"current_status": status.value, "trigger": trigger.value}
        assert status.value in error.message


@pytest.mark.parametrize(
    ("status", "trigger"),
    [
        (RunStatus.QUEUED, Trigger.COMPLETE),
        (RunStatus.QUEUED, Trigger.RESUME),
        (RunStatus.RUNNING, Trigger.ACQUIRE),
        (RunStatus.RUNNING, Trigger.RESUME),
        (RunStatus.PAUSED, Trigger.ACQUIRE),
        (RunStatus.PAUSED, Trigger.PAUSE),
        (RunStatus.WAITING_APPROVAL, Trigger.ACQUIRE),
        (RunStatus.COMPLETED, Trigger.CANCEL),
    ],
)
def test_named_illegal_transitions(status: RunStatus, trigger: Trigger) -> None:
    with pytest.raises(FailedPrecondition) as raised:
        lifecycle.transition(status, trigger, Actor.RUNTIME)
    assert raised.value.metadata["current_status"] == status.value
