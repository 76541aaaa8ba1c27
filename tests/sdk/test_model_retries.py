"""A worker whose model provider is down backs off and gives up (issue 27, item 1).

The worker-guide's worker pointed at a port nothing listens on recorded 2,508 failed model
calls in 44 s. Now each retry of the same candidate waits (exponential backoff with jitter),
the worker says so, and after ``per_call.attempts`` tries the attempt fails with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk import AgentrtClient
from agentrt_sdk.attempt import Attempt
from agentrt_sdk.models import ModelError
from agentrt_sdk.models.openai_compat import OpenAICompatibleModel
from agentrt_sdk.retry import ModelRetryPolicy, RetriesExhausted
from agentrt_sdk.transport import RetryPolicy
from agentrt_sdk.worker import Result, Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"
#: Nothing listens on the discard port: every call is refused at once.
DEAD_PROVIDER = "http://127.0.0.1:9/v1"
#: The default policy's shape, ten times faster, so the test takes a second.
FAST = ModelRetryPolicy(per_call=RetryPolicy(attempts=6, initial_backoff=0.05, max_backoff=3.0))


async def ask(attempt: Attempt) -> Result:
    answer = await attempt.generate([{"role": "user", "content": attempt.run.goal.objective}])
    return Result(summary=answer.content)


def test_a_dead_provider_is_retried_with_backoff_then_the_attempt_fails(
    server_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentrt_sdk.worker")

    async def scenario() -> None:
        async with (
            AgentrtClient(server_address) as client,
            OpenAICompatibleModel(base_url=DEAD_PROVIDER, api_key="k") as model,
        ):
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("dead-provider")
            run = await client.runs.create(
                thread.id, "coding_agent:prod", "fix the login", max_attempts=2
            )
            worker = Worker(client, ask, model=model, retry=FAST, lease_ttl=5, poll_wait=1)
            await asyncio.wait_for(worker.run(max_runs=2), 60)

            final = await client.runs.get(run.id)
            assert final.status == enum_pb2.RUN_STATUS_FAILED
            assert final.terminal_reason == enum_pb2.TERMINAL_REASON_ATTEMPTS_EXHAUSTED
            steps = await client.runs.steps(run.id)
            calls = [s for s in steps if s.type == enum_pb2.STEP_TYPE_MODEL_CALL]
            # Six tries an attempt, two attempts: twelve failed calls, not thousands.
            assert len(calls) == 12
            assert {s.status for s in calls} == {enum_pb2.STEP_STATUS_FAILED}
            assert {s.error_class for s in calls} == {enum_pb2.ERROR_CLASS_PROVIDER_ERROR}
            for attempt in await client.runs.attempts(run.id):
                assert attempt.status == enum_pb2.ATTEMPT_STATUS_FAILED
                assert attempt.error.retryable
                assert attempt.error.error_class == enum_pb2.ERROR_CLASS_PROVIDER_ERROR
                assert "gave up on the model call after 6 tries" in attempt.error.message
                assert "per_call.attempts is 6" in attempt.error.message

    asyncio.run(scenario())
    retries = [r.getMessage() for r in caplog.records if "failed (PROVIDER_ERROR" in r.getMessage()]
    assert len(retries) == 10, retries  # five retries an attempt, each said
    waits = [float(re.search(r"retrying in ([\d.]+) s", m).group(1)) for m in retries]  # type: ignore[union-attr]
    # Each wait within its doubling bound (full jitter): 0.05, 0.1, 0.2, 0.4, 0.8.
    for number, wait in enumerate(waits):
        assert 0 <= wait <= 0.05 * 2 ** (number % 5) + 0.05, (number, waits)
    assert "(try 6 of 6)" in retries[4]


def test_retries_are_capped_across_the_attempt(server_address: str) -> None:
    """Logic that catches a given-up call and asks again still stops: the attempt's retries
    together are capped too."""
    policy = ModelRetryPolicy(
        per_call=RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02),
        maximum_retries_per_attempt=4,
    )
    given_up: list[RetriesExhausted] = []

    async def stubborn(attempt: Attempt) -> Result:
        while True:
            try:
                await attempt.generate([{"role": "user", "content": "again"}])
            except RetriesExhausted as exc:
                given_up.append(exc)
                if "maximum_retries_per_attempt" in exc.message:
                    raise

    async def scenario() -> None:
        async with (
            AgentrtClient(server_address) as client,
            OpenAICompatibleModel(base_url=DEAD_PROVIDER, api_key="k") as model,
        ):
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("stubborn")
            run = await client.runs.create(
                thread.id, "coding_agent:prod", "fix the login", max_attempts=1
            )
            worker = Worker(client, stubborn, model=model, retry=policy, lease_ttl=5, poll_wait=1)
            await asyncio.wait_for(worker.run(max_runs=1), 60)
            steps = await client.runs.steps(run.id)
            # 3 tries (2 retries), 3 tries (2 retries: 4 in all), then 1 try: the cap.
            assert len([s for s in steps if s.type == enum_pb2.STEP_TYPE_MODEL_CALL]) == 7
            final = await client.runs.get(run.id)
            assert final.status == enum_pb2.RUN_STATUS_FAILED

    asyncio.run(scenario())
    assert [e.tries for e in given_up] == [3, 3, 1]
    assert "maximum_retries_per_attempt is 4, all used in this attempt" in given_up[-1].message


def test_the_policy_names_the_limit_reached() -> None:
    policy = ModelRetryPolicy()
    assert policy.per_call.attempts == 6 and policy.maximum_retries_per_attempt == 20
    assert policy.limit_reached(5, 0) == ""
    assert policy.limit_reached(6, 0) == "per_call.attempts is 6"
    assert policy.limit_reached(1, 20).startswith("maximum_retries_per_attempt is 20")
    with pytest.raises(ValueError, match=re.escape("per_call.attempts >= 1")):
        ModelRetryPolicy(per_call=RetryPolicy(attempts=0))
    # A given-up call keeps the last failure's class and stays retryable for the run.
    last = ModelError(enum_pb2.ERROR_CLASS_PROVIDER_ERROR, "refused", retryable=True)
    exhausted = RetriesExhausted(last, 6, 7.5, policy.limit_reached(6, 0))
    assert exhausted.error_class == enum_pb2.ERROR_CLASS_PROVIDER_ERROR and exhausted.retryable
    assert str(exhausted) == (
        "gave up on the model call after 6 tries in 7.5 s (ModelRetryPolicy per_call.attempts"
        " is 6); the last failed with ERROR_CLASS_PROVIDER_ERROR: refused"
    )
