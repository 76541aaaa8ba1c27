"""``/metrics`` (issue 29, item 1): served by ``prometheus_client`` on its own address, every
RPC counted by method and code, and the exposure rule of the gRPC port.

Scraped over real HTTP from a real server; the scrape is parsed with ``prometheus_client``'s
parser and, when Debian's ``promtool`` is installed (``.ci/run`` installs it), checked by it.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import runtime_service_pb2_grpc as pb_grpc
from agentrt_base.metrics import SPECS
from agentrt_base.metrics_http import MetricsExposureError, metrics_exposure
from agentrt_base.tls import ServerTls
from runtime_service.listening import StartupError
from runtime_service.run_metrics import READ_EVERY
from runtime_service.runtime_settings import RuntimeSettings
from tests.runtime_support import Stubs
from tests.service.steps_support import chunk, header, start
from tests.support import ServerThread, serving


@pytest.fixture(scope="module")
def metered(shared_database_url: str) -> Iterator[ServerThread]:
    with serving(shared_database_url, metrics_listen="127.0.0.1:0") as thread:
        yield thread


def scrape(thread: ServerThread) -> str:
    port = thread.server.metrics_port
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(response.read().decode())


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name``, keyed by its sorted labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def handled(text: str, method: str, code: str) -> float:
    service, _, name = method.rpartition("/")
    key = (
        ("grpc_code", code),
        ("grpc_method", name),
        ("grpc_service", service),
        ("grpc_type", "unary"),
    )
    return samples(text, "agentrt_grpc_server_handled_total").get(key, 0.0)


def test_every_rpc_is_counted_with_the_code_its_caller_received(metered: ServerThread) -> None:
    before = scrape(metered)
    get_run = "agentrt.runtime.v1.RuntimeService/GetRun"
    check = "grpc.health.v1.Health/Check"
    with grpc.insecure_channel(metered.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(3):
            health.Check(health_pb2.HealthCheckRequest())
        runs = pb_grpc.RuntimeServiceStub(channel)
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as info:
                runs.GetRun(pb.GetRunRequest(run_id="run_doesnotexist"))
        code = info.value.code().name
        with pytest.raises(grpc.RpcError):  # a method no server has: not a label value
            channel.unary_unary("/agentrt.runtime.v1.RuntimeService/MadeUp")(b"")
    after = scrape(metered)
    assert handled(after, check, "OK") - handled(before, check, "OK") == 3
    assert handled(after, get_run, code) - handled(before, get_run, code) == 2
    assert "MadeUp" not in after
    assert samples(after, "agentrt_step_writer_restarts_total") == {(): 0.0}
    latency = samples(after, "agentrt_grpc_server_handling_seconds_count")
    assert (
        latency[
            (
                ("grpc_method", "GetRun"),
                ("grpc_service", "agentrt.runtime.v1.RuntimeService"),
                ("grpc_type", "unary"),
            )
        ]
        >= 2
    )
    refused = samples(after, "agentrt_grpc_server_refused_total")
    key = (
        ("grpc_code", code),
        ("grpc_method", "GetRun"),
        ("grpc_service", "agentrt.runtime.v1.RuntimeService"),
        ("reason", "NOT_FOUND"),
    )
    assert refused.get(key, 0) >= 2, refused
    in_flight = samples(after, "agentrt_grpc_server_in_flight")
    assert in_flight and all(value == 0 for value in in_flight.values()), in_flight


def test_every_declared_metric_is_exposed_with_its_help(metered: ServerThread) -> None:
    text = scrape(metered)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for spec in SPECS:
        family = families.get(spec.name)  # the parser strips a counter's _total
        assert family is not None, spec.name
        assert family.type == spec.kind and family.documentation == spec.help


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool: .ci/run installs it")
def test_promtool_accepts_the_scrape(metered: ServerThread) -> None:
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=scrape(metered),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_endpoint_is_loopback_only_unless_scrapers_are_authenticated() -> None:
    tls = ServerTls("cert.pem", "key.pem")
    mtls = ServerTls("cert.pem", "key.pem", client_ca_file="ca.pem")
    assert "loopback" in metrics_exposure("127.0.0.1:9464", None, insecure=False)
    assert "loopback" in metrics_exposure("[::1]:9464", None, insecure=False)
    assert "client certificate" in metrics_exposure("0.0.0.0:9464", mtls, insecure=False)
    assert "--insecure" in metrics_exposure("0.0.0.0:9464", None, insecure=True)
    for server_tls in (None, tls):  # TLS alone lets anyone read it
        with pytest.raises(MetricsExposureError, match=r"refusing to serve metrics on 0\.0\.0\.0"):
            metrics_exposure("0.0.0.0:9464", server_tls, insecure=False)


def test_a_refused_metrics_address_stops_the_start_in_one_line(tmp_path: Path) -> None:
    thread = ServerThread(f"sqlite:///{tmp_path / 'm.db'}", metrics_listen="0.0.0.0:0")
    with pytest.raises(StartupError, match=r"refusing to serve metrics on 0\.0\.0\.0:0"):
        thread.start()
    thread.stop()
    assert not (tmp_path / "m.db").exists()  # refused before the database was opened


def _value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` (0 when absent)."""
    return samples(text, name).get(tuple(sorted(labels.items())), 0.0)


