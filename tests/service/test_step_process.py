"""The step writer process (SQLite): it takes BeginStep and EndStep's common case, hands
everything else back to the server, shares the file with the server's own writer, and when
it dies its calls fail UNAVAILABLE and the server carries on alone."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db import normalise_url, writer_lock_path
from runtime_service.step_process import StepProcess
from tests.runtime_support import Stubs
from tests.service.test_steps_helpers import T, Worker, expect, get_run, list_steps, start
from tests.support import ServerThread, error_details


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentrt.db'}"


@pytest.fixture
def server(sqlite_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    thread = ServerThread(sqlite_url)
    stubs = Stubs.open(thread.start())
    process = thread.server.step_process
    assert process is not None and process.alive
    try:
        yield process, stubs
    finally:
        stubs.close()
        thread.stop()


def test_it_takes_the_common_case_and_hands_back_everything_else(
    server: tuple[StepProcess, Stubs], sqlite_url: str
) -> None:
    process, stubs = server
    w = start(stubs)
    begun = w.model("first", estimated_input_tokens=10)
    w.end(begun.step.id, usage=message_pb2.Usage(input_tokens=3, output_tokens=1))
    assert (process.answered, process.handed_back) == (2, 0)
    assert begun.resolved.model.model_id and begun.resolved.system_prompt_text

    # A repeated key, a tool outside the definition (recorded as denied), a malformed
    # request, an EndStep of an ended step: all answered by the server, as without the child.
    again = w.model("first")
    assert again.existing and again.step.id == begun.step.id
    expect(grpc.StatusCode.PERMISSION_DENIED, w.tool, "rm_rf", path="/")
    details = expect(grpc.StatusCode.INVALID_ARGUMENT, w.model, estimated_input_tokens=-1)
    assert [v.field for v in details["BadRequest"].field_violations] == [
        "model_call.estimated_input_tokens"
    ]
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        w.end,
        begun.step.id,
        enum_pb2.STEP_STATUS_FAILED,
        reason="STEP_ENDED",
    )
    assert (process.answered, process.handed_back) == (2, 4)
    steps = list_steps(stubs, w.run_id)
    assert [s.status for s in steps] == [
        enum_pb2.STEP_STATUS_SUCCEEDED,
        enum_pb2.STEP_STATUS_DENIED,
    ]
    assert [s.sequence for s in steps] == [1, 2]  # one gap-free sequence across both writers
    assert Path(writer_lock_path(normalise_url(sqlite_url)) or "").exists()


def test_it_writes_side_by_side_with_the_server(server: tuple[StepProcess, Stubs]) -> None:
    """Steps in the child while the server writes heartbeats, inputs and turns: every write
    lands, counters and sequences add up, and every chain verifies."""
    process, stubs = server
    workers = [start(stubs) for _ in range(4)]
    stop = threading.Event()

    def server_side_writes() -> int:
        done = 0
        while not stop.is_set():
            for w in workers:
                stubs.worker.Heartbeat(wpb.HeartbeatRequest(fence=w.fence), timeout=T)
                stubs.runtime.SendInput(
                    pb.SendInputRequest(
                        run_id=w.run_id, kind=enum_pb2.INPUT_KIND_FOLLOW_UP, content="later"
                    ),
                    timeout=T,
                )
                done += 1
        return done

    def steps(w: Worker) -> None:
        for i in range(15):
            step = w.model(f"k{i}").step
            w.end(step.id, usage=message_pb2.Usage(input_tokens=1, output_tokens=1))

    with ThreadPoolExecutor(5) as pool:
        background = pool.submit(server_side_writes)
        list(pool.map(steps, workers))
        stop.set()
        inputs = background.result()
    assert inputs > 0 and process.answered == 4 * 30
    for w in workers:
        run = get_run(stubs, w.run_id)
        assert (run.step_count, run.usage.input_tokens) == (15, 15)
        assert [s.sequence for s in list_steps(stubs, w.run_id)] == list(range(1, 16))
        assert verified(stubs, w.run_id)


def verified(stubs: Stubs, run_id: str) -> bool:
    audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    return bool(audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id), timeout=T).intact)


def test_when_it_dies_its_calls_fail_unavailable_and_the_server_carries_on(
    server: tuple[StepProcess, Stubs],
) -> None:
    process, stubs = server
    w = start(stubs)
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the call reaches the child, which never answers it
    try:
        call = stubs.worker.BeginStep.future(
            wpb.BeginStepRequest(
                fence=w.fence,
                turn_id=w.turn_id,
                type=enum_pb2.STEP_TYPE_MODEL_CALL,
                idempotency_key="in-flight",
                model_call=message_pb2.ModelCallSpec(),
            ),
            timeout=T,
        )
        time.sleep(0.3)
        assert not call.done()
    finally:
        os.kill(pid, signal.SIGKILL)
    error = call.exception()
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details(error)["ErrorInfo"].reason == "STEP_WRITER_STOPPED"
    deadline = time.monotonic() + 5
    while process.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.alive

    # The retry (same key) is taken by the server itself, records the step once, and the
    # rest of the run goes on without the child.
    retried = w.model("in-flight")
    assert not retried.existing
    w.end(retried.step.id)
    later = w.model("next")
    w.end(later.step.id)
    assert [s.sequence for s in list_steps(stubs, w.run_id)] == [1, 2]
    assert verified(stubs, w.run_id)


def test_it_is_not_started_when_switched_off(sqlite_url: str) -> None:
    thread = ServerThread(sqlite_url, step_process=False)
    thread.start()
    try:
        assert thread.server.step_process is None
    finally:
        thread.stop()
