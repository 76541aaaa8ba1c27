"""Per-principal limits (issue 16, item 7) on a real server, both engines: a principal over its
rate, its open watches or its concurrent long polls is refused RESOURCE_EXHAUSTED with a reason,
its limit and a RetryInfo delay, while another principal is still served; a watch or long poll
that ends (closed by the server, cancelled by the client) frees its slot. Without auth, callers
are limited by their host."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.auth import token_hash
from agentrt_base.limits import Kind, Limits
from agentrt_base.settings import ServerSettings, default_max_connections
from runtime_service.server import transport_options
from tests.runtime_support import PLAIN, Stubs
from tests.support import ServerThread, error_details, serving

ALICE, BOB = "agentrt_alice_token", "agentrt_bob_token"
#: Long enough for any server on a loaded machine; only reached when a test fails.
PATIENCE = 30.0


def _principals(path: Path, alice_limits: str = "") -> str:
    """An auth file with alice (her own limits, if given) and bob (the server's)."""
    entries = []
    for name, token, limits in (("alice", ALICE, alice_limits), ("bob", BOB, "")):
        entries.append(
            f'[[tokens]]\nprincipal = "{name}"\nhash = "{token_hash(token)}"\n'
            f'roles = ["admin"]\n' + (f"limits = {limits}\n" if limits else "")
        )
    path.write_text("\n".join(entries))
    return str(path)


def _stubs(thread: ServerThread, token: str | None = None) -> Stubs:
    """Stubs on their own connection, sending ``token`` with every call."""
    return Stubs.open(f"127.0.0.1:{thread.server.port}", token)


def _exhausted(error: grpc.RpcError, reason: str) -> dict[str, str]:
    """Check a refusal's code, reason and RetryInfo; return its ErrorInfo metadata."""
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert error_details(error)["ErrorInfo"].reason == reason
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    retry = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    info = error_details_pb2.RetryInfo()
    retry[0].Unpack(info)
    assert info.retry_delay.ToNanoseconds() > 0
    return dict(error_details(error)["ErrorInfo"].metadata)


def _until(condition: Callable[[], bool]) -> None:
    """Wait for something the server does after the client moved on (a cancelled call's slot
    is freed when the server sees the cancellation)."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


def test_a_principal_over_its_rate_is_refused_and_another_is_served(
    tmp_path: Path, database_url: str
) -> None:
    # Alice: 3 calls, then one per ~17 minutes; bob: the server's generous default.
    config = _principals(tmp_path / "auth.toml", "{ requests_per_second = 0.001, burst = 3 }")
    with (
        serving(database_url, auth_config=config) as thread,
        _stubs(thread, ALICE) as alice,
        _stubs(thread, BOB) as bob,
    ):
        listing = pb.ListThreadsRequest()
        for _ in range(3):
            alice.runtime.ListThreads(listing, timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            alice.runtime.ListThreads(listing, timeout=10)
        assert _exhausted(refused.value, "RATE_LIMITED") == {
            "principal": "alice",
            "limit_requests_per_second": "0.001",
            "limit_burst": "3",
        }
        # Every method draws on the same bucket, and a refused call changes nothing.
        with pytest.raises(grpc.RpcError) as create:
            alice.thread()
        _exhausted(create.value, "RATE_LIMITED")
        for _ in range(10):
            bob.runtime.ListThreads(listing, timeout=10)
        assert not bob.runtime.ListThreads(listing, timeout=10).threads


def _watch(stubs: Stubs, run_id: str) -> Any:
    """A WatchRun from the start, returned once the server is streaming it (its first event,
    run.created, has arrived: the call holds its slot)."""
    call = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run_id), timeout=PATIENCE)
    assert next(call).event.sequence == 1
    return call


def test_the_watch_past_a_principals_limit_is_refused_until_one_ends(
    tmp_path: Path, database_url: str
) -> None:
    config = _principals(tmp_path / "auth.toml")
    with serving(database_url, auth_config=config, limits=Limits(watches=2)) as thread:
        limiter = thread.server.limiter
        with _stubs(thread, ALICE) as alice, _stubs(thread, BOB) as bob:
            bob.publish_plain_agent()
            run = bob.run(bob.thread().id, PLAIN)
            first, second = _watch(alice, run.id), _watch(alice, run.id)
            with pytest.raises(grpc.RpcError) as refused:
                _watch(alice, run.id)
            assert _exhausted(refused.value, "TOO_MANY_WATCHES") == {
                "principal": "alice",
                "limit_watches": "2",
            }
            # WatchThread counts as a watch too.
            with pytest.raises(grpc.RpcError) as by_thread:
                next(
                    alice.runtime.WatchThread(
                        pb.WatchThreadRequest(thread_id=run.thread_id), timeout=10
                    )
                )
            _exhausted(by_thread.value, "TOO_MANY_WATCHES")
            # Bob has his own two.
            bobs = [_watch(bob, run.id), _watch(bob, run.id)]
            # A watch the client cancels frees its slot.
            first.cancel()
            _until(lambda: limiter.held(Kind.WATCH, "alice") == 1)
            third = _watch(alice, run.id)
            # So do watches the server ends (after run.ended).
            bob.runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)
            for call in (second, third, *bobs):
                assert [r.event.event_type for r in call][-1] == enum_pb2.EVENT_TYPE_RUN_ENDED
            _until(lambda: limiter.held(Kind.WATCH, "alice") == 0)
            _until(lambda: limiter.held(Kind.WATCH, "bob") == 0)


def _acquire(stubs: Stubs, wait: int) -> Any:
    request = wpb.AcquireRunRequest(worker_id="w", wait=duration_pb2.Duration(seconds=wait))
    return stubs.worker.AcquireRun.future(request, timeout=PATIENCE + 30)


def test_long_polls_past_a_principals_limit_are_refused_until_one_ends(
    tmp_path: Path, database_url: str
) -> None:
    config = _principals(tmp_path / "auth.toml", "{ long_polls = 1 }")
    with serving(database_url, auth_config=config) as thread:
        limiter = thread.server.limiter
        with _stubs(thread, ALICE) as alice, _stubs(thread, BOB) as bob:
            waiting = _acquire(alice, int(PATIENCE))
            _until(lambda: limiter.held(Kind.LONG_POLL, "alice") == 1)
            with pytest.raises(grpc.RpcError) as refused:
                _acquire(alice, 0).result()
            assert _exhausted(refused.value, "TOO_MANY_LONG_POLLS") == {
                "principal": "alice",
                "limit_long_polls": "1",
            }
            # Bob polls beside her (nothing is queued: an empty answer).
            assert not _acquire(bob, 0).result().HasField("run")
            # Her long poll cancelled (a worker shutting down) frees the slot.
            waiting.cancel()
            _until(lambda: limiter.held(Kind.LONG_POLL, "alice") == 0)
            assert not _acquire(alice, 0).result().HasField("run")
            assert limiter.held(Kind.LONG_POLL, "alice") == 0


def test_without_auth_callers_are_limited_by_their_host(database_url: str) -> None:
    with serving(database_url, limits=Limits(long_polls=1)) as thread:
        limiter, anonymous = thread.server.limiter, "anonymous@127.0.0.1"
        # Two connections from one host are one caller.
        with _stubs(thread) as one, _stubs(thread) as other:
            waiting = _acquire(one, int(PATIENCE))
            _until(lambda: limiter.held(Kind.LONG_POLL, anonymous) == 1)
            with pytest.raises(grpc.RpcError) as refused:
                _acquire(other, 0).result()
            assert _exhausted(refused.value, "TOO_MANY_LONG_POLLS")["principal"] == anonymous
            waiting.cancel()
            _until(lambda: limiter.held(Kind.LONG_POLL, anonymous) == 0)
            assert not _acquire(other, 0).result().HasField("run")


def test_connections_past_the_cap_are_closed_at_once(sqlite_url: str) -> None:
    """The issue's "3,000 raw connections accepted": past --max-connections a socket is closed
    before it can hold anything, raw sockets that never speak HTTP/2 count, and a slot freed
    serves a real client again."""
    with serving(sqlite_url, max_connections=2) as thread:
        address = ("127.0.0.1", thread.server.port)
        held = [socket.create_connection(address, timeout=PATIENCE) for _ in range(2)]
        for sock in held:
            assert sock.recv(9)  # the server's HTTP/2 SETTINGS: accepted
        with socket.create_connection(address, timeout=PATIENCE) as extra:
            assert extra.recv(9) == b""  # closed without a word
        held.pop().close()

        def served() -> bool:
            with _stubs(thread) as stubs:
                try:
                    stubs.runtime.ListThreads(pb.ListThreadsRequest(), timeout=5)
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                    return False
                return True

        _until(served)
        for sock in held:
            sock.close()


def test_transport_options_follow_the_settings() -> None:
    default = dict(transport_options(ServerSettings()))
    assert default["grpc.max_concurrent_streams"] == 2_000
    assert 16 <= default["grpc.max_allowed_incoming_connections"] <= 10_000
    assert default["grpc.server_handshake_timeout_ms"] == 20_000
    unlimited = dict(
        transport_options(ServerSettings(max_streams_per_connection=0, max_connections=0))
    )
    assert "grpc.max_concurrent_streams" not in unlimited
    assert "grpc.max_allowed_incoming_connections" not in unlimited
    assert default_max_connections(1024) == 512
    assert default_max_connections(10**7) == 10_000
