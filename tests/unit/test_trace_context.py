"""The W3C trace context the ledger records (agentrt_core.trace_context) and which OTEL_*
settings turn the server's tracing on (agentrt_base.tracing)."""

from __future__ import annotations

import pytest

from agentrt_base.tracing import Tracing, TracingConfigError
from agentrt_core.trace_context import (
    TraceParent,
    attempt_context,
    parse,
    span_id_of,
    trace_id_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEADER = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_read() -> None:
    assert parse(HEADER) == TraceParent(TRACE, SPAN, 1)
    assert parse(f"00-{TRACE}-{SPAN}-00") == TraceParent(TRACE, SPAN, 0)
    assert parse(HEADER).header() == HEADER  # type: ignore[union-attr]
    # A later version is read by its first four fields (W3C, "Versioning of traceparent").
    assert parse(f"01-{TRACE}-{SPAN}-01-whatever") == TraceParent(TRACE, SPAN, 1)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper-case hex
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{SPAN}-01",
        "00-" + "a" * 600,  # longer than any header is read
    ],
)
def test_an_invalid_traceparent_is_none_never_an_error(header: str) -> None:
    assert parse(header) is None
    assert trace_id_of(header) == ""


def test_ledger_span_ids_are_functions_of_ledger_ids() -> None:
    assert span_id_of("attempt", "att_1") == span_id_of("attempt", "att_1")
    assert span_id_of("attempt", "att_1") != span_id_of("step", "att_1")
    assert len(span_id_of("step", "stp_1")) == 16 and int(span_id_of("step", "stp_1"), 16)


def test_an_attempt_is_the_child_of_its_run_or_the_root_of_a_trace_of_its_own() -> None:
    child = parse(attempt_context(HEADER, "att_1", start_trace=False))
    assert child == TraceParent(TRACE, span_id_of("attempt", "att_1"), 1)
    # The run's sampling decision is kept.
    unsampled = parse(attempt_context(f"00-{TRACE}-{SPAN}-00", "att_1", start_trace=True))
    assert unsampled is not None and not unsampled.sampled
    # A run created outside any trace: a new trace when the server traces, else none.
    root = parse(attempt_context("", "att_2", start_trace=True))
    assert root is not None and root.trace_id != TRACE and root.sampled
    assert root.span_id == span_id_of("attempt", "att_2")
    assert attempt_context("", "att_2", start_trace=False) == ""


def test_tracing_is_off_unless_an_otlp_exporter_is_asked_for() -> None:
    assert Tracing.from_environment({}) is None
    assert Tracing.from_environment({"OTEL_SERVICE_NAME": "x"}) is None
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}
    assert Tracing.from_environment(off) is None
    both_none = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
    }
    assert Tracing.from_environment(both_none) is None


def test_tracing_follows_the_otlp_variables() -> None:
    tracing = Tracing.from_environment(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}, version="9.9"
    )
    assert tracing is not None
    try:
        assert tracing.traces and not tracing.metrics
        resource = tracing.resource.attributes
        assert resource["service.name"] == "agentrt" and resource["service.version"] == "9.9"
    finally:
        tracing.shutdown()
    metrics_only = Tracing.from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert metrics_only is not None
    try:
        assert not metrics_only.traces and metrics_only.metrics
    finally:
        metrics_only.shutdown()


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTLP only"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTLP only"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "gRPC only",
        ),
    ],
)
def test_what_the_server_cannot_export_is_refused_in_one_line(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(TracingConfigError, match=says) as info:
        Tracing.from_environment(environ)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name", ["always_on", "always_off", "parentbased_always_on", "parentbased_always_off"]
)
def test_the_fixed_sampling_decisions_are_the_sdks(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decisions ``fixed_decision`` takes without asking the sampler are the ones the
    SDK's sampler of that name gives, for a root and for every kind of parent."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    from agentrt_base.tracing import fixed_decision

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    sampler = TracerProvider(shutdown_on_exit=False).sampler
    fixed = fixed_decision(sampler)
    assert fixed is not None
    parents: list[SpanContext | None] = [None]
    for remote in (True, False):
        for flags in (0, 1):
            parents.append(SpanContext(int(TRACE, 16), int(SPAN, 16), remote, TraceFlags(flags)))
    for parent in parents:
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        asked = sampler.should_sample(context, int(TRACE, 16), "x")
        assert fixed(parent) == (asked.decision == Decision.RECORD_AND_SAMPLE), (name, parent)


def test_other_samplers_are_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from agentrt_base.tracing import fixed_decision

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    assert fixed_decision(TracerProvider(shutdown_on_exit=False).sampler) is None


@pytest.mark.parametrize(
    ("header", "members"),
    [
        (
            "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
            [("congo", "t61rcWkgMzE"), ("rojo", "00f067aa0ba902b7")],
        ),
        ("tenant@vendor=x", [("tenant@vendor", "x")]),
        (" , a=1 ,", [("a", "1")]),  # empty list-members are ignored
        ("K=V", None),  # keys are lower case
        ("a=1,a=2", None),  # a key once
        ("a=b\x00", None),
        ("=,=" * 500, None),  # longer than is read at all
        (",".join(f"k{i}=v" for i in range(33)), None),  # more than 32 members
    ],
)
def test_tracestate_is_read_by_the_w3c_grammar_or_dropped_whole(
    header: str, members: list[tuple[str, str]] | None
) -> None:
    from agentrt_core.trace_context import parse_tracestate

    assert parse_tracestate(header) == members
