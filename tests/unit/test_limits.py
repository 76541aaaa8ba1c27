"""Per-principal limits (agentrt_base.limits) with a fake clock: the token bucket, the
watch/long-poll counters, overrides from the auth file, settings, and the RetryInfo detail."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.rpc import error_details_pb2

from agentrt.runtime.v1 import runtime_service_pb2, worker_service_pb2
from agentrt_base.auth import AuthConfig, token_hash
from agentrt_base.error_status import to_status
from agentrt_base.limits import (
    METHOD_KINDS,
    Kind,
    Limiter,
    LimitOverrides,
    Limits,
    TokenBucket,
    anonymous_key,
    peer_host,
)
from agentrt_base.settings import DEFAULT_MAX_STREAMS_PER_CONNECTION, ServerSettings
from agentrt_core import errors


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_admits_its_burst_then_one_call_per_token() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    # Empty: the next token comes in 1/rate seconds, and a refusal takes nothing.
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) == pytest.approx(0.5)


def test_a_bucket_refills_only_up_to_its_burst_and_never_from_a_clock_going_back() -> None:
    bucket = TokenBucket(rate=10.0, burst=2, now=0.0)
    assert bucket.full(0.0)
    bucket.take(0.0)
    assert not bucket.full(0.0) and bucket.full(0.1)
    # An hour idle still leaves only `burst` calls.
    assert [bucket.take(3600.0) for _ in range(3)][2] > 0
    bucket.take(3599.0)  # the clock stepped back: nothing is added
    assert bucket.tokens == pytest.approx(0.0)


def test_a_resized_bucket_keeps_what_was_used() -> None:
    bucket = TokenBucket(rate=1.0, burst=10, now=0.0)
    for _ in range(8):
        bucket.take(0.0)
    bucket.resize(1.0, 5, 0.0)
    assert bucket.tokens == pytest.approx(2.0)  # 2 left, under the new size
    bucket.resize(1.0, 1, 0.0)
    assert bucket.tokens == pytest.approx(1.0)


def test_a_principal_over_its_rate_is_refused_with_a_delay_and_others_are_not() -> None:
    clock = FakeClock()
    limiter = Limiter(Limits(requests_per_second=4, burst=2), clock=clock)
    limiter.admit("alice", None, None)
    limiter.admit("alice", None, None)
    with pytest.raises(errors.ResourceExhausted) as refused:
        limiter.admit("alice", None, None)
    error = refused.value
    assert error.reason == "RATE_LIMITED"
    assert error.metadata == {
        "principal": "alice",
        "limit_requests_per_second": "4",
        "limit_burst": "2",
    }
    assert error.retry_delay == pytest.approx(0.25)
    limiter.admit("bob", None, None)  # another principal has its own bucket
    clock.now += 0.25
    limiter.admit("alice", None, None)


def test_watches_and_long_polls_are_counted_per_principal_and_freed_once() -> None:
    limiter = Limiter(Limits(watches=2, long_polls=1), clock=FakeClock())
    first = limiter.admit("alice", None, Kind.WATCH)
    second = limiter.admit("alice", None, Kind.WATCH)
    assert first is not None and second is not None
    with pytest.raises(errors.ResourceExhausted) as refused:
        limiter.admit("alice", None, Kind.WATCH)
    assert refused.value.reason == "TOO_MANY_WATCHES"
    assert refused.value.metadata == {"principal": "alice", "limit_watches": "2"}
    assert refused.value.retry_delay is not None and refused.value.retry_delay > 0
    assert limiter.held(Kind.WATCH, "alice") == 2  # the refused call holds nothing
    # Other principals, and alice's other kind, are not affected.
    assert limiter.admit("bob", None, Kind.WATCH) is not None
    poll = limiter.admit("alice", None, Kind.LONG_POLL)
    with pytest.raises(errors.ResourceExhausted) as polls:
        limiter.admit("alice", None, Kind.LONG_POLL)
    assert polls.value.reason == "TOO_MANY_LONG_POLLS"
    assert polls.value.metadata["limit_long_polls"] == "1"
    # Released twice (a finally after an explicit release) still frees one slot only.
    first.release()
    first.release()
    assert limiter.held(Kind.WATCH, "alice") == 1
    assert limiter.admit("alice", None, Kind.WATCH) is not None
    assert poll is not None
    poll.release()
    assert limiter.held(Kind.LONG_POLL, "alice") == 0
    # A call of no kind holds nothing.
    assert limiter.admit("alice", None, None) is None


def test_zero_means_unlimited() -> None:
    limiter = Limiter(Limits(requests_per_second=0, watches=0, long_polls=0), clock=FakeClock())
    slots = [limiter.admit("alice", None, Kind.WATCH) for _ in range(5_000)]
    assert all(slot is not None for slot in slots)


def test_a_principals_own_limits_replace_the_servers_one_by_one() -> None:
    clock = FakeClock()
    limiter = Limiter(Limits(requests_per_second=100, burst=100, watches=1), clock=clock)
    own = LimitOverrides(burst=1, watches=3)
    assert limiter.limits_for(own) == Limits(requests_per_second=100, burst=1, watches=3)
    limiter.admit("ci", own, None)
    with pytest.raises(errors.ResourceExhausted):
        limiter.admit("ci", own, None)
    watcher = LimitOverrides(watches=3)
    for _ in range(3):
        limiter.admit("dashboard", watcher, Kind.WATCH)
    with pytest.raises(errors.ResourceExhausted):
        limiter.admit("dashboard", watcher, Kind.WATCH)
    # New limits (the file read again) apply to the bucket in use: 1 ms holds a tenth of a
    # token at 100 calls a second, a thousand at a million.
    # (Time already past counts at the rate it passed under.)
    clock.now += 0.001
    faster = LimitOverrides(burst=1, requests_per_second=1e6)
    with pytest.raises(errors.ResourceExhausted):
        limiter.admit("ci", faster, None)
    clock.now += 0.001
    limiter.admit("ci", faster, None)


def test_the_bucket_table_stays_bounded_and_forgets_idle_callers_first() -> None:
    clock = FakeClock()
    limiter = Limiter(Limits(requests_per_second=1, burst=2), clock=clock, max_buckets=10)
    limiter.admit("busy", None, None)
    limiter.admit("busy", None, None)
    for i in range(100):
        limiter.admit(f"peer-{i}", None, None)
        assert len(limiter._buckets) <= 10
    clock.now += 10  # everybody refilled: all forgettable at once
    for i in range(100, 120):
        limiter.admit(f"peer-{i}", None, None)
    assert len(limiter._buckets) <= 10


def test_the_method_table_names_real_methods() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (runtime_service_pb2, worker_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(METHOD_KINDS) <= methods
    assert {k for k, v in METHOD_KINDS.items() if v is Kind.WATCH} == {
        "/agentrt.runtime.v1.RuntimeService/WatchRun",
        "/agentrt.runtime.v1.RuntimeService/WatchThread",
    }


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:50123", "127.0.0.1"),
        ("ipv6:[::1]:50123", "::1"),
        ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
        ("unix:/tmp/agentrt.sock", "unix:/tmp/agentrt.sock"),
    ],
)
def test_callers_of_one_host_share_its_anonymous_limits(peer: str, host: str) -> None:
    assert peer_host(peer) == host
    assert anonymous_key(peer) == f"anonymous@{host}"


def test_retry_info_goes_with_the_status() -> None:
    error = errors.ResourceExhausted("slow down", reason="RATE_LIMITED", retry_delay=1.5)
    _, status = to_status(error)
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1
    info = error_details_pb2.RetryInfo()
    infos[0].Unpack(info)
    assert info.retry_delay.ToNanoseconds() == 1_500_000_000
    # A budget that does not grow back says nothing about retrying.
    _, budget = to_status(errors.ResourceExhausted("over budget", reason="BUDGET_EXCEEDED"))
    assert not [d for d in budget.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]


def test_limits_in_the_auth_file(tmp_path: Path) -> None:
    config = tmp_path / "auth.toml"
    digest = token_hash("agentrt_x")
    config.write_text(
        "[[tokens]]\n"
        'principal = "worker-pool"\n'
        f'hash = "{digest}"\n'
        'roles = ["worker"]\n'
        "limits = { long_polls = 64, requests_per_second = 50.5 }\n"
    )
    principal = AuthConfig.load(str(config)).by_token_hash[digest]
    assert principal.limits == LimitOverrides(requests_per_second=50.5, long_polls=64)
    for bad in ("{ watchs = 3 }", "{ burst = 0 }", "{ watches = -1 }", "{ watches = 1.5 }", "3"):
        config.write_text(f'[[tokens]]\nprincipal = "p"\nhash = "{digest}"\nlimits = {bad}\n')
        with pytest.raises(ValueError, match="limits"):
            AuthConfig.load(str(config))


def test_limits_from_flags_and_environment() -> None:
    settings = ServerSettings.resolve(listen=None, database_url=None, environ={})
    assert settings.limits == Limits()
    assert settings.max_streams_per_connection == DEFAULT_MAX_STREAMS_PER_CONNECTION
    assert settings.max_connections is None
    env = {
        "AGENTRT_RATE_LIMIT": "250.5",
        "AGENTRT_RATE_BURST": "10",
        "AGENTRT_MAX_WATCHES": "0",
        "AGENTRT_MAX_LONG_POLLS": "7",
        "AGENTRT_MAX_STREAMS_PER_CONNECTION": "0",
        "AGENTRT_MAX_CONNECTIONS": "300",
    }
    settings = ServerSettings.resolve(listen=None, database_url=None, environ=env, max_watches=5)
    assert settings.limits == Limits(requests_per_second=250.5, burst=10, watches=5, long_polls=7)
    assert (settings.max_streams_per_connection, settings.max_connections) == (0, 300)
    for name, value in (
        ("AGENTRT_RATE_LIMIT", "fast"),
        ("AGENTRT_RATE_LIMIT", "inf"),
        ("AGENTRT_RATE_BURST", "0"),
        ("AGENTRT_MAX_WATCHES", "-1"),
        ("AGENTRT_MAX_CONNECTIONS", "many"),
    ):
        with pytest.raises(ValueError, match=name):
            ServerSettings.resolve(listen=None, database_url=None, environ={name: value})
