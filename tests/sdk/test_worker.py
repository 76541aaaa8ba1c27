"""The worker SDK against a real server, in one process: the login-fix logic with its real
tools, a model fallback after a 429, an approval wait and the resumed attempt, a cancel, and
a lost lease."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk import AgentrtClient
from agentrt_sdk.attempt import Attempt
from agentrt_sdk.demo.login_fix import login_fix, make_workspace, scripted_model, tools_for
from agentrt_sdk.worker import Result, Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"


async def _until(predicate, limit: float = 60.0) -> None:
    """Poll the server until ``predicate`` holds (the server's state, not an event here)."""
    async with asyncio.timeout(limit):
        while not await predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def test_login_fix_with_fallback_approval_and_resume(server_address: str, tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "ws")

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("login returns 500")
            run = await client.runs.create(
                thread.id,
                "coding_agent:prod",
                "fix the login failure and keep legacy-token compatibility",
                labels={"workspace": str(workspace)},
            )
            model = scripted_model(rate_limit_primary_once=True)
            worker = Worker(
                client, login_fix, model=model, tools=tools_for(workspace), lease_ttl=3, poll_wait=1
            )
            stop = asyncio.Event()
            working = asyncio.create_task(worker.run(stop))

            async def waiting() -> bool:
                current = await client.runs.get(run.id)
                return current.status == enum_pb2.RUN_STATUS_WAITING_APPROVAL

            await _until(waiting)
            steps = await client.runs.steps(run.id)
            approval = next(s for s in steps if s.type == enum_pb2.STEP_TYPE_APPROVAL_REQUEST)
            await client.runs.resolve_approval(run.id, approval.id, approve=True)

            async def ended() -> bool:
                current = await client.runs.get(run.id)
                return current.status == enum_pb2.RUN_STATUS_COMPLETED

            await _until(ended)
            stop.set()
            await working

            attempts = await client.runs.attempts(run.id)
            assert [a.status for a in attempts] == [
                enum_pb2.ATTEMPT_STATUS_ENDED_FOR_APPROVAL,
                enum_pb2.ATTEMPT_STATUS_SUCCEEDED,
            ]
            assert attempts[1].resume_from_checkpoint_id
            steps = await client.runs.steps(run.id)
            models = [s for s in steps if s.type == enum_pb2.STEP_TYPE_MODEL_CALL]
            # The first call met the 429 and was recorded FAILED; the retry went to the
            # policy's fallback candidate, and the provider's model id was recorded.
            assert models[0].status == enum_pb2.STEP_STATUS_FAILED
            assert models[0].error_class == enum_pb2.ERROR_CLASS_RATE_LIMITED
            assert models[1].versions.model.candidate_name == "fallback"
            assert models[1].versions.model.fallback_from_step_id == models[0].id
            assert models[1].versions.model.reported_model_id == "gpt-4.1"
            tools = [s.operation for s in steps if s.type == enum_pb2.STEP_TYPE_TOOL_CALL]
            assert tools == ["run_tests", "read_file", "apply_patch", "run_tests"]
            patch = next(
                s
                for s in steps
                if s.operation == "apply_patch" and s.type == enum_pb2.STEP_TYPE_TOOL_CALL
            )
            assert patch.status == enum_pb2.STEP_STATUS_SUCCEEDED
            assert patch.attempt_id == attempts[1].id
            artifacts = await client.runs.artifacts(run_id=run.id)
            assert [a.name for a in artifacts] == ["login-fix.patch"]
            final = await client.runs.get(run.id)
            assert final.result_summary.startswith("Done")
            assert (await client.audit.verify(run.id)).intact
        # The tools really ran: the workspace is fixed.
        assert "legacy:" in (workspace / "auth" / "login.py").read_text()

    asyncio.run(scenario())


def test_cancel_stops_the_logic_promptly_and_finishes_cancelled(server_address: str) -> None:
    started = asyncio.Event()

    async def slow(attempt: Attempt) -> Result:
        started.set()
        await asyncio.sleep(3600)
        return Result()

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "wait forever")
            worker = Worker(client, slow, lease_ttl=1.5, poll_wait=1)
            stop = asyncio.Event()
            working = asyncio.create_task(worker.run(stop))
            await asyncio.wait_for(started.wait(), 30)
            await client.runs.cancel(run.id, "changed my mind")

            async def cancelled() -> bool:
                current = await client.runs.get(run.id)
                return current.status == enum_pb2.RUN_STATUS_CANCELLED

            await _until(cancelled)
            stop.set()
            await working
            (attempt,) = await client.runs.attempts(run.id)
            assert attempt.status == enum_pb2.ATTEMPT_STATUS_CANCELLED

    asyncio.run(scenario())


def test_a_failing_logic_finishes_the_attempt_failed_with_its_error(server_address: str) -> None:
    async def broken(attempt: Attempt) -> Result:
        raise KeyError("no such thing")

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "break", max_attempts=1)
            worker = Worker(client, broken, lease_ttl=3, poll_wait=1)
            await worker.run(max_runs=1)
            final = await client.runs.get(run.id)
            assert final.status == enum_pb2.RUN_STATUS_FAILED
            (attempt,) = await client.runs.attempts(run.id)
            assert attempt.error.error_class == enum_pb2.ERROR_CLASS_WORKER_ERROR
            assert "KeyError" in attempt.error.message

    asyncio.run(scenario())


