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

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agentrt_base.buckets import bucket_of

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
    #: Read when scraped (from a count the server keeps anyway, or from the database) rather
    #: than counted as it happens: :meth:`Metrics.collect`.
    collected: bool = False
    #: Changed from threads other than the event loop's (the database writers): its
    #: children take a lock.
    threaded: bool = False

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
GRPC_REFUSED = Spec(
    "agentrt_grpc_server_refused",
    "counter",
    "RPCs refused, by method, code and google.rpc ErrorInfo reason: authentication,"
    " permission, rate-limit and database refusals each have their reasons (docs/api.md).",
    ("grpc_service", "grpc_method", "grpc_code", "reason"),
)
GRPC_IN_FLIGHT = Spec(
    "agentrt_grpc_server_in_flight",
    "gauge",
    "RPCs started and not yet ended, by method (open watch streams and long polls included).",
    ("grpc_service", "grpc_method", "grpc_type"),
)

DB_BATCH_SIZE = Spec(
    "agentrt_db_commit_batch_size",
    "histogram",
    "Writes committed together in one transaction, by writer: the server's SQLite group"
    " commit, or the step writer process's batches (either engine).",
    ("writer",),
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    threaded=True,
)
DB_COMMIT_SECONDS = Spec(
    "agentrt_db_commit_seconds",
    "histogram",
    "Time one such batch's transaction took, its commit (the fsync) included, by writer.",
    ("writer",),
    threaded=True,
)
STEP_WRITER_RESTARTS = Spec(
    "agentrt_step_writer_restarts",
    "counter",
    "Times the step writer process was restarted after it died.",
    collected=True,
)

#: From a second (a run a worker picked up at once) to a day (one waiting on an approval).
RUN_BUCKETS: Final = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
#: From a few milliseconds (a worker polling) to an hour (a queue nobody serves).
WAIT_BUCKETS: Final = (0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)

RUNS = Spec(
    "agentrt_runs",
    "gauge",
    "Runs not yet ended, by namespace, agent and status (QUEUED is the queue), read from the"
    " database at each scrape: every replica reports the same.",
    ("namespace", "agent_id", "status"),
    collected=True,
)
BLOB_BYTES = Spec(
    "agentrt_blob_bytes",
    "gauge",
    "Blob bytes by state: stored (every stored blob, counted once, as the quota counts them;"
    " read from the database at each scrape, the same from every replica) and staged (uploads"
    " this replica is receiving and has not stored yet).",
    ("state",),
    collected=True,
)
RUNS_ENDED = Spec(
    "agentrt_runs_ended",
    "counter",
    "Runs this replica ended, by namespace, agent and terminal status.",
    ("namespace", "agent_id", "status"),
)
RUN_DURATION = Spec(
    "agentrt_run_duration_seconds",
    "histogram",
    "Time from a run's creation to its end, observed when it ends, by terminal status.",
    ("namespace", "agent_id", "status"),
    buckets=RUN_BUCKETS,
)
SCHEDULE_TO_START = Spec(
    "agentrt_run_schedule_to_start_seconds",
    "histogram",
    "Time from a run's creation to its first acquisition by a worker.",
    ("namespace", "agent_id"),
    buckets=WAIT_BUCKETS,
)
ATTEMPTS_STARTED = Spec(
    "agentrt_attempts_started",
    "counter",
    "Attempts started (runs acquired), by namespace, agent and the attempt's reason (INITIAL,"
    " RETRY_AFTER_ERROR, WORKER_LOST, RESUMED_AFTER_APPROVAL, RESUMED_AFTER_PAUSE).",
    ("namespace", "agent_id", "reason"),
)
LEASE_LOSSES = Spec(
    "agentrt_lease_losses",
    "counter",
    "Attempts the reaper ended LOST because their lease expired (the worker stopped"
    " heartbeating); a stale worker's refused writes are agentrt_grpc_server_refused_total"
    '{reason="LEASE_LOST"}.',
    ("namespace", "agent_id"),
)
REAPER_ACTIONS = Spec(
    "agentrt_reaper_actions",
    "counter",
    "What the reaper ended itself, by kind: deadline (a run past its deadline), stop_forced"
    " (a cancel or pause not acknowledged in time), lease_expired.",
    ("kind",),
)

