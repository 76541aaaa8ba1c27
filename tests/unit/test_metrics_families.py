"""The metric families (agentrt_base.metrics): what a scrape shows is what was counted, in
the shape Prometheus expects (a histogram's buckets cumulative, ``le`` inclusive)."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agentrt_base.metrics import (
    DB_COMMIT_SECONDS,
    GRPC_HANDLED,
    GRPC_IN_FLIGHT,
    RUN_DURATION,
    Metrics,
)


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_counters_and_gauges_show_what_was_counted() -> None:
    metrics = Metrics()
    handled = metrics.counter(GRPC_HANDLED)
    handled.labels("s", "M", "unary", "OK").inc()
    handled.labels("s", "M", "unary", "OK").inc(2)
    in_flight = metrics.gauge(GRPC_IN_FLIGHT).labels("s", "M", "unary")
    in_flight.inc()
    in_flight.inc()
    in_flight.dec()
    key = (("grpc_code", "OK"), ("grpc_method", "M"), ("grpc_service", "s"), ("grpc_type", "unary"))
    assert _samples(metrics, "agentrt_grpc_server_handled_total") == {key: 3.0}
    assert _samples(metrics, "agentrt_grpc_server_in_flight") == {key[1:]: 1.0}


def test_a_histogram_is_cumulative_and_its_bounds_inclusive() -> None:
    metrics = Metrics()
    duration = metrics.histogram(RUN_DURATION).labels("ns", "agent", "COMPLETED")
    for seconds in (0.05, 0.1, 0.2, 1e9):  # 0.1 is a bound: it counts in le="0.1"
        duration.observe(seconds)
    buckets = {
        dict(labels)["le"]: value
        for labels, value in _samples(metrics, "agentrt_run_duration_seconds_bucket").items()
    }
    assert buckets["0.1"] == 2 and buckets["0.5"] == 3 and buckets["86400.0"] == 3
    assert buckets["+Inf"] == 4
    [count] = _samples(metrics, "agentrt_run_duration_seconds_count").values()
    [total] = _samples(metrics, "agentrt_run_duration_seconds_sum").values()
    assert count == 4 and total == pytest.approx(1e9 + 0.35)


def test_wrong_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        Metrics().counter(GRPC_HANDLED).labels("only one")


def test_a_threaded_metric_loses_no_observation() -> None:
    """The writers observe from their own threads: those children take a lock."""
    batches = Metrics().histogram(DB_COMMIT_SECONDS)

    def observe() -> None:
        child = batches.labels("server")
        for _ in range(20_000):
            child.observe(0.001)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(batches.labels("server").counts) == 80_000