def test_concurrency_works_on_several_runs_at_once(server_address: str) -> None:
    inside: list[str] = []
    both = asyncio.Event()

    async def meet(attempt: Attempt) -> Result:
        # Returns only once two runs are inside the logic at the same time.
        inside.append(attempt.run.id)
        if len(inside) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 30)
        await attempt.check("tests-pass", True)
        await attempt.check("diff-produced", True)
        return Result(summary="met")

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            runs = []
            for n in range(2):
                thread = await client.threads.create(f"t{n}")  # one run per thread at a time
                runs.append(await client.runs.create(thread.id, "coding_agent:prod", f"run {n}"))
            worker = Worker(client, meet, concurrency=2, lease_ttl=5, poll_wait=1)
            await worker.run(max_runs=2)
            for run in runs:
                final = await client.runs.get(run.id)
                assert final.status == enum_pb2.RUN_STATUS_COMPLETED, final
            assert sorted(inside) == sorted(r.id for r in runs)

    asyncio.run(scenario())


def test_pause_finishes_the_attempt_paused_and_resume_continues(server_address: str) -> None:
    started = asyncio.Event()

    async def slow_then_done(attempt: Attempt) -> Result:
        if attempt.attempt.number == 1:
            started.set()
            await asyncio.sleep(3600)
        await attempt.check("tests-pass", True)
        await attempt.check("diff-produced", True)
        return Result(summary=f"done in attempt {attempt.attempt.number}")

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "pause me")
            worker = Worker(client, slow_then_done, lease_ttl=1.5, poll_wait=1)
            stop = asyncio.Event()
            working = asyncio.create_task(worker.run(stop))
            await asyncio.wait_for(started.wait(), 30)
            await client.runs.pause(run.id, "lunch")

            async def paused() -> bool:
                return (await client.runs.get(run.id)).status == enum_pb2.RUN_STATUS_PAUSED

            await _until(paused)
            await client.runs.resume(run.id, "back")

            async def completed() -> bool:
                return (await client.runs.get(run.id)).status == enum_pb2.RUN_STATUS_COMPLETED

            await _until(completed)
            stop.set()
            await working
            first, second = await client.runs.attempts(run.id)
            assert first.status == enum_pb2.ATTEMPT_STATUS_PAUSED
            assert second.status == enum_pb2.ATTEMPT_STATUS_SUCCEEDED

    asyncio.run(scenario())


class _Silent(Worker):
    """A worker whose heartbeats never reach the server (a network partition, say)."""

    async def _heartbeat(self, attempt, stop) -> None:
        await asyncio.Event().wait()


def test_a_lost_lease_stops_the_logic_without_another_write(server_address: str) -> None:
    refused: list[BaseException] = []

    async def keep_checkpointing(attempt: Attempt) -> Result:
        try:
            while True:
                attempt.state["beats"] = attempt.state.get("beats", 0) + 1
                await attempt.checkpoint()
                await asyncio.sleep(0.1)
        except BaseException as exc:
            refused.append(exc)
            raise

    async def finish(attempt: Attempt) -> Result:
        await attempt.check("tests-pass", True)
        await attempt.check("diff-produced", True)
        return Result(summary=f"resumed after {attempt.state['beats']} checkpoints")

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "partitioned")
            await _Silent(client, keep_checkpointing, lease_ttl=1, poll_wait=1).run(max_runs=1)
            # The logic met the dead fence and the worker stopped; the next worker resumes.
            assert refused and type(refused[0]).__name__ == "LeaseLostError"
            await Worker(client, finish, lease_ttl=5, poll_wait=1).run(max_runs=1)
            final = await client.runs.get(run.id)
            assert final.status == enum_pb2.RUN_STATUS_COMPLETED
            assert final.result_summary.startswith("resumed after ")
            first, second = await client.runs.attempts(run.id)
            assert first.status == enum_pb2.ATTEMPT_STATUS_LOST
            assert second.resume_from_checkpoint_id

    asyncio.run(scenario())


def test_a_steer_reaches_the_next_model_call(server_address: str) -> None:
    from agentrt_sdk.models.scripted import Reply, ScriptedModel

    ready, go = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([Reply("ok")])

    async def steered(attempt: Attempt) -> Result:
        await attempt.check("tests-pass", True)
        ready.set()
        await go.wait()
        answer = await attempt.generate([{"role": "user", "content": "go on"}])
        await attempt.check("diff-produced", True)
        return Result(summary=answer.content)

    async def scenario() -> None:
        async with AgentrtClient(server_address) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "listen")
            worker = Worker(client, steered, model=model, lease_ttl=5, poll_wait=1)
            working = asyncio.create_task(worker.run(max_runs=1))
            await asyncio.wait_for(ready.wait(), 30)
            await client.runs.steer(run.id, "keep legacy tokens working")
            go.set()
            await working
            assert (await client.runs.get(run.id)).status == enum_pb2.RUN_STATUS_COMPLETED

    asyncio.run(scenario())
    (request,) = model.requests
    assert request.messages[-1] == {"role": "user", "content": "keep legacy tokens working"}
    # The tools offered carry their descriptions from the bound definition.
    described = {t.name: t.description for t in request.tools}
    assert described["read_file"].startswith("Read a UTF-8 text file")