STEPS_STARTED = Spec(
    "agentrt_steps_started",
    "counter",
    "Steps recorded, by agent and type: by BeginStep (a repeated BeginStep with the same key is"
    " not counted again), a CHECKPOINT by WriteCheckpoint.",
    ("agent_id", "type"),
)
STEPS_ENDED = Spec(
    "agentrt_steps_ended",
    "counter",
    "Steps ended, by agent, type and final status: by EndStep, an APPROVAL_REQUEST by its"
    " decision; a denied tool call and a checkpoint are born ended.",
    ("agent_id", "type", "status"),
)
MODEL_FALLBACKS = Spec(
    "agentrt_model_fallbacks",
    "counter",
    "MODEL_CALL steps on a candidate other than the policy's primary, by agent and the"
    " runtime's reason (FALLBACK_AFTER_ERROR, CONTEXT_LENGTH_ROUTE).",
    ("agent_id", "reason"),
)
MODEL_TOKENS = Spec(
    "agentrt_model_tokens",
    "counter",
    "Tokens of ended MODEL_CALL steps as their workers reported them, by agent, provider,"
    " model (reported, else requested) and direction (input, output).",
    ("agent_id", "provider", "model", "direction"),
)
MODEL_COST = Spec(
    "agentrt_model_cost_usd",
    "counter",
    "Cost in US dollars of ended MODEL_CALL steps as their workers reported it, by agent,"
    " provider and model.",
    ("agent_id", "provider", "model"),
)
APPROVAL_WAIT = Spec(
    "agentrt_approval_wait_seconds",
    "histogram",
    "Time from an approval's request to its decision, by agent and decision (APPROVE, DENY);"
    ' the runs waiting on one are agentrt_runs{status="WAITING_APPROVAL"}.',
    ("namespace", "agent_id", "decision"),
    buckets=RUN_BUCKETS,
)
#: The GenAI metrics' Prometheus equivalents (``runtime_service.genai``): the conventions'
#: name under the ``agentrt_`` prefix with its unit's suffix, its attributes as labels
#: (dots made underscores), its advisory buckets (``runtime_service.genai``).
_GENAI_TOKEN_BUCKETS: Final = tuple(float(4**n) for n in range(14))  # 1 … 67,108,864
_GENAI_SECONDS_BUCKETS: Final = tuple(0.01 * 2**n for n in range(14))  # 0.01 … 81.92
GENAI_TOKEN_USAGE = Spec(
    "agentrt_gen_ai_client_token_usage_tokens",
    "histogram",
    "gen_ai.client.token.usage: tokens of each ended MODEL_CALL step as its worker reported"
    " them, by operation, provider, requested and reported model and token type (input,"
    " output).",
    (
        "gen_ai_operation_name",
        "gen_ai_provider_name",
        "gen_ai_request_model",
        "gen_ai_response_model",
        "gen_ai_token_type",
    ),
    buckets=_GENAI_TOKEN_BUCKETS,
)
GENAI_OPERATION_DURATION = Spec(
    "agentrt_gen_ai_client_operation_duration_seconds",
    "histogram",
    "gen_ai.client.operation.duration: each ended MODEL_CALL step's duration on the ledger"
    " (begun to ended), by operation, provider, requested and reported model and error type"
    " (empty when it succeeded).",
    (
        "gen_ai_operation_name",
        "gen_ai_provider_name",
        "gen_ai_request_model",
        "gen_ai_response_model",
        "error_type",
    ),
    buckets=_GENAI_SECONDS_BUCKETS,
)
GENAI_AGENT_DURATION = Spec(
    "agentrt_gen_ai_invoke_agent_duration_seconds",
    "histogram",
    "gen_ai.invoke_agent.duration: each ended attempt's duration (acquired to ended), by"
    " agent and error type (empty unless it FAILED or was LOST).",
    ("gen_ai_agent_name", "error_type"),
    buckets=_GENAI_SECONDS_BUCKETS,
)
GENAI_TOOL_DURATION = Spec(
    "agentrt_gen_ai_execute_tool_duration_seconds",
    "histogram",
    "gen_ai.execute_tool.duration: each ended TOOL_CALL step's duration on the ledger, by"
    " tool, tool type, agent and error type (empty when it succeeded).",
    ("gen_ai_tool_name", "gen_ai_tool_type", "gen_ai_agent_name", "error_type"),
    buckets=_GENAI_SECONDS_BUCKETS,
)

#: Every metric, in the order docs/operations.md lists them.
SPECS: Final = (
    GRPC_HANDLED,
    GRPC_HANDLING_SECONDS,
    GRPC_IN_FLIGHT,
    GRPC_REFUSED,
    RUNS,
    BLOB_BYTES,
    RUNS_ENDED,
    RUN_DURATION,
    SCHEDULE_TO_START,
    ATTEMPTS_STARTED,
    LEASE_LOSSES,
    REAPER_ACTIONS,
    STEPS_STARTED,
    STEPS_ENDED,
    MODEL_FALLBACKS,
    MODEL_TOKENS,
    MODEL_COST,
    APPROVAL_WAIT,
    GENAI_TOKEN_USAGE,
    GENAI_OPERATION_DURATION,
    GENAI_AGENT_DURATION,
    GENAI_TOOL_DURATION,
    DB_BATCH_SIZE,
    DB_COMMIT_SECONDS,
    STEP_WRITER_RESTARTS,
)


