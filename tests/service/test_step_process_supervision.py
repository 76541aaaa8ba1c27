"""The step writer process cannot be killed by a request, and when it dies anyway (a crash,
kill -9) the server restarts it with backoff while the calls it held answer UNAVAILABLE and
nothing it acknowledged is lost. On both engines."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from runtime_service import step_process, step_writer
from runtime_service.notify import Notifier
from runtime_service.step_process import BEGIN_STEP, Backoff, StepProcess, child_database_url
from runtime_service.step_writer import FailureLog
from tests.runtime_support import Stubs
from tests.service.steps_support import T, Worker, get_run, start
from tests.service.test_step_process import _serving, begin_request, verified, writer
from tests.support import error_details


@pytest.fixture
def server(database_url: str) -> Iterator[tuple[StepProcess, Stubs]]:
    with _serving(database_url) as served:
        yield served


def _tool_call(w: Worker, key: str, **numbers: float) -> wpb.BeginStepRequest:
    arguments = struct_pb2.Struct()
    for name, number in numbers.items():
        arguments.fields[name].number_value = number  # by hand: Struct.update refuses inf
    return wpb.BeginStepRequest(
        fence=w.fence,
        turn_id=w.turn_id,
        type=enum_pb2.STEP_TYPE_TOOL_CALL,
        idempotency_key=key,
        tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=arguments),
    )


def test_a_request_it_cannot_parse_is_handed_back_and_it_lives_on(
    server: tuple[StepProcess, Stubs], database_url: str
) -> None:
    """Issue 14, defect 1: a non-finite number in a tool call's arguments made the child's
    parsing raise and the child die. Sent to a step writer directly (the server's own request
    validation would stop this one before it gets there, not every one that breaks the
    child): it hands the call back, answers the call that shared its batch, and is the same
    process afterwards."""
    _, stubs = server
    w = start(stubs)
    poison = _tool_call(w, "poison", x=float("inf")).SerializeToString()

    async def scenario() -> None:
        process = StepProcess(child_database_url(normalise_url(database_url)), Notifier())
        await process.start()
        try:
            pid = process.pid
            bad, good = await asyncio.gather(
                process.call(BEGIN_STEP, poison),
                process.call(BEGIN_STEP, begin_request(w, "good").SerializeToString()),
            )
            assert bad is None and good is not None and good.step.sequence == 1
            assert process.alive and process.pid == pid and process.restarts == 0
            assert await process.call(BEGIN_STEP, poison) is None  # and again
            assert process.alive and process.pid == pid
        finally:
            await process.stop()
        assert not process.alive and process.pid is None

    asyncio.run(scenario())
    assert get_run(stubs, w.run_id).step_count == 1


def test_a_call_that_fails_unexpectedly_is_handed_back_alone(
    server: tuple[StepProcess, Stubs],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call that reaches a bug while it runs (not a database failure) is rolled back and
    handed back by itself; the rest of its batch commits, the error is logged, and nothing
    of the rolled-back write lingers in what the writer answers next."""
    _, stubs = server
    a, b, c = start(stubs), start(stubs, publish=False), start(stubs, publish=False)
    with writer(database_url) as child:
        run = child.jobs.run

        def buggy(tx: Any, call: Any, engine: Any = None) -> Any:
            answer = run(tx, call, engine)  # its writes go first: they must be rolled back
            if call is not None and call.req.idempotency_key == "bug":
                raise RuntimeError("a bug this request reaches")
            return answer

        monkeypatch.setattr(child.jobs, "run", buggy)
        monkeypatch.setattr(step_writer, "_CALL_FAILURES", FailureLog("a call failed"))
        caplog.set_level(logging.ERROR, "agentrt.step_writer")
        answers = child.batch(
            (BEGIN_STEP, begin_request(a, "a")),
            (BEGIN_STEP, begin_request(b, "bug")),
            (BEGIN_STEP, begin_request(c, "c")),
        )
        assert [answer is not None for answer in answers] == [True, False, True]
        assert [get_run(stubs, w.run_id).step_count for w in (a, b, c)] == [1, 0, 1]
        [record] = caplog.records
        assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)

        # The next calls see the runs as committed: b's first step is its first.
        monkeypatch.undo()
        again = child.batch(
            (BEGIN_STEP, begin_request(b, "b")), (BEGIN_STEP, begin_request(a, "a2"))
        )
        assert [answer.step.sequence for answer in again] == [1, 2]
    assert [get_run(stubs, w.run_id).step_count for w in (a, b, c)] == [2, 1, 1]
    assert all(verified(stubs, w.run_id) for w in (a, b, c))


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run() -> None:
    backoff = Backoff(first=0.1, cap=1.0, stable=30.0)
    assert [backoff.delay(None) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.delay(29.0) == 1.0  # a child that died young does not reset it
    assert backoff.delay(30.0) == 0.1  # one that stayed up does
    assert backoff.delay(0.5) == 0.2


def _all_steps(stubs: Stubs, run_id: str) -> list[message_pb2.Step]:
    steps: list[message_pb2.Step] = []
    token = ""
    while True:
        page = stubs.runtime.ListSteps(
            pb.ListStepsRequest(run_id=run_id, page_size=500, page_token=token), timeout=T
        )
        steps += page.steps
        token = page.next_page_token
        if not token:
            return steps


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_killed_mid_load_it_is_restarted_and_nothing_acknowledged_is_lost(
    server: tuple[StepProcess, Stubs], caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 of the step writer while four workers record steps: each call answers or
    fails UNAVAILABLE (then retried with its key, as the contract says), the death is logged
    in one line without a traceback, a new process takes the steps again, and every step
    acknowledged is in the ledger with the status acknowledged."""
    process, stubs = server
    caplog.set_level(logging.INFO)
    workers = [start(stubs, publish=i == 0) for i in range(4)]
    stop = threading.Event()
    refused: Counter[tuple[Any, str]] = Counter()
    begun: dict[str, list[str]] = {w.run_id: [] for w in workers}
    ended: dict[str, set[str]] = {w.run_id: set() for w in workers}

    def retrying(call: Callable[..., Any], *args: Any) -> Any:
        for _ in range(100):
            try:
                return call(*args)
            except grpc.RpcError as error:
                info = error_details(error).get("ErrorInfo")
                refused[error.code(), info.reason if info else ""] += 1
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.02)
        raise AssertionError("still unavailable")

    def steps(w: Worker) -> None:
        i = 0
        while not stop.is_set():
            step = retrying(w.model, f"k{i}").step
            begun[w.run_id].append(step.id)
            retrying(w.end, step.id)
            ended[w.run_id].add(step.id)
            i += 1

    threads = [threading.Thread(target=steps, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    try:
        _until(lambda: process.answered >= 100)
        pid = process.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _until(lambda: process.restarts == 1 and process.alive)
        assert process.pid not in (None, pid)
        answered = process.answered
        _until(lambda: process.answered >= answered + 50)  # the new process takes steps
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert set(refused) <= {
        (grpc.StatusCode.UNAVAILABLE, "STEP_WRITER_STOPPED"),
        (grpc.StatusCode.UNAVAILABLE, "COMMIT_OUTCOME_UNKNOWN"),
    }, refused
    for w in workers:
        stored = {s.id: s for s in _all_steps(stubs, w.run_id)}
        assert set(begun[w.run_id]) <= set(stored)
        assert all(stored[i].status == enum_pb2.STEP_STATUS_SUCCEEDED for i in ended[w.run_id])
        assert sorted(s.sequence for s in stored.values()) == list(range(1, len(stored) + 1))
        assert verified(stubs, w.run_id)
    ours = [r for r in caplog.records if r.name.startswith("agentrt")]
    deaths = [r for r in ours if "stopped unexpectedly" in r.getMessage()]
    assert len(deaths) == 1 and str(pid) in deaths[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_during_a_restart_leaves_no_process_behind(
    server: tuple[StepProcess, Stubs], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() soon after a death, whether the restart is waiting, starting or done: when it
    returns no step writer it started is running (so none has the database open)."""
    forked: list[int] = []
    fork = step_process._Zygote.fork

    def recording(*args: Any) -> int:
        forked.append(fork(*args))
        return forked[-1]

    monkeypatch.setattr(step_process._Zygote, "fork", recording)

    async def scenario(pause: float) -> None:
        process = StepProcess(
            child_database_url(normalise_url(database_url)), Notifier(), Backoff(first=0.01)
        )
        await process.start()
        pid = process.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(_until, lambda: not process.alive)
        await asyncio.sleep(pause)
        await process.stop()
        assert not process.alive and process.pid is None
        await asyncio.sleep(0.2)  # (a restart stop() did not wait for would start now)
        assert not process.alive and not [pid for pid in forked if _running(pid)]

    for pause in (0.0, 0.005, 0.02, 0.1, 0.5):
        asyncio.run(scenario(pause))
    assert len(forked) >= 6  # restarts were under way or done for some of them
    assert not [pid for pid in forked if _running(pid)]


def test_nothing_is_restarted_once_the_stop_has_begun(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server calls begin_stop() first thing in its stop; a writer that dies during the
    drain that follows (a signal to the process group once did that) stays down, and the
    stop then ends without waiting on a restart (issue 27, item 2)."""

    async def scenario() -> None:
        process = StepProcess(
            child_database_url(normalise_url(database_url)), Notifier(), Backoff(first=0.01)
        )
        await process.start()
        pid = process.pid
        assert pid is not None
        process.begin_stop()
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(_until, lambda: not process.alive)
        await asyncio.sleep(0.3)  # (a restart after 0.01 s would be running now)
        assert not process.alive and process.restarts == 0 and process.failed_starts == 0
        await asyncio.wait_for(process.stop(), 15)
        assert process.pid is None

    caplog.set_level(logging.INFO, logger="agentrt")
    asyncio.run(scenario())
    # Not "stopped unexpectedly": a stop had begun.
    assert not [r for r in caplog.records if "unexpectedly" in r.getMessage()]
