"""The server's OpenTelemetry: traces (and the GenAI metrics) over OTLP/gRPC, configured only
by the standard ``OTEL_*`` environment variables.

Which signals are exported is ``agentrt_core.otel_env``'s rule (an OTLP endpoint named, or
the exporter set to ``otlp``). With neither traces nor metrics asked for, nothing here is
built: no provider, no process, no thread, no interceptor (the server mounts
:class:`~agentrt_base.grpc_tracing.TracingInterceptor` only with a :class:`Tracing` that
traces), so the cost is nil. The rest the OpenTelemetry SDK reads from the environment
itself: the sampler (``OTEL_TRACES_SAMPLER``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``), the batch processor (``OTEL_BSP_*``), the exporter's headers,
certificates and timeout, the metric interval
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/).

**How a span is made.** Measured on the step path, the SDK's spans made and exported in the
server's process cost 0.63x of its throughput (``bench/results/steps.md``, "Issue 29"): the
event loop spent its time starting and ending SDK spans, and the batch processor's thread
held the interpreter lock encoding them. So the server splits the SDK's work in two. Here,
on the hot path, a span is what the SDK's sampler decided and a few plain values: its ids
(drawn by the SDK's id generator), its parent, its times and attributes; while it is open its
context is the current span (a ``NonRecordingSpan``), so children, log lines and CreateRun's
recorded context see it. Finished, it is a tuple appended to a list. A thread of this class
writes those lists (and the GenAI metrics' values, aggregated per attribute set:
:meth:`Tracing.measure`) to the exporter process (``agentrt_base.span_export``), where the
spans are encoded as OTLP and sent by the SDK's OTLP/gRPC exporter, and the histograms sent
by the SDK's OTLP/gRPC metric exporter. A span the sampler drops
is never recorded; its context still carries the decision (flags) to its children and to the
worker.

Nothing here touches the process-global OpenTelemetry providers: an application that embeds
the server keeps its own, and two servers in one test process do not share anything.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import TraceState

from agentrt_base.span_export import HEADER, Finished, Frame, Measured, Window
from agentrt_core.otel_env import OtelConfigError, exports
from agentrt_core.trace_context import TraceParent, parse_tracestate
from agentrt_core.trace_context import parse as parse_traceparent

log = logging.getLogger("agentrt.tracing")

#: The instrumentation scope of every span and instrument the server makes.
SCOPE: Final = "agentrt"

#: The ``OTEL_*`` variables ask for something this server cannot do (one line).
TracingConfigError = OtelConfigError

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
#: The operations a transaction span names (``agentrt_base.db``).
DATABASE_OPERATIONS: Final = ("read", "write")
#: How often recorded spans are written to the exporter process, at the latest.
_SHIP_EVERY: Final = 0.2


def resource_from_environment(version: str) -> Resource:
    """The server's resource: ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` (read by
    ``Resource.create``), ``service.name`` ``agentrt`` when they name none, and
    ``service.version``. What is passed to ``Resource.create`` wins over the variables, so the
    name is passed only when they set none."""
    defaults: dict[str, Any] = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        defaults[SERVICE_NAME] = "agentrt"
    if version:
        defaults[SERVICE_VERSION] = version
    return Resource.create(defaults)


#: The parent rules of the SDK's ``ParentBased`` sampler with its default delegates, as its
#: description states them.
_PARENT_RULES: Final = (
    "remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,"
    "localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
)


def fixed_decision(sampler: Sampler) -> Callable[[SpanContext | None], bool] | None:
    """For a sampler whose decision is fixed by the parent alone (``always_on``,
    ``always_off``, ``parentbased_always_on``, the default, and ``parentbased_always_off``,
    recognised by the description the SDK gives them), that decision without the call: the
    sampler's call builds a context, a result and its attributes for every span, a third of
    what a span costs the event loop. Any other sampler (a ratio, a custom one) is asked
    each time. ``tests/unit/test_trace_context.py`` checks these agree with the SDK's."""
    description = sampler.get_description()
    if description == "AlwaysOnSampler":
        return lambda parent: True
    if description == "AlwaysOffSampler":
        return lambda parent: False
    if description == "ParentBased{root:AlwaysOnSampler," + _PARENT_RULES:
        return lambda parent: parent is None or bool(parent.trace_flags.sampled)
    if description == "ParentBased{root:AlwaysOffSampler," + _PARENT_RULES:
        return lambda parent: parent is not None and bool(parent.trace_flags.sampled)
    return None