class Metrics:
    """The metrics of one server: a registry of its own and one :class:`Family` per
    :data:`SPECS` entry (a reading function per collected one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._families = {spec.name: Family(spec) for spec in SPECS if not spec.collected}
        self._scraped = _Scraped(list(self._families.values()))
        self.registry.register(self._scraped)

    def collect(self, spec: Spec, read: Read) -> None:
        """Have ``read`` give ``spec``'s samples at each scrape: label values → value."""
        assert spec.collected and spec.kind in ("counter", "gauge"), spec
        self._scraped.reads[spec.name] = (spec, read)

    def counter(self, spec: Spec) -> Family:
        assert spec.kind == "counter", spec
        return self._families[spec.name]

    def gauge(self, spec: Spec) -> Family:
        assert spec.kind == "gauge", spec
        return self._families[spec.name]

    def histogram(self, spec: Spec) -> Family:
        assert spec.kind == "histogram", spec
        return self._families[spec.name]


class Value:
    """A counter's or gauge's value for one set of label values.

    No lock: everything but the writers' metrics is counted on the server's one event loop
    thread (a ``prometheus_client`` child takes a lock per change, which cost the step path
    several per cent: bench/results/steps.md). A scrape reads the value from another thread
    without one; a float read is atomic in CPython, and a scrape sees the value before or
    after a change."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class Buckets:
    """A histogram's counts for one set of label values: per bucket (not cumulative; the
    scrape adds them up), and the sum. ``counts[i]`` holds the observations ``<= bounds[i]``
    and ``> bounds[i - 1]``; the last, those above every bound (+Inf)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bucket_of(self.bounds, amount)] += 1
        self.sum += amount


class LockedValue(Value):
    """A :class:`Value` changed from several threads (a :attr:`Spec.threaded` metric)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount


class LockedBuckets(Buckets):
    """:class:`Buckets` observed from several threads (a :attr:`Spec.threaded` metric)."""

    __slots__ = ("_lock",)

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__(bounds)
        self._lock = threading.Lock()

    def observe(self, amount: float) -> None:
        with self._lock:
            super().observe(amount)


class Family:
    """One metric's children by label values, made on first use; exposed through
    ``prometheus_client`` (:class:`_Scraped`), which writes the text format."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._bounds = tuple(float(b) for b in spec.buckets)
        self._children: dict[tuple[str, ...], Any] = {}
        self._making = threading.Lock()

    def labels(self, *values: str) -> Any:
        """The child for ``values`` (a :class:`Value` or :class:`Buckets`)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.spec.labels):
                raise ValueError(f"{self.spec.name} takes labels {self.spec.labels}: {values}")
            with self._making:  # two threads may meet a new label set at once
                child = self._children.get(values)
                if child is None:
                    child = self._children[values] = self._new()
        return child

    def _new(self) -> Value | Buckets:
        if self.spec.kind == "histogram":
            return LockedBuckets(self._bounds) if self.spec.threaded else Buckets(self._bounds)
        return LockedValue() if self.spec.threaded else Value()

    def family(self) -> Metric:
        """The samples as ``prometheus_client`` writes them."""
        spec = self.spec
        children = list(self._children.items())
        if spec.kind == "histogram":
            histogram = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
            bounds = [*(_le(b) for b in self._bounds), "+Inf"]
            for values, buckets in children:
                counts = list(buckets.counts)
                cumulative = list(itertools.accumulate(counts))
                histogram.add_metric(
                    list(values), list(zip(bounds, cumulative, strict=True)), buckets.sum
                )
            return histogram
        kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        family = kind(spec.name, spec.help, labels=spec.labels)
        for values, value in children:
            family.add_metric(list(values), value.value)
        return family


#: A bucket's ``le`` as the client library writes it (its helper is untyped).
_le = cast(Callable[[float], str], floatToGoString)

#: What a collected metric reads when scraped: its samples, label values → value.
Read = Callable[[], Mapping[tuple[str, ...], float]]


class _Scraped(Collector):
    """Every metric, at each scrape: the counted ones' families, and the collected ones
    (``Spec.collected``) read."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families
        self.reads: dict[str, tuple[Spec, Read]] = {}

    def describe(self) -> list[Metric]:
        return []  # read when collected: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        for counted in self.families:
            yield counted.family()
        for spec, read in list(self.reads.values()):
            family: CounterMetricFamily | GaugeMetricFamily
            if spec.kind == "counter":
                family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            for values, value in read().items():
                family.add_metric(list(values), value)
            yield family
