"""The runtime's metrics: what a committed write did (``runtime_service.observations``)
turned into counts and times, and the runs not yet ended read from the database when
scraped.

The gauge comes from the database, not from counts kept in memory, because it describes the
shared ledger: with several replicas each one reports the same, whichever of them moved the
runs, and a restart does not lose it. The counters and histograms are this replica's own (a
replica reports what it did; Prometheus sums over instances).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy.orm import Session

from agentrt_base.db import Database
from agentrt_base.metrics import (
    APPROVAL_WAIT,
    ATTEMPTS_STARTED,
    BLOB_BYTES,
    DB_BATCH_SIZE,
    DB_COMMIT_SECONDS,
    LEASE_LOSSES,
    MODEL_COST,
    MODEL_FALLBACKS,
    MODEL_TOKENS,
    REAPER_ACTIONS,
    RUN_DURATION,
    RUNS,
    RUNS_ENDED,
    SCHEDULE_TO_START,
    STEP_WRITER_RESTARTS,
    STEPS_ENDED,
    STEPS_STARTED,
    Metrics,
)
from runtime_service import genai
from runtime_service.observations import (
    ApprovalResolved,
    AttemptEnded,
    AttemptStarted,
    Observation,
    ReaperAction,
    RunMoved,
    StepRecorded,
)
from runtime_service.services.context import Runtime
from runtime_service.step_process import StepProcess
from runtime_service.store import blobs, runs

log = logging.getLogger("agentrt.metrics")

#: How long a read of the runs gauge is reused: scrapes from several Prometheus servers (or
#: a dashboard's burst) cost one query a second at most.
READ_EVERY: Final = 1.0


class _Children:
    """A metric's children by label values, each looked up in the metric once: the client
    library's ``labels()`` validates its arguments and takes the metric's lock on every call,
    and a busy server counts several series per step (issue 29: the metrics' cost on the step
    path). The children are the metric's own, so what is scraped is unchanged."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._found: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._found.get(values)
        if child is None:
            child = self._found[values] = self._metric.labels(*values)
        return child


