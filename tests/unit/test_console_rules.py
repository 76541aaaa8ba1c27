"""The console's own rules, without a server: sessions (expiry, the cap, sign-out), the form
token comparison, where sign-in may send a browser next, the runs list's filters read
from a query string, and the attempts drawn against time."""

from __future__ import annotations

import datetime as dt

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from multidict import MultiDict

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt_base.auth import Principal
from runtime_service.console import sessions as console_sessions
from runtime_service.console.sessions import Sessions, next_path, same_token
from runtime_service.console.views import RunFilter, attempt_bars


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_lives_while_used_and_no_longer_than_its_lifetime() -> None:
    clock = Clock()
    kept = Sessions()
    kept._now = clock
    session = kept.open(Principal("ops"), "token-1")
    assert kept.get(session.id) is session and session.who == "ops"
    clock.now += console_sessions.IDLE_SECONDS - 1
    assert kept.get(session.id) is session  # used: its idle clock restarts
    clock.now += console_sessions.IDLE_SECONDS + 1
    assert kept.get(session.id) is None  # idle too long
    other = kept.open(None, "")
    for _ in range(int(console_sessions.LIFETIME_SECONDS // 1800) + 1):
        clock.now += 1800
        kept.get(other.id)
    assert kept.get(other.id) is None  # used all along, but past its lifetime


def test_sessions_are_capped_oldest_first_and_sign_out_ends_one() -> None:
    kept = Sessions()
    first = kept.open(None, "")
    second = kept.open(None, "")
    kept.close(second.id)
    assert kept.get(second.id) is None and kept.get(first.id) is first
    for _ in range(console_sessions.KEPT):
        kept.open(None, "")
    assert kept.get(first.id) is None, "the oldest gave way"
    assert kept.get("") is None and kept.get(None) is None


def test_ids_and_form_tokens_are_unguessable_and_compared_exactly() -> None:
    kept = Sessions()
    a, b = kept.open(None, ""), kept.open(None, "")
    assert a.id != b.id and a.csrf != b.csrf and len(a.csrf) >= 43
    assert same_token(a.csrf, a.csrf)
    assert not same_token(a.csrf, b.csrf)
    assert not same_token(a.csrf, None)
    assert not same_token("", "")


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        ("/runs/run_1?steps=x", "/runs/run_1?steps=x"),
        ("/registry", "/registry"),
        ("https://evil.example/", "/runs"),
        ("//evil.example/", "/runs"),
        ("/\\evil.example", "/runs"),
        ("/runs\r\nSet-Cookie: x=1", "/runs"),
        ("runs", "/runs"),
        (None, "/runs"),
        (["/runs"], "/runs"),
    ],
)
def test_sign_in_sends_a_browser_only_to_a_page_of_this_console(asked: object, goes: str) -> None:
    assert next_path(asked) == goes


def test_the_runs_filter_keeps_only_what_the_list_can_ask() -> None:
    query = MultiDict(
        [
            ("namespace", " team-a "),
            ("agent", "coding_agent"),
            ("status", "RUNNING"),
            ("status", "NOT_A_STATUS"),
            ("status", "<script>"),
            ("page", "tok"),
        ]
    )
    chosen = RunFilter.of(query)
    assert chosen.statuses == ("RUNNING",) and chosen.namespace == "team-a"
    request = chosen.request(50)
    assert list(request.statuses) == [enum_pb2.RUN_STATUS_RUNNING]
    assert (request.page_size, request.page_token, request.agent_id) == (50, "tok", "coding_agent")
    assert chosen.next_page("") == ""
    assert (
        chosen.next_page("next") == "namespace=team-a&agent=coding_agent&status=RUNNING&page=next"
    )


def test_attempts_are_drawn_against_the_runs_time() -> None:
    """A bar starts where its attempt started and is as long as it lasted, in thousandths of
    the span from the run's creation to its end; a live run's span ends now, and its open
    attempt reaches the right edge."""

    def at(seconds: int) -> Timestamp:
        return Timestamp(seconds=1_800_000_000 + seconds)

    run = message_pb2.Run(status=enum_pb2.RUN_STATUS_COMPLETED, create_time=at(0), end_time=at(10))
    first = message_pb2.Attempt(
        number=1,
        start_time=at(1),
        end_time=at(3),
        status=enum_pb2.ATTEMPT_STATUS_FAILED,
        reason=enum_pb2.ATTEMPT_REASON_INITIAL,
        lease_epoch=1,
    )
    second = message_pb2.Attempt(
        number=2,
        start_time=at(5),
        end_time=at(10),
        status=enum_pb2.ATTEMPT_STATUS_SUCCEEDED,
        reason=enum_pb2.ATTEMPT_REASON_RETRY_AFTER_ERROR,
        lease_epoch=2,
    )
    now = at(60).ToDatetime(tzinfo=dt.UTC)
    bars = attempt_bars(run, [first, second], now)
    assert [(b.x, b.width, b.status) for b in bars] == [
        (100, 200, "failed"),
        (500, 500, "succeeded"),
    ]
    assert bars[0].label == "#1 INITIAL → FAILED, lease epoch 1, 2.0 s"
    assert {b.span for b in bars} == {"10.0 s"}

    live = message_pb2.Run(status=enum_pb2.RUN_STATUS_RUNNING, create_time=at(0))
    running = message_pb2.Attempt(
        number=1, start_time=at(15), status=enum_pb2.ATTEMPT_STATUS_ACTIVE, lease_epoch=1
    )
    (bar,) = attempt_bars(live, [running], at(20).ToDatetime(tzinfo=dt.UTC))
    assert (bar.x, bar.width, bar.status, bar.span) == (750, 250, "active", "20.0 s")
    assert attempt_bars(live, [], now) == []
