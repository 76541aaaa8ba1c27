"""docs/operations.md lists every metric the server declares, as the code declares it."""

from __future__ import annotations

from agentrt_base import metrics_reference
from agentrt_base.metrics import SPECS


def test_the_operations_guide_lists_every_metric_as_declared() -> None:
    text = metrics_reference.DOC.read_text(encoding="utf-8")
    assert metrics_reference.replace_in(text, metrics_reference.generate()) == text, (
        "docs/operations.md's metrics table is stale: run "
        "`python -m agentrt_base.metrics_reference --write`"
    )


def test_names_follow_the_prometheus_conventions() -> None:
    """https://prometheus.io/docs/practices/naming/: one prefix, base units, ``_total`` only
    on counters (added by the client library), no unit a counter of events would not have."""
    names = [spec.name for spec in SPECS]
    assert len(set(names)) == len(names)
    for spec in SPECS:
        assert spec.name.startswith("agentrt_"), spec.name
        assert not spec.name.endswith("_total"), spec.name  # prometheus_client adds it
        assert not any(unit in spec.name for unit in ("_ms", "_milliseconds", "_kb", "_mb"))
        if spec.kind == "histogram":
            assert spec.name.endswith(("_seconds", "_bytes", "_tokens", "_size")), spec.name
        assert spec.help.endswith(".") and "\n" not in spec.help, spec.name
        # Unbounded identities never become label values.
        assert not {"run_id", "attempt_id", "step_id", "digest", "thread_id"} & set(spec.labels)
