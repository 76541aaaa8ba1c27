"""The GenAI histograms as the server aggregates them (``span_export.Window``) and the exporter
process sums them up and exports them (``span_export._Meter``): the same points the SDK's meter
would make of the same values, cumulative or, when asked, as deltas."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExportResult

from agentrt_base.span_export import Measured, Window, _Meter

BOUNDS = (1.0, 10.0, 100.0)


class Recorded:
    """An exporter that keeps what it is given."""

    def __init__(self) -> None:
        self.exported: list[Any] = []
        self.shut = False

    def export(self, data: Any, timeout_millis: float = 10_000) -> MetricExportResult:
        self.exported.append(data)
        return MetricExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def measured(value: float, **attributes: str) -> Measured:
    return ("gen_ai.client.token.usage", "{token}", "Tokens.", BOUNDS, value, attributes)


def points(data: Any) -> dict[tuple[tuple[str, Any], ...], Any]:
    [resource] = data.resource_metrics
    [scope] = resource.scope_metrics
    [metric] = scope.metrics
    assert (metric.name, metric.unit, metric.description) == (
        "gen_ai.client.token.usage",
        "{token}",
        "Tokens.",
    )
    return {tuple(sorted(p.attributes.items())): (p, metric.data) for p in metric.data.data_points}


@pytest.fixture
def meter() -> Any:
    made: list[_Meter] = []

    def make(**environ: str) -> _Meter:
        made.append(_Meter("1.0", exporter=Recorded(), environ=environ))
        return made[-1]

    yield make
    for one in made:
        one.shutdown()


def test_values_are_bucketed_summed_and_kept_per_attribute_set(meter: Any) -> None:
    window = Window()
    for value in (0.5, 1.0, 3.0, 250.0):
        window.add(measured(value, model="a", kind="input"))
    # The same attribute set, its attributes in another order: the same series.
    window.add(measured(10.0, kind="input", model="a"))
    window.add(measured(7.0, model="b", kind="input"))
    exporter = meter()
    exporter.add(window.take())
    assert window.take() == []  # a new window starts empty
    data = points(exporter.collect(2_000))
    a, histogram = data[(("kind", "input"), ("model", "a"))]
    # Bucket i holds bounds[i - 1] < value <= bounds[i]; the last, above every bound.
    assert list(a.bucket_counts) == [2, 2, 0, 1]
    assert list(a.explicit_bounds) == list(BOUNDS)
    assert (a.count, a.sum, a.min, a.max) == (5, 264.5, 0.5, 250.0)
    assert histogram.aggregation_temporality == AggregationTemporality.CUMULATIVE
    b, _ = data[(("kind", "input"), ("model", "b"))]
    assert (list(b.bucket_counts), b.count, b.sum) == ([0, 1, 0, 0], 1, 7.0)


def test_cumulative_points_keep_adding_from_the_same_start(meter: Any) -> None:
    exporter, window = meter(), Window()
    window.add(measured(5.0, model="a"))
    exporter.add(window.take())
    first = points(exporter.collect(2_000))[(("model", "a"),)][0]
    window.add(measured(50.0, model="a"))
    exporter.add(window.take())
    second = points(exporter.collect(3_000))[(("model", "a"),)][0]
    assert second.start_time_unix_nano == first.start_time_unix_nano
    assert (second.count, second.sum, second.min, second.max) == (2, 55.0, 5.0, 50.0)
    assert list(second.bucket_counts) == [0, 1, 1, 0]


@pytest.mark.parametrize("preference", ["delta", "LowMemory"])
def test_delta_points_count_since_the_last_export(meter: Any, preference: str) -> None:
    exporter = meter(OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=preference)
    window = Window()
    window.add(measured(5.0, model="a"))
    window.add(measured(6.0, model="b"))
    exporter.add(window.take())
    first = points(exporter.collect(2_000))
    window.add(measured(50.0, model="a"))
    exporter.add(window.take())
    second = points(exporter.collect(3_000))
    # b had nothing new: left out, as the SDK's reader leaves it out.
    assert list(second) == [(("model", "a"),)]
    point, histogram = second[(("model", "a"),)]
    assert histogram.aggregation_temporality == AggregationTemporality.DELTA
    assert point.start_time_unix_nano == first[(("model", "a"),)][0].time_unix_nano == 2_000
    assert (point.count, point.sum, point.min, point.max) == (1, 50.0, 50.0, 50.0)
    assert exporter.collect(4_000) is None


def test_shutdown_exports_what_is_held(meter: Any) -> None:
    exporter = _Meter("1.0", exporter=Recorded(), environ={})
    window = Window()
    window.add(measured(5.0, model="a"))
    exporter.add(window.take())
    exporter.shutdown()
    recorded = exporter._exporter
    assert recorded.shut and len(recorded.exported) == 1
    assert points(recorded.exported[0])[(("model", "a"),)][0].count == 1