_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _ns(moment: dt.datetime) -> int:
    """Nanoseconds since the epoch, exactly (a float timestamp rounds the microseconds)."""
    return (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1000


class Live:
    """An open span recorded by :class:`Tracing`: its context (current while it is open),
    its parent, its start and attributes. :meth:`end` records it."""

    __slots__ = ("attributes", "context", "kind", "name", "parent", "start_ns", "tracing")

    def __init__(
        self,
        tracing: Tracing,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
    ) -> None:
        self.tracing, self.name, self.context, self.parent = tracing, name, context, parent
        self.kind, self.attributes = kind, attributes
        self.start_ns = time.time_ns()

    @property
    def recording(self) -> bool:
        return bool(self.context.trace_flags.sampled)

    def current(self) -> otel_context.Context:
        """A context whose current span is this one (for children and log lines)."""
        return trace.set_span_in_context(NonRecordingSpan(self.context))

    def end(self, error_type: str = "") -> None:
        """Finish it now; ``error_type``: its ``error.type`` (status ERROR)."""
        if not self.recording:
            return
        if error_type:
            self.attributes["error.type"] = error_type
        context, parent = self.context, self.parent
        self.tracing.ship(
            (
                self.name,
                context.trace_id,
                context.span_id,
                parent.span_id if parent is not None else 0,
                parent is not None and parent.is_remote,
                int(context.trace_flags),
                context.trace_state.to_header() if context.trace_state else "",
                self.kind.value,
                self.start_ns,
                time.time_ns(),
                self.attributes,
                bool(error_type),
                SCOPE,
            )
        )


class _DatabaseSpan:
    """The span of one transaction, as a context manager (``Database.span``). A leaf: nothing
    runs under it that makes spans, so it is recorded without being made current."""

    __slots__ = ("_live", "_operation", "_tracing")

    def __init__(self, tracing: Tracing, operation: str) -> None:
        self._tracing, self._operation = tracing, operation
        self._live: Live | None = None

    def __enter__(self) -> object:
        parent = trace.get_current_span().get_span_context()
        # Only inside a sampled call: outside one (the reaper, the health probe) a root span
        # a second would be noise.
        if not parent.is_valid or not parent.trace_flags.sampled:
            return None
        name, attributes = self._tracing.database_spans[self._operation]
        # The attributes are shared by every span of the operation: an ended span's are
        # only read (an error adds error.type to a copy).
        self._live = self._tracing.start(name, SpanKind.CLIENT, parent, attributes)
        return self._live

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            if kind is not None:
                self._live.attributes = dict(self._live.attributes)
            self._live.end(kind.__name__ if kind is not None else "")


class Tracing:
    """This server's tracing, and its OTLP metrics: both made and exported by the exporter
    process (``agentrt_base.span_export``), which gets the spans and the measurements."""

    def __init__(
        self,
        *,
        traces: bool,
        metrics: bool,
        sampler: Sampler,
        resource: Resource,
        version: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        #: Whether spans are exported (False: only the GenAI metrics are).
        self.traces = traces
        #: Whether the GenAI metrics are exported over OTLP (:meth:`measure`).
        self.metrics = metrics
        self.sampler = sampler
        self._fixed = fixed_decision(sampler)
        self.resource = resource
        #: Each database operation's span name and attributes (:meth:`name_database`).
        self.database_spans: dict[str, tuple[str, dict[str, Any]]] = {}
        self._ids = RandomIdGenerator()
        # Deques the recording threads append to and the shipper drains (not lists swapped
        # for new ones: an append racing the swap could land in the list already shipped).
        self._pending: collections.deque[Finished] = collections.deque()
        #: The GenAI metrics' values since the last shipping, aggregated (:meth:`measure`).
        self._window = Window()
        self._wake = threading.Event()
        self._stopping = False
        self._dropped = 0
        self._version = version
        # The environment the exporter process is started with, now and on a restart: the
        # one the server started under, whatever the process's environment is later.
        self._environ = dict(os.environ if environ is None else environ)
        self._exporter: subprocess.Popen[bytes] | None = None
        self._shipper: threading.Thread | None = None
        if traces or metrics:
            self._exporter = _start_exporter(version, self._environ)
            self._shipper = threading.Thread(
                target=self._ship_forever, name="agentrt-span-shipper", daemon=True
            )
            self._shipper.start()

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, version: str = ""
    ) -> Tracing | None:
        """The tracing the ``OTEL_*`` variables ask for, or None when they ask for none.
        ``environ`` (default the process's) decides, and is laid over the process's
        environment for the exporter process. Raises :class:`TracingConfigError` for
        settings it cannot honour."""
        env = os.environ if environ is None else environ
        traces, metrics = exports(env, "traces"), exports(env, "metrics")
        if not traces and not metrics:
            return None
        resource = resource_from_environment(version)
        # The SDK's sampler as OTEL_TRACES_SAMPLER (and _ARG) configure it: a provider reads
        # them when given none (the provider itself makes no span here).
        sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        return cls(
            traces=traces,
            metrics=metrics,
            sampler=sampler,
            resource=resource,
            version=version,
            environ={**os.environ, **env},
        )

    # -- making spans -----------------------------------------------------------------------

    def start(
        self,
        name: str,
        kind: SpanKind,
        parent: SpanContext | None,
        attributes: dict[str, Any],
    ) -> Live:
        """Open a span (not yet current: :meth:`Live.current` is its context), a child of
        ``parent`` (None or invalid: a root), sampled as the SDK's sampler decides."""
        if parent is not None and not parent.is_valid:
            parent = None
        trace_id = parent.trace_id if parent is not None else self._ids.generate_trace_id()
        if self._fixed is not None:
            context = SpanContext(
                trace_id,
                self._ids.generate_span_id(),
                is_remote=False,
                trace_flags=_SAMPLED if self._fixed(parent) else _NOT_SAMPLED,
                trace_state=parent.trace_state if parent is not None else None,
            )
            return Live(self, name, context, parent, kind, attributes)
        parent_context = (
            trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())
            if parent is not None
            else None
        )
        decision = self.sampler.should_sample(
            parent_context,
            trace_id,
            name,
            kind,
            attributes,
            trace_state=parent.trace_state if parent is not None else None,
        )
        if decision.attributes:
            attributes.update(decision.attributes)
        sampled = decision.decision == Decision.RECORD_AND_SAMPLE
        context = SpanContext(
            trace_id,
            self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=_SAMPLED if sampled else _NOT_SAMPLED,
            trace_state=decision.trace_state,
        )
        return Live(self, name, context, parent, kind, attributes)

    def name_database(self, system: str, namespace: str) -> None:
        """Name the database the transaction spans describe (``db.system.name``,
        ``db.namespace``): ``{operation} {namespace or system}``, per operation."""
        attributes: dict[str, Any] = {"db.system.name": system}
        if namespace:
            attributes["db.namespace"] = namespace
        self.database_spans = {
            operation: (
                f"{operation} {namespace or system}",
                {**attributes, "db.operation.name": operation},
            )
            for operation in DATABASE_OPERATIONS
        }

    def transaction(self, operation: str) -> _DatabaseSpan:
        """The span of one transaction doing ``operation`` ("write", "read"): a CLIENT span in
        the database conventions, the child of the call's span (``Database.span``)."""
        return _DatabaseSpan(self, operation)

    def record_span(
        self,
        name: str,
        *,
        parent: TraceParent | None,
        context: TraceParent,
        kind: SpanKind,
        start: dt.datetime,
        end: dt.datetime,
        attributes: Mapping[str, Any],
        error: str = "",
    ) -> None:
        """A finished span from the ledger: ``context`` its own trace and span id (and the
        sampling decision its trace was given), ``parent`` its parent's (None: the root of
        its trace), the ledger's ``start`` and ``end``. ``error``: its ``error.type``."""
        if not context.sampled:
            return
        values = dict(attributes)
        if error:
            values["error.type"] = error
        start_ns = _ns(start)
        self.ship(
            (
                name,
                int(context.trace_id, 16),
                int(context.span_id, 16),
                int(parent.span_id, 16) if parent is not None else 0,
                parent is not None,  # a parent from the ledger was made elsewhere: remote
                context.flags,
                "",
                kind.value,
                start_ns,
                max(_ns(end), start_ns),
                values,
                bool(error),
                SCOPE,
            )
        )

    # -- shipping them to the exporter process -----------------------------------------------

    def measure(self, measured: Measured) -> None:
        """Record one value of an OTLP histogram (its name, unit, description, bucket
        bounds, the value and its attributes): aggregated here per attribute set, and the
        aggregates shipped to the exporter process, which exports them with the SDK's OTLP
        metric exporter. (Each value shipped and recorded there with the SDK's meter cost
        the step path about 110 µs of CPU a step pair, most of it in the SDK's recording:
        ``bench/results/steps.md``.)"""
        if self.metrics:
            self._window.add(measured)

    def ship(self, finished: Finished) -> None:
        """Queue a finished, sampled span for the exporter process."""
        if len(self._pending) >= _MAX_PENDING:
            self._dropped += 1  # the exporter cannot keep up: drop, as the SDK's queue does
            return
        self._pending.append(finished)

    def _ship_forever(self) -> None:
        while True:
            stopping = self._wake.wait(_SHIP_EVERY)
            batch = _drain(self._pending)
            aggregated = self._window.take()
            if batch or aggregated:
                self._write((batch, aggregated))
            if self._dropped:
                log.warning("dropped %d spans: the span exporter did not keep up", self._dropped)
                self._dropped = 0
            if stopping and self._stopping:
                return

    def _write(self, batch: Frame) -> None:
        exporter = self._exporter
        if exporter is None or exporter.stdin is None:
            return
        body = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            exporter.stdin.write(HEADER.pack(len(body)) + body)
            exporter.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            if exporter.poll() is None:
                raise
            # It died (killed, or its exporter crashed): one line, and a new one for what
            # comes next; this batch is lost, as a crashed exporter's would be.
            log.warning(
                "the span exporter exited (%s: %s); starting another", exporter.returncode, exc
            )
            self._exporter = _start_exporter(self._version, self._environ)

    @property
    def exporter_pid(self) -> int | None:
        """The span exporter process's id (None when spans are not exported)."""
        return self._exporter.pid if self._exporter is not None else None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ship what is recorded, let the exporter process export it and exit (within
        ``timeout``)."""
        if self._shipper is not None:
            self._stopping = True
            self._wake.set()
            self._shipper.join(timeout)
        exporter = self._exporter
        if exporter is not None:
            if exporter.stdin is not None:
                with contextlib.suppress(OSError):
                    exporter.stdin.close()
            try:
                exporter.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the span exporter did not finish in %g s; stopping it", timeout)
                exporter.kill()
                exporter.wait()


#: Spans recorded and not yet shipped, at most (the SDK's OTEL_BSP_MAX_QUEUE_SIZE default is
#: 2,048 for the batch processor's queue; this one holds up to 0.2 s of a busy server's).
_MAX_PENDING: Final = 20_000


def _drain(queue: collections.deque[Any]) -> list[Any]:
    """What ``queue`` holds now, taken out of it (appends meanwhile stay for the next)."""
    return [queue.popleft() for _ in range(len(queue))]


def _start_exporter(version: str, environ: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """The span exporter process (``agentrt_base.span_export``), with this interpreter and
    this checkout's packages first on its path (a checkout run without installing, and a
    bench's older checkout, must export with their own code)."""
    root = str(Path(__file__).resolve().parents[1])
    path = environ.get("PYTHONPATH", "")
    env = {**environ, "PYTHONPATH": os.pathsep.join(p for p in (root, path) if p)}
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_base.span_export", version],
        stdin=subprocess.PIPE,
        env=env,
    )


