"""Saved views (SaveView, ListViews, DeleteView; issue 30, item 9): a principal's named
runs-list filters, kept by the server, seen by that principal alone, as many as it likes,
checked as ListRuns checks its filters; on both engines, with two principals of one role."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.auth import new_token, token_entry
from tests.runtime_support import Stubs
from tests.support import error_details, rpc_error, serving

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def callers(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Stubs]]:
    tokens = {name: new_token() for name in ("alice", "bob", "robot")}
    config: Path = tmp_path_factory.mktemp("views") / "auth.toml"
    config.write_text(
        token_entry("alice", tokens["alice"], ["client"], [], ["team-a"])
        + token_entry("bob", tokens["bob"], ["client"], [], ["team-a"])
        + token_entry("robot", tokens["robot"], ["worker"], ["*"], ["team-a"])
    )
    with serving(shared_database_url, auth_config=str(config)) as server:
        stubs = {name: Stubs.open(server.address, token) for name, token in tokens.items()}
        try:
            yield stubs
        finally:
            for each in stubs.values():
                each.close()


def _time(text: str) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(dt.datetime.fromisoformat(text))
    return stamp


def _save(stubs: Stubs, name: str, **query: object) -> pb.SaveViewResponse:
    view = message_pb2.SavedView(name=name, query=message_pb2.RunsQuery(**query))
    return stubs.runtime.SaveView(pb.SaveViewRequest(view=view), timeout=10)


def _all(stubs: Stubs, page_size: int = 0) -> list[message_pb2.SavedView]:
    views: list[message_pb2.SavedView] = []
    token = ""
    while True:
        page = stubs.runtime.ListViews(
            pb.ListViewsRequest(page_size=page_size, page_token=token), timeout=10
        )
        views += page.views
        token = page.next_page_token
        if not token:
            return views


def _fields(error: grpc.RpcError) -> set[str]:
    return {v.field for v in error_details(error)["BadRequest"].field_violations}


def test_a_view_is_kept_whole_and_saving_its_name_again_replaces_it(
    callers: dict[str, Stubs],
) -> None:
    alice = callers["alice"]
    first = _save(
        alice,
        "failing prod runs",
        statuses=[enum_pb2.RUN_STATUS_FAILED, enum_pb2.RUN_STATUS_CANCELLED],
        agent_id="coding_agent",
        agent_tag="prod",
        agent_digest=DIGEST,
        namespace="team-a",
        thread_id="thr_x",
        create_time_start=_time("2026-12-01T00:00:00+00:00"),
        create_time_end=_time("2026-12-02T00:00:00+00:00"),
    )
    assert first.created
    assert first.view.principal == "alice"
    kept = {v.name: v for v in _all(alice)}["failing prod runs"]
    assert kept == first.view
    assert list(kept.query.statuses) == [enum_pb2.RUN_STATUS_FAILED, enum_pb2.RUN_STATUS_CANCELLED]
    assert kept.query.create_time_start.ToDatetime() == dt.datetime(2026, 12, 1)
    assert kept.query.agent_digest == DIGEST and kept.query.thread_id == "thr_x"

    again = _save(alice, "failing prod runs", agent_id="other_agent")
    assert not again.created
    assert again.view.query == message_pb2.RunsQuery(agent_id="other_agent")
    assert again.view.create_time == first.view.create_time
    assert again.view.update_time.ToDatetime() >= first.view.update_time.ToDatetime()
    assert [v.name for v in _all(alice)].count("failing prod runs") == 1


def test_a_principal_sees_and_changes_only_its_own_views(callers: dict[str, Stubs]) -> None:
    alice, bob = callers["alice"], callers["bob"]
    _save(alice, "alice's", agent_id="coding_agent")
    assert "alice's" not in [v.name for v in _all(bob)]
    gone = rpc_error(bob.runtime.DeleteView, pb.DeleteViewRequest(name="alice's"), timeout=10)
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    _save(bob, "alice's", agent_id="bob_agent")  # the same name, bob's own
    assert {v.name: v.query.agent_id for v in _all(alice)}["alice's"] == "coding_agent"
    # A page token is the principal's: bob cannot page through alice's views with it.
    for i in range(3):
        _save(alice, f"page {i}")
    token = alice.runtime.ListViews(pb.ListViewsRequest(page_size=1), timeout=10).next_page_token
    stolen = rpc_error(
        bob.runtime.ListViews, pb.ListViewsRequest(page_size=1, page_token=token), timeout=10
    )
    assert stolen.code() == grpc.StatusCode.INVALID_ARGUMENT and _fields(stolen) == {"page_token"}
    # A role without views.own is refused, naming the permission.
    refused = rpc_error(callers["robot"].runtime.ListViews, pb.ListViewsRequest(), timeout=10)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "views.own" in (refused.details() or "")


def test_views_are_not_capped_and_page_by_name(callers: dict[str, Stubs]) -> None:
    bob = callers["bob"]
    names = [f"view {i:04d}" for i in range(1200)]
    for name in names:
        _save(bob, name, statuses=[enum_pb2.RUN_STATUS_RUNNING])
    listed = [v.name for v in _all(bob, page_size=1000)]
    assert [n for n in listed if n.startswith("view ")] == names
    assert len(_all(bob)) == len(listed)  # the default page size reaches them all too


def test_a_view_that_lists_nothing_or_has_no_name_is_refused_naming_the_field(
    callers: dict[str, Stubs],
) -> None:
    alice = callers["alice"]
    before = _all(alice)
    cases: list[tuple[dict[str, object], str]] = [
        ({"name": ""}, "view.name"),
        ({"name": "   "}, "view.name"),
        ({"name": "x" * 101}, "view.name"),
        ({"name": "tab\there"}, "view.name"),
        ({"name": "ok", "agent_digest": "sha256:abc"}, "view.query.agent_digest"),
        ({"name": "ok", "agent_tag": "not a tag"}, "view.query.agent_tag"),
        ({"name": "ok", "statuses": [42]}, "view.query.statuses[0]"),
        (
            {
                "name": "ok",
                "create_time_start": _time("2026-12-02T00:00:00+00:00"),
                "create_time_end": _time("2026-12-01T00:00:00+00:00"),
            },
            "view.query.create_time_end",
        ),
    ]
    for fields, field in cases:
        name = str(fields.pop("name"))
        error = rpc_error(_save, alice, name, **fields)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (fields, field)
        assert _fields(error) == {field}
    assert _all(alice) == before


def test_a_deleted_view_is_gone_and_deleting_it_again_is_not_found(
    callers: dict[str, Stubs],
) -> None:
    alice = callers["alice"]
    _save(alice, "short-lived", agent_id="coding_agent")
    alice.runtime.DeleteView(pb.DeleteViewRequest(name="short-lived"), timeout=10)
    assert "short-lived" not in [v.name for v in _all(alice)]
    again = rpc_error(
        alice.runtime.DeleteView, pb.DeleteViewRequest(name="short-lived"), timeout=10
    )
    assert again.code() == grpc.StatusCode.NOT_FOUND
    empty = rpc_error(alice.runtime.DeleteView, pb.DeleteViewRequest(name=""), timeout=10)
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and _fields(empty) == {"name"}
