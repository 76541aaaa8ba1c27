"""A 429 from an OpenAI-compatible endpoint drives the run's model fallback, end to end: the
worker SDK, the real ``openai`` client over real HTTP to a loopback server, and the runtime
resolving the policy's next candidate from the failed step it recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk import AgentrtClient
from agentrt_sdk.attempt import Attempt
from agentrt_sdk.models.openai_compat import OpenAICompatibleModel
from agentrt_sdk.worker import Result, Worker
from tests.openai_server import Answer, OpenAIServer, completion, error

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"


async def ask(attempt: Attempt) -> Result:
    answer = await attempt.generate([{"role": "user", "content": attempt.run.goal.objective}])
    await attempt.check("tests-pass", True)
    await attempt.check("diff-produced", True)
    return Result(summary=answer.content)


def test_a_429_from_the_primary_falls_back_to_the_next_candidate(server_address: str) -> None:
    def responder(request):
        model = request.body["model"]
        if model == "claude-sonnet-4":
            return error(429, "rate_limit_exceeded", "slow down", headers={"Retry-After": "20"})
        return Answer(body=completion("fixed", model=f"{model}-2025-04-14"))

    async def scenario(http: OpenAIServer) -> None:
        async with (
            AgentrtClient(server_address) as client,
            OpenAICompatibleModel(base_url=http.base_url, api_key="test-key") as model,
        ):
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("t")
            run = await client.runs.create(thread.id, "coding_agent:prod", "fix the login")
            worker = Worker(client, ask, model=model, lease_ttl=5, poll_wait=1)
            await worker.run(max_runs=1)

            final = await client.runs.get(run.id)
            assert final.status == enum_pb2.RUN_STATUS_COMPLETED
            assert final.result_summary == "fixed"
            steps = [
                s
                for s in await client.runs.steps(run.id)
                if s.type == enum_pb2.STEP_TYPE_MODEL_CALL
            ]
            assert [s.status for s in steps] == [
                enum_pb2.STEP_STATUS_FAILED,
                enum_pb2.STEP_STATUS_SUCCEEDED,
            ]
            assert steps[0].error_class == enum_pb2.ERROR_CLASS_RATE_LIMITED
            assert steps[0].versions.model.requested_model_id == "claude-sonnet-4"
            fallback = steps[1].versions.model
            assert fallback.candidate_name == "fallback"
            assert fallback.reason == enum_pb2.CANDIDATE_REASON_FALLBACK_AFTER_ERROR
            assert fallback.fallback_from_step_id == steps[0].id
            # The provider's own model id is what the ledger keeps as reported.
            assert fallback.reported_model_id == "gpt-4.1-2025-04-14"
            assert steps[1].usage.input_tokens == 11 and steps[1].usage.output_tokens == 7

    with OpenAIServer(responder) as http:
        asyncio.run(scenario(http))
        # One request per candidate: the 429 was reported, not retried inside the client, and
        # its Retry-After was not waited out before switching to another candidate.
        assert [r.body["model"] for r in http.requests] == ["claude-sonnet-4", "gpt-4.1"]
        sent = http.requests[1].body
        assert sent["temperature"] == 0.2 and sent["max_tokens"] == 8192
        assert sent["messages"][0]["role"] == "system"
        assert {t["function"]["name"] for t in sent["tools"]} == {
            "read_file",
            "apply_patch",
            "run_tests",
        }
