"""Every Prometheus metric the server exposes, defined once (issue 29).

A metric is declared here as a :class:`Spec` (name, type, help, labels) and nowhere else:
:class:`Metrics` builds the ``prometheus_client`` objects from :data:`SPECS`, and
docs/operations.md's table of metrics is generated from the same list (a test keeps it
true). Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
the ``agentrt_`` prefix, base units (seconds, bytes) in the name, ``_total`` on counters (the
client library adds it to a counter's name).

Labels are bounded: a method, a status code, a namespace, an agent id; never a digest, a run,
attempt or step id, or anything a caller can make up without limit.

Each server has its own registry (not ``prometheus_client``'s process-wide default), so
several servers in one process (the tests) do not share counts, and a replica exposes only
its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Kind = Literal["counter", "gauge", "histogram"]

#: Latency buckets in seconds: from a cached read (~0.2 ms) to a long poll's wait (~60 s).
LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True)
class Spec:
    """One metric: what it is called, what it counts, what it is broken down by."""

    name: str  # without ``_total``: prometheus_client adds it to a counter
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: Sequence[float] = LATENCY_BUCKETS

    @property
    def exposed_name(self) -> str:
        """The name a scrape shows (a counter's samples end in ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


GRPC_HANDLED = Spec(
    "agentrt_grpc_server_handled",
    "counter",
    "RPCs completed on the server, by method and status code (the code the caller received).",
    ("grpc_service", "grpc_method", "grpc_type", "grpc_code"),
)
GRPC_HANDLING_SECONDS = Spec(
    "agentrt_grpc_server_handling_seconds",
    "histogram",
    "Time from an RPC's start to its end on the server: a unary call's handling, a stream's"
    " whole life.",
    ("grpc_service", "grpc_method", "grpc_type"),
)
GRPC_IN_FLIGHT = Spec(
    "agentrt_grpc_server_in_flight",
    "gauge",
    "RPCs started and not yet ended, by method (open watch streams and long polls included).",
    ("grpc_service", "grpc_method", "grpc_type"),
)

#: Every metric, in the order docs/operations.md lists them.
SPECS: Final = (GRPC_HANDLED, GRPC_HANDLING_SECONDS, GRPC_IN_FLIGHT)


class Metrics:
    """The metrics of one server: a registry of its own and one object per :data:`SPECS`
    entry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._by_name: dict[str, Counter | Gauge | Histogram] = {
            spec.name: _build(spec, self.registry) for spec in SPECS
        }

    def counter(self, spec: Spec) -> Counter:
        metric = self._by_name[spec.name]
        assert isinstance(metric, Counter), spec
        return metric

    def gauge(self, spec: Spec) -> Gauge:
        metric = self._by_name[spec.name]
        assert isinstance(metric, Gauge), spec
        return metric

    def histogram(self, spec: Spec) -> Histogram:
        metric = self._by_name[spec.name]
        assert isinstance(metric, Histogram), spec
        return metric


def _build(spec: Spec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.kind == "counter":
        return Counter(spec.name, spec.help, spec.labels, registry=registry)
    if spec.kind == "gauge":
        # livesum would matter with multiprocess mode, which this server does not use: each
        # process (a replica) exposes its own registry.
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)
