"""The login-fix case traced end to end (issue 29, items 2 and 4), on both engines.

A server started with the standard ``OTEL_*`` variables exports to a real OTLP/gRPC receiver
(``tests/otlp_receiver.py``, built on the ``opentelemetry-proto`` service definitions). A
backend's span is the root: its ``traceparent`` goes with CreateRun (the SDK sends the current
context), the run records CreateRun's span, each attempt is an ``invoke_agent`` span under
it, each step a ``chat`` or ``execute_tool`` span under its attempt, and the Python worker
SDK's spans sit under the attempt's and the step's. Every ``gen_ai.*`` attribute is checked
against the vendored GenAI conventions registry (``tests/genai_registry.py``), and every
step's span is there exactly once, named by the ledger's record of it (``Step.trace_id``,
``span_id``), which GetProvenance and ``agentrt audit`` show.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_core.trace_context import parse, span_id_of
from agentrt_sdk import AgentrtClient
from agentrt_sdk.demo.login_fix import login_fix, make_workspace, scripted_model, tools_for
from agentrt_sdk.worker import Worker
from runtime_service.cli.audit import tree_lines
from tests.genai_registry import attribute_problems, metric_problems, span_problems
from tests.otlp_receiver import OtlpReceiver, Span
from tests.runtime_support import Stubs
from tests.support import ServerThread

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in the process environment for the block (the server reads ``OTEL_*`` as
    it starts)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def traced(shared_database_url: str, receiver: OtlpReceiver) -> Iterator[ServerThread]:
    """A server exporting its spans and GenAI metrics to ``receiver`` (with the step writer
    process: the steps' spans come from the ledger wherever a step was written)."""
    thread = ServerThread(shared_database_url, step_process=True, metrics_listen="127.0.0.1:0")
    with environment({**receiver.env(), "OTEL_SERVICE_NAME": "agentrt-under-test"}):
        thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def _provider(receiver: OtlpReceiver, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True))
    )
    return provider


@dataclass
class Played:
    backend_span: str
    trace_id: str
    run: message_pb2.Run
    attempts: list[message_pb2.Attempt]
    steps: list[message_pb2.Step]
    provenance: Any


