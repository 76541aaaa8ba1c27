"""Spans and GenAI metrics made from the ledger, by the server, for every worker.

An :class:`~runtime_service.observations.Observer`: told after each commit what the runtime
did, it takes the attempts and steps that *ended* and turns each into its span
(``runtime_service.genai``) and its GenAI measurements, on a thread of its own so the call
that ended them does not wait for it. Because they come from the ledger's commits, each
ended attempt and each ended step is told once, in the replica whose transaction ended it:
a lease takeover, a retried call or a resumed attempt never makes a second span of a step
(an attempt that is taken over ends LOST, in the one transaction that ends it, and the new
attempt is a span of its own). A crash between a commit and its export loses that span; it
never duplicates one.

The times are the ledger's (the server's clock), the span ids are functions of the ledger's
ids (``agentrt_core.trace_context``), and the parent of a step's span is its attempt's, whose
parent is the run's recorded context: the tree holds whichever replica emits each span.

What a span needs to know of its attempt (run, thread, agent) is kept from the attempt's
start; a step of an attempt this replica did not see start is looked up once in the
database, on this thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Final

from opentelemetry.trace import SpanKind
from sqlalchemy.orm import Session

from agentrt_base.db import Database
from agentrt_base.tracing import Tracing
from agentrt_core.lru import LruCache
from agentrt_core.resolution import BoundDefinition
from agentrt_core.trace_context import TraceParent, parse, span_id_of
from runtime_service import genai
from runtime_service.observations import (
    AttemptEnded,
    AttemptStarted,
    AttemptTrace,
    Observation,
    StepRecorded,
)
from runtime_service.records import Step
from runtime_service.store import transitions
from runtime_service.store.tables import AttemptRow, RunRow

log = logging.getLogger("agentrt.telemetry")

#: Attempts whose context is kept (a busy server has at most its active attempts).
_KEPT: Final = 4096
#: How often the thread takes what it was told (its spans are batched for export anyway).
_EVERY: Final = 0.1

#: Each GenAI metric's unit and description (the conventions').
_OTEL: Final = {
    genai.TOKEN_USAGE: ("{token}", "Number of input and output tokens used."),
    genai.OPERATION_DURATION: ("s", "GenAI operation duration."),
    genai.AGENT_DURATION: ("s", "Duration of GenAI agent invocation."),
    genai.TOOL_DURATION: ("s", "Duration of GenAI tool execution."),
}


class LedgerTelemetry:
    """The observer that makes spans (``tracing``) and the OTLP GenAI metrics
    (``tracing.measure``: recorded in the exporter process) from the ledger; their
    Prometheus equivalents are ``run_metrics``'s, made on the event loop from the same
    measurements."""

    def __init__(
        self,
        database: Database,
        definition: Callable[[str], BoundDefinition],
        *,
        tracing: Tracing,
    ) -> None:
        self._database = database
        self._definition = definition
        self._tracing = tracing if tracing.traces else None
        self._measuring = tracing.metrics
        self._exporting = tracing
        self._attempts: LruCache[str, AttemptTrace] = LruCache(_KEPT)
        self._parsed: LruCache[str, TraceParent | None] = LruCache(_KEPT)
        # A deque the event loop appends to and the thread drains every _EVERY seconds:
        # waking the thread for each step (a queue's get) cost the loop a switch of the
        # interpreter lock per step, measured as much as making the span itself. (A deque,
        # not a list swapped for a new one: an append racing the swap could land in the
        # list already drained.)
        self._told: collections.deque[object] = collections.deque()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="agentrt-ledger-telemetry", daemon=True
        )
        self._thread.start()

    def observed(self, observations: Sequence[Observation]) -> None:
        for seen in observations:
            if isinstance(seen, StepRecorded):
                if seen.step is not None:
                    self._told.append((seen.agent_id, seen.step))
            elif isinstance(seen, AttemptStarted | AttemptEnded):
                self._told.append(seen)

    def stop(self, timeout: float = 5.0) -> None:
        """Make what was told, then end the thread (within ``timeout``)."""
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            stopping = self._stopping.wait(_EVERY)
            told = self._told
            while told:
                self._make(told.popleft())
            if stopping:
                return

    def _make(self, item: object) -> None:
        try:
            if isinstance(item, AttemptStarted):
                if item.trace is not None:
                    self._attempts.put(item.trace.attempt_id, item.trace)
            elif isinstance(item, AttemptEnded):
                self._attempt_ended(item)
            elif isinstance(item, tuple):
                self._step_ended(*item)
        except Exception:  # our bug: logged, and the next one is made
            log.exception("cannot make the telemetry of %r", item)

    def _attempt_ended(self, ended: AttemptEnded) -> None:
        trace, attempt = ended.trace, ended.attempt
        provider = genai.primary_provider(self._definition(trace.agent_digest).model_policy.spec)
        if self._measuring:
            self._measure(genai.attempt_measurements(trace, attempt))
        context = parse(attempt.traceparent)
        if self._tracing is None or context is None:
            return
        self._emit(
            genai.attempt_span(trace, attempt, provider), context, parse(trace.run_traceparent)
        )

    def _step_ended(self, agent_id: str, step: Step) -> None:
        if self._measuring:
            self._measure(genai.step_measurements(agent_id, step))
        if self._tracing is None or not step.trace_id:
            return
        trace = self._attempts.get(step.attempt_id) or self._read_attempt(step.attempt_id)
        attempt = self._parsed.get(trace.traceparent) if trace is not None else None
        if attempt is None and trace is not None:
            attempt = parse(trace.traceparent)
            self._parsed.put(trace.traceparent, attempt)
        if trace is None or attempt is None:
            return
        context = attempt.child(span_id_of("step", step.id))
        self._emit(genai.step_span(trace, step), context, attempt)

    def _emit(
        self, span: genai.LedgerSpan, context: TraceParent, parent: TraceParent | None
    ) -> None:
        assert self._tracing is not None
        self._tracing.record_span(
            span.name,
            parent=parent,
            context=context,
            kind=SpanKind.INTERNAL if span.internal else SpanKind.CLIENT,
            start=span.start,
            end=span.end,
            attributes=span.attributes,
            error=span.error,
        )

    def _measure(self, measurements: Sequence[genai.Measurement]) -> None:
        for measurement in measurements:
            unit, description = _OTEL[measurement.metric]
            self._exporting.measure(
                (
                    measurement.metric,
                    unit,
                    description,
                    tuple(genai.PROMETHEUS[measurement.metric].buckets),
                    measurement.value,
                    dict(measurement.attributes),
                )
            )

    def _read_attempt(self, attempt_id: str) -> AttemptTrace | None:
        def read(session: Session) -> AttemptTrace | None:
            attempt = session.get(AttemptRow, attempt_id)
            run = session.get(RunRow, attempt.run_id) if attempt is not None else None
            if attempt is None or run is None:
                return None
            return transitions.attempt_trace(run, attempt)

        trace = self._database.read_sync(read)
        if trace is not None:
            self._attempts.put(attempt_id, trace)
        return trace
