"""``agentrt demo --target`` against a server started with ``--metrics-listen`` and
``OTEL_EXPORTER_OTLP_ENDPOINT`` (issue 29, "Done when"), on both engines: the spans arrive at
a real OTLP/gRPC receiver and the series on ``/metrics``.

The demo kills its first worker with SIGKILL after a checkpoint; the reaper ends that attempt
LOST and a second worker takes the run over. The spans come from the ledger, so the lost
attempt is one ``invoke_agent`` span with ``error.type`` LOST, and no step of the run has a
second span however the attempts were taken over. The demo's own processes trace too (the
``OTEL_*`` variables reach them): the demo's span around each CreateRun is the root of its
run's trace, and each surviving worker's spans are children of the attempt the server handed
it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrt_core.trace_context import span_id_of
from tests.e2e.cli_support import AGENTRT, serve_env, stop, wait_ready
from tests.genai_registry import attribute_problems
from tests.otlp_receiver import OtlpReceiver, Span

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture
def played(database_url: str, receiver: OtlpReceiver) -> Iterator[tuple[dict[str, Any], str]]:
    """The demo played against a traced, metered server; yields its facts and the
    server's last scrape of /metrics."""
    port, metrics_port = _free_port(), _free_port()
    env = {**serve_env(), **receiver.env(), "OTEL_SERVICE_NAME": "agentrt-under-test"}
    server = subprocess.Popen(
        [
            *AGENTRT,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--database-url",
            database_url,
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_ready(server)
        demo = subprocess.run(
            [*AGENTRT, "demo", "--json", "--target", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            env={**env, "OTEL_SERVICE_NAME": ""},
            timeout=180,
        )
        assert demo.returncode == 0, demo.stderr
        facts = json.loads(demo.stdout)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            scrape = response.read().decode()
    finally:
        stop(server)
    yield facts, scrape


def test_the_demo_against_a_traced_server_gives_the_spans_and_series(
    played: tuple[dict[str, Any], str], receiver: OtlpReceiver
) -> None:
    facts, scrape = played
    runs = facts["runs"]
    step_ids = {step["id"] for run in runs for step in run["steps"]}

    def arrived(spans: list[Span]) -> bool:
        seen = {s.attributes.get("agentrt.step.id") for s in spans}
        return step_ids <= seen

    receiver.wait_for_spans(arrived, timeout=30)
    spans = receiver.spans()
    server = [s for s in spans if s.resource.get("service.name") == "agentrt-under-test"]
    for run in runs:
        run_spans = [s for s in server if s.attributes.get("agentrt.run.id") == run["id"]]
        # One span per step of the ledger, named by its record, under its attempt's span.
        for step in run["steps"]:
            [span] = [s for s in run_spans if s.attributes.get("agentrt.step.id") == step["id"]]
            assert span.span_id == span_id_of("step", step["id"])
        attempts = [s for s in run_spans if s.name.startswith("invoke_agent ")]
        assert len(attempts) == len(run["attempts"])
        trace_ids = {s.trace_id for s in run_spans}
        assert len(trace_ids) == 1
        # The demo's span around CreateRun is the root of the run's trace.
        [trace_id] = trace_ids
        roots = [s for s in spans if s.trace_id == trace_id and not s.parent_span_id]
        assert [r.name for r in roots] == [f"agentrt demo: create run {runs.index(run) + 1}"]
        assert roots[0].resource["service.name"] == "agentrt-demo"
    # The killed worker's attempt ended LOST: one span saying so.
    first = runs[0]
    lost = [a for a in first["attempts"] if a["status"] == "LOST"]
    assert len(lost) == 1
    [lost_span] = [
        s
        for s in server
        if s.name.startswith("invoke_agent ")
        and s.attributes["agentrt.attempt.id"] == lost[0]["id"]
    ]
    assert lost_span.attributes["error.type"] and lost_span.status_code == "ERROR"
    # The worker that took over traced its attempt under the server's span of it.
    workers = [s for s in spans if s.resource.get("service.name") == "agentrt-demo-worker"]
    attempt_spans = {s.span_id for s in server if s.name.startswith("invoke_agent ")}
    assert workers and any(s.parent_span_id in attempt_spans for s in workers)
    # Every gen_ai attribute as the conventions define it.
    assert [p for s in server for p in attribute_problems(s.attributes)] == []
    # The series: the GenAI metrics' Prometheus equivalents and the runtime's own.
    samples = [
        sample for family in text_string_to_metric_families(scrape) for sample in family.samples
    ]

    def has(name: str, **labels: str) -> bool:
        return any(
            s.name == name and all(s.labels.get(k) == v for k, v in labels.items()) and s.value
            for s in samples
        )

    assert has("agentrt_gen_ai_client_token_usage_tokens_count", gen_ai_token_type="input")
    assert has(
        "agentrt_gen_ai_client_operation_duration_seconds_count", gen_ai_operation_name="chat"
    )
    assert has(
        "agentrt_gen_ai_invoke_agent_duration_seconds_count",
        error_type=str(lost_span.attributes["error.type"]),
    )
    assert has("agentrt_gen_ai_execute_tool_duration_seconds_count", gen_ai_tool_name="apply_patch")
    assert has("agentrt_attempts_started_total", agent_id="coding_agent", reason="WORKER_LOST")
    assert has("agentrt_reaper_actions_total", kind="lease_expired")
    assert has("agentrt_grpc_server_handled_total", grpc_method="CreateRun", grpc_code="OK")