def test_a_runs_life_is_counted_from_queue_to_end(metered: ServerThread) -> None:
    """Created → queued (the gauge, read from the database) → acquired (schedule-to-start,
    attempts by reason) → completed (ended, duration), each seen in a scrape."""
    agent = {"namespace": "default", "agent_id": "coding_agent"}
    with Stubs.open(metered.address) as stubs:
        stubs.publish_agent()
        before = scrape(metered)
        queued_before = _value(before, "agentrt_runs", status="QUEUED", **agent)
        run = stubs.run(stubs.thread().id)
        time.sleep(READ_EVERY)  # the gauge is read at most once a second
        queued = scrape(metered)
        assert _value(queued, "agentrt_runs", status="QUEUED", **agent) == queued_before + 1
        acquired = stubs.acquire()
        assert acquired.run.id == run.id
        stubs.complete(acquired.fence)
        time.sleep(READ_EVERY)
        after = scrape(metered)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert _value(after, "agentrt_runs", status="QUEUED", **agent) == queued_before
    assert _value(after, "agentrt_runs", status="RUNNING", **agent) == _value(
        before, "agentrt_runs", status="RUNNING", **agent
    )
    assert grew("agentrt_attempts_started_total", reason="INITIAL", **agent) == 1
    assert grew("agentrt_run_schedule_to_start_seconds_count", **agent) == 1
    assert grew("agentrt_runs_ended_total", status="COMPLETED", **agent) == 1
    assert grew("agentrt_run_duration_seconds_count", status="COMPLETED", **agent) == 1
    assert grew("agentrt_run_duration_seconds_sum", status="COMPLETED", **agent) > 0


def test_the_reaper_counts_an_expired_lease(database_url: str) -> None:
    """A worker that stops heartbeating: its attempt ends LOST (a lease loss, a reaper
    action), and the run's next attempt starts for WORKER_LOST. A database of its own: the
    module's server would reap the lease too, and count it instead."""
    fast = RuntimeSettings(reaper_interval=0.1)
    with (
        serving(database_url, metrics_listen="127.0.0.1:0", runtime_settings=fast) as thread,
        Stubs.open(thread.address) as stubs,
    ):
        stubs.publish_agent()
        stubs.run(stubs.thread().id)
        first = stubs.acquire(ttl=1.0)
        agent = {"namespace": "default", "agent_id": "coding_agent"}
        deadline = time.monotonic() + 20
        while _value(scrape(thread), "agentrt_lease_losses_total", **agent) < 1:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.2)
        again = stubs.acquire(wait=5.0)
        assert again.run.id == first.run.id
        text = scrape(thread)
    assert _value(text, "agentrt_reaper_actions_total", kind="lease_expired") == 1
    assert _value(text, "agentrt_attempts_started_total", reason="WORKER_LOST", **agent) == 1


def test_a_step_is_counted_once_whatever_the_worker_repeats(metered: ServerThread) -> None:
    """A BeginStep or EndStep repeated (a retry after a lost answer) answers the step already
    recorded and is not counted again; a model call's tokens and cost are counted at its end."""
    agent = {"agent_id": "coding_agent"}
    with Stubs.open(metered.address) as stubs:
        worker = start(stubs)
        before = scrape(metered)
        first = worker.model(key="k1").step
        again = worker.model(key="k1").step
        assert again.id == first.id
        model = {
            "agent_id": "coding_agent",
            "provider": first.versions.model.provider,
            "model": "gpt-4.1",  # the reported model, as the worker gives it below
        }
        usage = message_pb2.Usage(input_tokens=120, output_tokens=30, cost_usd=0.25)
        for _ in range(2):
            worker.end(first.id, usage=usage, reported_model_id="gpt-4.1")
        after = scrape(metered)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("agentrt_steps_started_total", type="MODEL_CALL", **agent) == 1
    assert grew("agentrt_steps_ended_total", type="MODEL_CALL", status="SUCCEEDED", **agent) == 1
    assert grew("agentrt_model_tokens_total", direction="input", **model) == 120
    assert grew("agentrt_model_tokens_total", direction="output", **model) == 30
    assert grew("agentrt_model_cost_usd_total", **model) == pytest.approx(0.25)


def test_blob_bytes_staged_while_an_upload_arrives_then_stored(metered: ServerThread) -> None:
    """Staged: what this server holds of an upload still arriving (its first half here,
    while the client holds back the second); stored: read from the database once it is."""
    data = f"blob bytes for the gauge {time.time_ns()}".encode() * 100
    half = len(data) // 2
    go_on = threading.Event()

    def messages() -> Iterator[pb.PutBlobRequest]:
        yield header(len(data))
        yield chunk(data[:half])
        go_on.wait(30)
        yield chunk(data[half:])

    with Stubs.open(metered.address) as stubs, concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = scrape(metered)
        uploading = pool.submit(stubs.runtime.PutBlob, messages(), timeout=30)
        deadline = time.monotonic() + 10
        while _value(scrape(metered), "agentrt_blob_bytes", state="staged") != half:
            assert time.monotonic() < deadline, "the first half never showed as staged"
            time.sleep(0.05)
        go_on.set()
        uploading.result(30)
        time.sleep(READ_EVERY)
        after = scrape(metered)
    stored = _value(after, "agentrt_blob_bytes", state="stored")
    assert stored - _value(before, "agentrt_blob_bytes", state="stored") == len(data)
    assert _value(after, "agentrt_blob_bytes", state="staged") == 0