def current_traceparent() -> str:
    """The ``traceparent`` of the span current in this context ("" when there is none)."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return ""
    return TraceParent(
        format(span_context.trace_id, "032x"),
        format(span_context.span_id, "016x"),
        int(span_context.trace_flags),
    ).header()


def call_traceparent(context: Any) -> str:
    """The trace context a call came in: its server span's when the server traces, else the
    caller's own ``traceparent`` metadata, if valid ("" when neither)."""
    current = current_traceparent()
    if current:
        return current
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            parsed = parse_traceparent(value)
            return parsed.header() if parsed is not None else ""
    return ""


def incoming_parent(metadata: Any) -> SpanContext | None:
    """The caller's span, from the W3C ``traceparent`` (and ``tracestate``) of a call's
    metadata (None: none, or not valid: a new trace, never an error)."""
    traceparent = tracestate = ""
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str):
            traceparent = value
        elif key == "tracestate" and isinstance(value, str):
            tracestate = value
    if not traceparent:
        return None
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    # Parsed by our rule first: the SDK's parser logs every malformed member it meets, and
    # these bytes are the caller's.
    members = parse_tracestate(tracestate) if tracestate else None
    state = TraceState(members) if members else None
    return SpanContext(
        int(parsed.trace_id, 16),
        int(parsed.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(parsed.flags & 0x01),
        trace_state=state,
    )