class RunMetrics:
    """The :class:`~runtime_service.observations.Observer` the server gives its runtime."""

    def __init__(self, metrics: Metrics, runtime: Runtime) -> None:
        self._ended = metrics.counter(RUNS_ENDED)
        self._duration = metrics.histogram(RUN_DURATION)
        self._waited = metrics.histogram(SCHEDULE_TO_START)
        self._started = metrics.counter(ATTEMPTS_STARTED)
        self._lost = metrics.counter(LEASE_LOSSES)
        self._reaped = metrics.counter(REAPER_ACTIONS)
        # Counted for every step: their children kept (_Children says why).
        self._steps_started = _Children(metrics.counter(STEPS_STARTED))
        self._steps_ended = _Children(metrics.counter(STEPS_ENDED))
        self._fallbacks = _Children(metrics.counter(MODEL_FALLBACKS))
        self._tokens = _Children(metrics.counter(MODEL_TOKENS))
        self._cost = _Children(metrics.counter(MODEL_COST))
        self._approval_wait = metrics.histogram(APPROVAL_WAIT)
        self._genai = {
            name: _Children(metrics.histogram(spec)) for name, spec in genai.PROMETHEUS.items()
        }
        self._runtime = runtime
        self._active = _EverySecond(lambda: runtime.database.read_sync(_active_runs))
        self._stored = _EverySecond(lambda: runtime.database.read_sync(_stored_bytes))
        metrics.collect(RUNS, self._active.read)
        metrics.collect(BLOB_BYTES, self.blob_bytes)

    def observed(self, observations: Sequence[Observation]) -> None:
        for seen in observations:
            # Steps first: they are most of what a busy server observes.
            if isinstance(seen, StepRecorded):
                self._step(seen)
            elif isinstance(seen, RunMoved):
                if seen.ended:
                    self._ended.labels(seen.namespace, seen.agent_id, seen.status).inc()
                    if seen.lifetime is not None:
                        self._duration.labels(seen.namespace, seen.agent_id, seen.status).observe(
                            seen.lifetime.total_seconds()
                        )
            elif isinstance(seen, AttemptEnded):
                self._measure(genai.attempt_measurements(seen.trace, seen.attempt))
            elif isinstance(seen, AttemptStarted):
                self._started.labels(seen.namespace, seen.agent_id, seen.reason).inc()
                if seen.waited is not None:
                    self._waited.labels(seen.namespace, seen.agent_id).observe(
                        max(seen.waited.total_seconds(), 0.0)
                    )
            elif isinstance(seen, ReaperAction):
                self._reaped.labels(seen.kind).inc()
                if seen.kind == "lease_expired":
                    self._lost.labels(seen.namespace, seen.agent_id).inc()
            elif isinstance(seen, ApprovalResolved):
                self._approval_wait.labels(seen.namespace, seen.agent_id, seen.decision).observe(
                    max(seen.waited.total_seconds(), 0.0)
                )

    def _step(self, seen: StepRecorded) -> None:
        if seen.begun:
            self._steps_started(seen.agent_id, seen.type).inc()
            if seen.type == "MODEL_CALL" and seen.candidate_reason not in ("", "PRIMARY"):
                self._fallbacks(seen.agent_id, seen.candidate_reason).inc()
        if not seen.ended:
            return
        self._steps_ended(seen.agent_id, seen.type, seen.status).inc()
        if seen.step is not None:
            self._measure(genai.step_measurements(seen.agent_id, seen.step))
        if seen.type == "MODEL_CALL":
            model = (seen.agent_id, seen.provider, seen.model)
            if seen.input_tokens:
                self._tokens(*model, "input").inc(seen.input_tokens)
            if seen.output_tokens:
                self._tokens(*model, "output").inc(seen.output_tokens)
            if seen.cost_usd > 0:
                self._cost(*model).inc(seen.cost_usd)

    def _measure(self, measurements: Sequence[genai.Measurement]) -> None:
        """The GenAI metrics' Prometheus equivalents: each attribute a label (empty when a
        measurement has none)."""
        for series, value in measurements:
            self._genai[series.metric](*series.labels).observe(value)

    def blob_bytes(self) -> Mapping[tuple[str, ...], float]:
        # A list first: the set changes on the event loop's thread meanwhile.
        staged = sum(upload.size for upload in list(self._runtime.uploads))
        return {**self._stored.read(), ("staged",): float(staged)}


def _active_runs(session: Session) -> Mapping[tuple[str, ...], float]:
    return {
        (namespace, agent_id, status): float(count)
        for namespace, agent_id, status, count in runs.count_active(session)
    }


def _stored_bytes(session: Session) -> Mapping[tuple[str, ...], float]:
    return {("stored",): float(blobs.used_bytes(session))}


class _EverySecond:
    """Samples read from the database on the scraping thread, at most once per
    :data:`READ_EVERY`. A database that cannot answer leaves the series out of that scrape
    rather than failing the whole scrape: the gRPC and process metrics still say what is
    wrong."""

    def __init__(self, read: Callable[[], Mapping[tuple[str, ...], float]]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._samples: Mapping[tuple[str, ...], float] = {}

    def read(self) -> Mapping[tuple[str, ...], float]:
        with self._lock:
            if time.monotonic() - self._read_at >= READ_EVERY:
                try:
                    self._samples = self._read()
                except Exception as exc:  # whatever it is: reported, and the scrape goes on
                    log.warning("cannot read metrics from the database: %s", exc)
                    return {}
                self._read_at = time.monotonic()
            return self._samples


def watch_writers(metrics: Metrics, database: Database, step_process: StepProcess | None) -> None:
    """The writers' metrics: each committed batch's size and time (the server's SQLite group
    commit, the step writer process's batches), and the step writer's restarts."""
    sizes, seconds = metrics.histogram(DB_BATCH_SIZE), metrics.histogram(DB_COMMIT_SECONDS)

    def committed(writer: str) -> Callable[[int, float], None]:
        size, took = sizes.labels(writer), seconds.labels(writer)

        def observe(batch: int, elapsed: float) -> None:
            size.observe(batch)
            took.observe(elapsed)

        return observe

    database.observe_commits(committed("server"))
    if step_process is not None:
        step_process.on_batch = committed("step_writer")
    metrics.collect(
        STEP_WRITER_RESTARTS,
        lambda: {(): float(step_process.restarts if step_process is not None else 0)},
    )