def play(address: str, receiver: OtlpReceiver, workspace: Path) -> Played:
    """The login-fix case (a 429 and a fallback, an approval, a resumed attempt) under a
    backend's span; returns the ledger's account of it."""
    backend, worker_spans = _provider(receiver, "backend"), _provider(receiver, "worker")
    tracer = backend.get_tracer("backend")

    async def scenario() -> Played:
        async with AgentrtClient(address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("login returns 500")
            with tracer.start_as_current_span("POST /fix-login") as root:
                run = await client.runs.create(
                    thread.id,
                    "coding_agent:prod",
                    "fix the login failure",
                    labels={"workspace": str(workspace)},
                )
            context = root.get_span_context()
            worker = Worker(
                client,
                login_fix,
                model=scripted_model(rate_limit_primary_once=True),
                tools=tools_for(workspace),
                poll_wait=1,
                tracer_provider=worker_spans,
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
            provenance = await client.audit.provenance(run_id=run.id)
            return Played(
                format(context.span_id, "016x"),
                format(context.trace_id, "032x"),
                await client.runs.get(run.id),
                list(await client.runs.attempts(run.id)),
                list(await client.runs.steps(run.id)),
                provenance,
            )

    try:
        return asyncio.run(scenario())
    finally:
        backend.shutdown()
        worker_spans.shutdown()


@pytest.fixture(scope="module")
def played(
    traced: ServerThread, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Played:
    played = play(traced.address, receiver, make_workspace(tmp_path_factory.mktemp("ws")))
    expected = {s.id for s in played.steps} | {a.id for a in played.attempts}

    def made(spans: list[Span]) -> bool:
        seen = {s.attributes.get("agentrt.step.id") for s in spans} | {
            s.attributes.get("agentrt.attempt.id")
            for s in spans
            if s.name.startswith("invoke_agent")
        }
        return expected <= seen

    receiver.wait_for_spans(made, timeout=30)
    return played


def spans_of(receiver: OtlpReceiver, trace_id: str) -> list[Span]:
    return [s for s in receiver.spans() if s.trace_id == trace_id]


def one(spans: list[Span], **where: Any) -> Span:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, (where, [s.name for s in found])
    return found[0]


def test_a_backends_traceparent_is_the_root_and_create_run_continues_it(
    played: Played, receiver: OtlpReceiver
) -> None:
    spans = spans_of(receiver, played.trace_id)
    root = one(spans, span_id=played.backend_span)
    assert root.parent_span_id == "" and root.resource["service.name"] == "backend"
    create = one(spans, name="agentrt.runtime.v1.RuntimeService/CreateRun")
    assert create.parent_span_id == root.span_id and create.kind == "SERVER"
    assert create.resource["service.name"] == "agentrt-under-test"
    assert create.attributes["rpc.system.name"] == "grpc"
    assert create.attributes["rpc.method"] == "agentrt.runtime.v1.RuntimeService/CreateRun"
    assert create.attributes["rpc.response.status_code"] == "OK"
    # Its database work is its child.
    under = [s for s in spans if s.parent_span_id == create.span_id]
    writes = [s for s in under if "db.system.name" in s.attributes]
    assert writes and all(s.kind == "CLIENT" and s.name.startswith("write ") for s in writes)
    assert {s.attributes["db.system.name"] for s in writes} <= {"sqlite", "postgresql"}
    # The run recorded that span: its attempts' spans are its children.
    recorded = parse(played.run.traceparent)
    assert recorded is not None
    assert (recorded.trace_id, recorded.span_id) == (played.trace_id, create.span_id)


def test_each_attempt_is_one_invoke_agent_span_under_the_run(
    played: Played, receiver: OtlpReceiver
) -> None:
    spans = spans_of(receiver, played.trace_id)
    create = one(spans, name="agentrt.runtime.v1.RuntimeService/CreateRun")
    assert len(played.attempts) >= 2  # the approval ends the first; a second resumes
    for attempt in played.attempts:
        span = one(spans, span_id=span_id_of("attempt", attempt.id))
        assert span.name == "invoke_agent coding_agent" and span.parent_span_id == create.span_id
        # The conventions' client type: the server hands the run to a worker, a remote agent.
        assert span.kind == "CLIENT"
        assert span_problems("gen_ai.invoke_agent.client", span.attributes) == []
        assert attempt.traceparent == f"00-{played.trace_id}-{span.span_id}-01"
        a = span.attributes
        assert a["gen_ai.operation.name"] == "invoke_agent"
        assert a["gen_ai.agent.id"] == a["gen_ai.agent.name"] == "coding_agent"
        assert a["gen_ai.agent.version"] == played.run.agent.version_label
        assert a["gen_ai.conversation.id"] == played.run.thread_id
        assert a["gen_ai.provider.name"]
        assert a["agentrt.agent.digest"] == played.run.agent.agent_digest
        assert (a["agentrt.run.id"], a["agentrt.attempt.id"]) == (played.run.id, attempt.id)
        assert a["agentrt.attempt.number"] == attempt.number
        # Timed by the server's clock, as the ledger recorded the attempt.
        assert span.start_ns == attempt.start_time.ToNanoseconds()
        # The worker's span of the attempt is its child.
        worker = [s for s in spans if s.parent_span_id == span.span_id and s.kind == "CONSUMER"]
        assert [s.resource["service.name"] for s in worker] == ["worker"]
    assert len([s for s in spans if s.name.startswith("invoke_agent")]) == len(played.attempts)


def test_each_step_is_one_span_from_the_ledger_with_what_was_resolved(
    played: Played, receiver: OtlpReceiver
) -> None:
    spans = spans_of(receiver, played.trace_id)
    by_step: dict[str, list[Span]] = {}
    for span in spans:
        step_id = span.attributes.get("agentrt.step.id")
        if step_id and span.resource["service.name"] == "agentrt-under-test":
            by_step.setdefault(str(step_id), []).append(span)
    numbers = {a.id: a.number for a in played.attempts}
    kinds = set()
    for step in played.steps:
        # Exactly one span per recorded step, named by the record.
        [span] = by_step[step.id]
        assert (step.trace_id, step.span_id) == (played.trace_id, span.span_id)
        assert span.parent_span_id == span_id_of("attempt", step.attempt_id)
        assert span.attributes["agentrt.attempt.number"] == numbers[step.attempt_id]
        a = span.attributes
        if step.type == enum_pb2.STEP_TYPE_MODEL_CALL:
            model = step.versions.model
            kinds.add(model.reason)
            assert span.name == f"chat {model.requested_model_id}" and span.kind == "CLIENT"
            assert span_problems("gen_ai.inference.client", a) == []
            assert a["gen_ai.operation.name"] == "chat"
            assert a["gen_ai.provider.name"] == model.provider
            assert a["gen_ai.request.model"] == model.requested_model_id
            if model.reported_model_id:
                assert a["gen_ai.response.model"] == model.reported_model_id
            assert a["gen_ai.usage.input_tokens"] == step.usage.input_tokens
            assert a["gen_ai.usage.output_tokens"] == step.usage.output_tokens
            assert a["agentrt.model.candidate_reason"] == enum_pb2.CandidateReason.Name(
                model.reason
            ).removeprefix("CANDIDATE_REASON_")
            if step.status != enum_pb2.STEP_STATUS_SUCCEEDED:
                assert a["error.type"] and span.status_code == "ERROR"
            skills = [f"{s.name}@{s.version}" for s in step.versions.skills]
            assert list(a.get("agentrt.skills", ())) == skills
        elif step.type == enum_pb2.STEP_TYPE_TOOL_CALL:
            tool = next(t for t in step.versions.tools if t.name == step.tool_name)
            assert span.name == f"execute_tool {step.tool_name}" and span.kind == "INTERNAL"
            assert span_problems("gen_ai.execute_tool.internal", a) == []
            assert a["gen_ai.operation.name"] == "execute_tool"
            assert a["gen_ai.tool.name"] == step.tool_name
            assert a["agentrt.tool.schema_digest"] == tool.schema_digest
            assert a["agentrt.tool.version"] == tool.version
            if step.status == enum_pb2.STEP_STATUS_SUCCEEDED:
                # What the worker did for it is under it.
                under = [s for s in spans if s.parent_span_id == span.span_id]
                assert [s.name for s in under] == [f"agentrt.worker.tool_call {step.tool_name}"]
    # The 429 made the policy fall back (the fallback reason is on the span).
    assert enum_pb2.CANDIDATE_REASON_FALLBACK_AFTER_ERROR in kinds
    # No step of the ledger has a second span, however often its calls were retried.
    assert set(by_step) == {s.id for s in played.steps}


def test_the_workers_calls_are_children_of_its_spans(
    played: Played, receiver: OtlpReceiver
) -> None:
    spans = spans_of(receiver, played.trace_id)
    worker = {s.span_id for s in spans if s.resource["service.name"] == "worker"}
    begins = [s for s in spans if s.name == "agentrt.runtime.v1.WorkerService/BeginStep"]
    assert begins and all(s.parent_span_id in worker for s in begins)


def test_every_gen_ai_attribute_is_as_the_conventions_define_it(
    played: Played, receiver: OtlpReceiver
) -> None:
    problems = [
        f"{span.name}: {problem}"
        for span in spans_of(receiver, played.trace_id)
        for problem in attribute_problems(span.attributes)
    ]
    assert problems == []


def test_the_genai_metrics_are_exported(played: Played, receiver: OtlpReceiver) -> None:
    for name in (
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "gen_ai.invoke_agent.duration",
        "gen_ai.execute_tool.duration",
    ):
        receiver.wait_for_metric(name, timeout=30)
    problems = [
        f"{point.name}: {problem}"
        for point in receiver.metric_points()
        if point.name.startswith("gen_ai.")
        for problem in metric_problems(point.name, point.instrument, point.unit, point.attributes)
    ]
    assert problems == []


def test_provenance_and_audit_lead_from_the_record_to_the_trace(played: Played) -> None:
    [record] = played.provenance.records
    assert {s.trace_id for s in record.steps} == {played.trace_id}
    assert all(s.span_id == span_id_of("step", s.id) for s in record.steps)
    assert record.run.traceparent == played.run.traceparent
    lines = "\n".join(tree_lines(record))
    for step in record.steps:
        assert f"trace {played.trace_id} span {step.span_id}" in lines


def test_a_hostile_trace_context_is_ignored_and_logs_nothing_of_it(
    traced: ServerThread, receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed ``traceparent`` starts a new trace and a malformed ``tracestate`` is
    dropped whole: the call succeeds, and none of the caller's bytes reach a log line."""
    marker = "hostile" * 200
    with Stubs.open(traced.address) as stubs:
        thread = stubs.thread()
        for metadata in (
            (("traceparent", marker),),
            (("traceparent", f"00-{'a' * 32}-{'b' * 16}-01"), ("tracestate", f"k={marker}")),
            (("traceparent", f"00-{'a' * 32}-{'b' * 16}-01"), ("tracestate", "=,=" * 300)),
        ):
            run = stubs.runtime.CreateRun(
                pb.CreateRunRequest(
                    thread_id=thread.id,
                    agent_ref="coding_agent:prod",
                    goal=message_pb2.Goal(objective="hostile"),
                ),
                metadata=metadata,
                timeout=10,
            ).run
            recorded = parse(run.traceparent)
            assert recorded is not None  # CreateRun's own span: a new trace, or the caller's
            if metadata[0][1] == marker:
                assert recorded.trace_id != "a" * 32
            else:
                assert recorded.trace_id == "a" * 32
    assert marker[:50] not in caplog.text


def test_a_dead_exporter_process_is_replaced(traced: ServerThread, receiver: OtlpReceiver) -> None:
    """The span exporter process killed: the server starts another, and the spans of calls
    made after it died arrive (the batch in flight when it died is lost, as a crashed
    exporter's would be)."""
    tracing = traced.server.tracing
    assert tracing is not None
    dead = tracing.exporter_pid
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    killed_at = time.time_ns()
    with Stubs.open(traced.address) as stubs:
        deadline = time.monotonic() + 30
        while True:
            stubs.thread()
            try:
                receiver.wait_for_spans(
                    lambda spans: any(
                        s.name.endswith("/CreateThread") and s.start_ns >= killed_at for s in spans
                    ),
                    timeout=1,
                )
                break
            except AssertionError:
                assert time.monotonic() < deadline, "no span arrived after the exporter died"
    assert tracing.exporter_pid not in (None, dead)
