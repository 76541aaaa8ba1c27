"""Per-principal limits: request rate, open watch streams, concurrent long polls.

One caller cannot take the server from the others: each principal (the authenticated
:class:`agentrt_base.auth.Principal`; when the server authenticates nobody, each peer host) has
its own token bucket for calls and its own count of open watch streams and of AcquireRun long
polls. A call over any of them is refused ``RESOURCE_EXHAUSTED`` with a reason
(``RATE_LIMITED``, ``TOO_MANY_WATCHES``, ``TOO_MANY_LONG_POLLS``), metadata naming the
principal and the limit, and a ``RetryInfo`` delay; nobody else is slowed or dropped.

The error-mapping interceptor (:mod:`agentrt_base.grpc_errors`) applies this to every call of
an agentrt service, right after authentication and before anything else; :data:`METHOD_KINDS`
says which methods hold a slot while they run. Health and reflection are not limited (load
balancers probe health; both are cheap and bounded by the transport caps of
``docs/security.md``).

Everything here runs on the server's one event loop, so the counters need no lock.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from agentrt_core import reasons
from agentrt_core.errors import ResourceExhausted


class Kind(enum.Enum):
    """What a method holds while it runs, beyond its one token of rate."""

    WATCH = "watches"
    LONG_POLL = "long_polls"


#: The methods that hold a slot for as long as they run. AcquireRun counts whatever its
#: ``wait`` (unset waits the server default, 30 s); one with a zero wait frees its slot at once.
METHOD_KINDS: dict[str, Kind] = {
    "/agentrt.runtime.v1.RuntimeService/WatchRun": Kind.WATCH,
    "/agentrt.runtime.v1.RuntimeService/WatchThread": Kind.WATCH,
    "/agentrt.runtime.v1.WorkerService/AcquireRun": Kind.LONG_POLL,
}

_REASONS = {Kind.WATCH: reasons.TOO_MANY_WATCHES, Kind.LONG_POLL: reasons.TOO_MANY_LONG_POLLS}
_WHAT = {Kind.WATCH: "open watch streams", Kind.LONG_POLL: "concurrent AcquireRun long polls"}

#: The RetryInfo delay of a refused watch or long poll: a slot frees when another call of the
#: same principal ends, which the server cannot foresee; a second is long enough not to spin.
SLOT_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Limits:
    """One principal's allowance. 0 means unlimited.

    The defaults are far above what one busy local worker needs (the step benchmark drives
    ~2,800 calls/s from one loopback client, ``bench/results/steps.md``, and the runtime
    benchmark holds 200 watch streams on one connection), so they stop a runaway or hostile
    caller without throttling honest ones; a multi-tenant deployment sets lower ones.
    """

    #: Sustained calls per second (the token bucket's refill rate).
    requests_per_second: float = 10_000.0
    #: Calls allowed at once above the rate (the bucket's size).
    burst: int = 20_000
    #: WatchRun and WatchThread streams open at once.
    watches: int = 1_000
    #: AcquireRun calls in flight at once.
    long_polls: int = 500

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"limit {f.name} must be a number, 0 or more (got {value!r})")
        if self.burst < 1:
            raise ValueError("limit burst must be 1 or more (a bucket must hold one call)")

    def with_overrides(self, overrides: LimitOverrides | None) -> Limits:
        """These limits with a principal's own values (from the auth file) put in."""
        if overrides is None:
            return self
        given = {f.name: getattr(overrides, f.name) for f in fields(overrides)}
        return replace(self, **{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True)
class LimitOverrides:
    """A principal's own limits (``limits = {...}`` on its entry in the auth file); None keeps
    the server's."""

    requests_per_second: float | None = None
    burst: int | None = None
    watches: int | None = None
    long_polls: int | None = None

    @classmethod
    def parse(cls, table: object, where: str) -> LimitOverrides:
        """From a TOML inline table; raises ValueError naming ``where`` and the problem."""
        if not isinstance(table, dict):
            raise ValueError(f"{where}: limits must be a table")
        known = {f.name for f in fields(cls)}
        unknown = set(table) - known
        if unknown:
            raise ValueError(
                f"{where}: unknown limit(s) {sorted(unknown)} (known: {sorted(known)})"
            )
        for name, value in table.items():
            integral = name != "requests_per_second"
            ok = (
                isinstance(value, int)
                if integral
                else isinstance(value, int | float) and math.isfinite(value)
            )
            least = 1 if name == "burst" else 0
            if not ok or isinstance(value, bool) or value < least:
                kind = "a whole number" if integral else "a number"
                raise ValueError(f"{where}: limits.{name} must be {kind}, {least} or more")
        return cls(**table)


class TokenBucket:
    """``rate`` tokens a second, up to ``burst``; each call takes one. Pure: the caller passes
    the time, so tests drive it with a fake clock."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        # A new caller starts with a full bucket: its first burst is allowed.
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        # A clock that steps back (it should not: monotonic) adds nothing rather than taking.
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate)
        self.stamp = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 when there was one, else the seconds until there will be one
        (nothing is taken then, so a refused call costs the caller nothing)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        # (Limits keeps rate > 0 and burst >= 1 here: the next token does come.)
        return (1.0 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        """Whether the bucket is back at ``burst``, i.e. forgetting it changes nothing."""
        return self.tokens + max(0.0, now - self.stamp) * self.rate >= self.burst

    def resize(self, rate: float, burst: int, now: float) -> None:
        """New limits (the auth file was read again): keep what was used, within the new size."""
        self._refill(now)
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, float(burst))


class Slot:
    """A watch or long poll being counted; :meth:`release` (once, in a ``finally``) frees it."""

    __slots__ = ("_key", "_limiter")

    def __init__(self, limiter: Limiter, key: tuple[Kind, str]) -> None:
        self._limiter: Limiter | None = limiter
        self._key = key

    def release(self) -> None:
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter._release(self._key)


class Limiter:
    """The server's limits, per principal. ``defaults`` apply to every principal without its
    own (:class:`LimitOverrides`)."""

    def __init__(
        self,
        defaults: Limits,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = 10_000,
    ) -> None:
        self.defaults = defaults
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._held: dict[tuple[Kind, str], int] = {}
        self._max_buckets = max_buckets
        # A principal's effective limits, per overrides object (the auth file's entries are
        # few and live until it is read again).
        self._resolved: dict[LimitOverrides, Limits] = {}

    def limits_for(self, overrides: LimitOverrides | None) -> Limits:
        if overrides is None:
            return self.defaults
        limits = self._resolved.get(overrides)
        if limits is None:
            limits = self._resolved[overrides] = self.defaults.with_overrides(overrides)
        return limits

    def admit(
        self, principal: str, overrides: LimitOverrides | None, kind: Kind | None
    ) -> Slot | None:
        """Count one call of ``principal``; raises ResourceExhausted when it is over a limit.
        For a method of ``kind`` returns the slot the call holds until it ends."""
        limits = self.limits_for(overrides)
        if limits.requests_per_second:
            self._take(principal, limits)
        if kind is None:
            return None
        cap: int = limits.watches if kind is Kind.WATCH else limits.long_polls
        key = (kind, principal)
        held = self._held.get(key, 0)
        if cap and held >= cap:
            raise ResourceExhausted(
                f"{principal} has {held} {_WHAT[kind]}, its limit; close one and retry",
                reason=_REASONS[kind],
                metadata={"principal": principal, f"limit_{kind.value}": str(cap)},
                retry_delay=SLOT_RETRY_SECONDS,
            )
        self._held[key] = held + 1
        return Slot(self, key)

    def held(self, kind: Kind, principal: str) -> int:
        """How many calls of ``kind`` the principal has open (for tests and metrics)."""
        return self._held.get((kind, principal), 0)

    def _release(self, key: tuple[Kind, str]) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def _take(self, principal: str, limits: Limits) -> None:
        now = self._clock()
        bucket = self._buckets.get(principal)
        if bucket is None:
            if len(self._buckets) >= self._max_buckets:
                self._forget_idle(now)
            bucket = self._buckets[principal] = TokenBucket(
                limits.requests_per_second, limits.burst, now
            )
        elif bucket.rate != limits.requests_per_second or bucket.burst != limits.burst:
            bucket.resize(limits.requests_per_second, limits.burst, now)
        wait = bucket.take(now)
        if wait:
            raise ResourceExhausted(
                f"{principal} is over its rate of {limits.requests_per_second:g} calls a second"
                f" (burst {limits.burst}); retry after the delay given",
                reason=reasons.RATE_LIMITED,
                metadata={
                    "principal": principal,
                    "limit_requests_per_second": f"{limits.requests_per_second:g}",
                    "limit_burst": str(limits.burst),
                },
                retry_delay=wait,
            )

    def _forget_idle(self, now: float) -> None:
        """Keep the table bounded when many peers come and go (a server without auth keys
        callers by address): a full bucket is the same as none, so those go first; if too few
        are, the oldest tenth go too (they restart full, the price of a bounded table)."""
        for key in [k for k, b in self._buckets.items() if b.full(now)]:
            del self._buckets[key]
        excess = len(self._buckets) - self._max_buckets * 9 // 10
        for key in list(self._buckets)[: max(0, excess)]:
            del self._buckets[key]


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.0.7:5123``, ``ipv6:[::1]:5123``,
    ``unix:/path``): callers of one machine share its limits when nobody is authenticated."""
    scheme, _, rest = peer.partition(":")
    if scheme == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest
    if scheme == "ipv4":
        return rest.rpartition(":")[0] or rest
    return peer


def anonymous_key(peer: str) -> str:
    """The principal a call is limited as when the server authenticates nobody."""
    return "anonymous@" + peer_host(peer)
