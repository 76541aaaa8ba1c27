"""A real Prometheus scrapes a server while the login-fix case runs, and answers for it
(issue 29, item 4): the scrape succeeds (``up``), and the HTTP API's queries over the key
series agree with what the run did.

Prometheus is Debian's ``prometheus`` package (``.ci/run`` installs it), started as a
process on a configuration of its own that scrapes the server's ``/metrics`` every second.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk import AgentrtClient
from agentrt_sdk.demo.login_fix import login_fix, make_workspace, scripted_model, tools_for
from agentrt_sdk.worker import Worker
from tests.e2e.cli_support import stop
from tests.support import ServerThread, serving

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="no prometheus: .ci/run installs it"
    ),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def metered(shared_database_url: str) -> Iterator[ServerThread]:
    with serving(shared_database_url, step_process=True, metrics_listen="127.0.0.1:0") as thread:
        yield thread


@pytest.fixture(scope="module")
def prometheus(metered: ServerThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping ``metered`` every second; yields its HTTP API's base URL."""
    home = tmp_path_factory.mktemp("prometheus")
    config = home / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: agentrt\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metered.server.metrics_port}']\n"
    )
    port = _free_port()
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(home / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, (home / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not become ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        stop(process)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector Prometheus answers for ``promql``."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(address, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def value(url: str, promql: str) -> float | None:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else None


def eventually(url: str, promql: str, expected: float, limit: float = 30.0) -> None:
    """Wait until ``promql`` evaluates to ``expected``: Prometheus sees the server only at its
    next scrape."""
    deadline = time.monotonic() + limit
    while (seen := value(url, promql)) != expected:
        assert time.monotonic() < deadline, f"{promql} = {seen}, expected {expected}"
        time.sleep(0.5)


def login_fix_run(address: str, workspace: Path) -> list[Any]:
    """The login-fix case to its end (a model fallback after a 429, an approval, a resumed
    attempt); returns the run's steps."""

    async def scenario() -> list[Any]:
        async with AgentrtClient(address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("login returns 500")
            run = await client.runs.create(
                thread.id,
                "coding_agent:prod",
                "fix the login failure",
                labels={"workspace": str(workspace)},
            )
            worker = Worker(
                client,
                login_fix,
                model=scripted_model(rate_limit_primary_once=True),
                tools=tools_for(workspace),
                poll_wait=1,
            )
            stopping = asyncio.Event()
            working = asyncio.create_task(worker.run(stopping))
            async with asyncio.timeout(60):
                while True:
                    current = await client.runs.get(run.id)
                    if current.status == enum_pb2.RUN_STATUS_WAITING_APPROVAL:
                        steps = await client.runs.steps(run.id)
                        approval = next(
                            s for s in steps if s.type == enum_pb2.STEP_TYPE_APPROVAL_REQUEST
                        )
                        await client.runs.resolve_approval(run.id, approval.id, approve=True)
                    if current.status == enum_pb2.RUN_STATUS_COMPLETED:
                        break
                    await asyncio.sleep(0.05)
            stopping.set()
            await working
            return list(await client.runs.steps(run.id))

    return asyncio.run(scenario())


def test_prometheus_scrapes_the_server_through_a_run(
    metered: ServerThread, prometheus: str, tmp_path: Path
) -> None:
    steps = login_fix_run(metered.address, make_workspace(tmp_path / "ws"))
    ok = 'grpc_code="OK"'
    eventually(prometheus, 'up{job="agentrt"}', 1.0)
    eventually(
        prometheus,
        f'sum(agentrt_grpc_server_handled_total{{grpc_method="CreateRun", {ok}}})',
        1.0,
    )
    eventually(
        prometheus,
        f'sum(agentrt_grpc_server_handled_total{{grpc_method="BeginStep", {ok}}})',
        float(len(steps)),
    )
    # The run's two attempts: acquired twice (before the approval, and after it).
    acquired = value(
        prometheus,
        f'sum(agentrt_grpc_server_handled_total{{grpc_method="AcquireRun", {ok}}})',
    )
    assert acquired is not None and acquired >= 2
    # Latency is a histogram Prometheus can take quantiles of.
    p99 = value(
        prometheus,
        "histogram_quantile(0.99, sum by (le) "
        '(agentrt_grpc_server_handling_seconds_bucket{grpc_method="BeginStep"}))',
    )
    assert p99 is not None and 0 < p99 < 60
    assert value(prometheus, "sum(agentrt_step_writer_restarts_total)") == 0.0
    # The step writer's batches held every BeginStep and EndStep (the path never fell back).
    batched = value(prometheus, 'sum(agentrt_db_commit_batch_size_sum{writer="step_writer"})')
    assert batched is not None and batched >= 2 * len(steps) - 3  # less the runtime's own
    # The ledger's facts, each counted once (the steps were written by the step writer
    # process and settled in the server).
    agent = 'agent_id="coding_agent"'
    eventually(prometheus, f"sum(agentrt_steps_started_total{{{agent}}})", float(len(steps)))
    eventually(prometheus, f"sum(agentrt_steps_ended_total{{{agent}}})", float(len(steps)))
    failed_models = sum(
        1
        for s in steps
        if s.type == enum_pb2.STEP_TYPE_MODEL_CALL and s.status == enum_pb2.STEP_STATUS_FAILED
    )
    assert failed_models == 1  # the 429 the fallback follows
    assert (
        value(
            prometheus,
            f'sum(agentrt_model_fallbacks_total{{{agent}, reason="FALLBACK_AFTER_ERROR"}})',
        )
        == 1.0
    )
    tokens = sum(s.usage.input_tokens + s.usage.output_tokens for s in steps)
    assert value(prometheus, f"sum(agentrt_model_tokens_total{{{agent}}})") == float(tokens)
    assert value(prometheus, f"sum(agentrt_approval_wait_seconds_count{{{agent}}})") == 1.0
    assert value(prometheus, f'sum(agentrt_runs_ended_total{{{agent}, status="COMPLETED"}})') == 1.0
    for reason in ("INITIAL", "RESUMED_AFTER_APPROVAL"):
        started = f'sum(agentrt_attempts_started_total{{{agent}, reason="{reason}"}})'
        assert value(prometheus, started) == 1.0, reason
    assert value(prometheus, f"sum(agentrt_run_schedule_to_start_seconds_count{{{agent}}})") == 1.0
    # Nothing is left in flight but the calls a worker keeps open (none: it stopped).
    eventually(
        prometheus,
        'sum(agentrt_grpc_server_in_flight{grpc_service=~"agentrt.*"})',
        0.0,
    )
