"""A worker for coding_agent, written with the SDK: the agent logic is the one function below.

    .venv/bin/python examples/worker.py                # scripted model, a scratch workspace
    OPENAI_BASE_URL=https://api.deepseek.com OPENAI_API_KEY=sk-... \\
        .venv/bin/python examples/worker.py --openai   # a real OpenAI-compatible endpoint

It works on the runs of coding_agent (any version) that the server offers, one at a time
(``--concurrency N`` for more), until Ctrl-C (exit 130) or ``kill`` (SIGTERM, exit 143);
``--once`` stops after one attempt. The scratch workspace is removed when it stops.
docs/worker-guide.md explains every call.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentrt_sdk import AgentrtClient
from agentrt_sdk.attempt import Attempt
from agentrt_sdk.demo.login_fix import make_workspace, scripted_model, tools_for
from agentrt_sdk.models import ModelAdapter, ProviderRouter
from agentrt_sdk.worker import Result, Worker


async def coding_agent(attempt: Attempt) -> Result:
    """Ask the model, run the tools it calls, until it answers without a tool call."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": attempt.run.goal.objective}]
    messages += [{"role": "user", "content": i.content} for i in attempt.inputs]
    for phase in ("reproduce", "locate", "fix", "report"):
        # ``phase`` guides the scripted model; a real model reads the conversation.
        answer = await attempt.generate(
            [*messages, {"role": "user", "content": phase, "phase": phase}]
        )
        if not answer.tool_calls:
            break
        for call in answer.tool_calls:
            result = await attempt.tool(call.name, call.arguments)
            messages.append({"role": "user", "content": f"{call.name}: {result.output}"})
            if call.name == "apply_patch" and not result.denied:
                await attempt.artifact(
                    "fix.patch",
                    str(call.arguments["patch"]).encode(),
                    step_id=result.step.id,
                    media_type="text/x-diff",
                    labels={"kind": "diff"},
                )
    tests = await attempt.tool("run_tests", {})
    await attempt.check("tests-pass", bool(tests.output["passed"]), tests.output["output"])
    await attempt.check("diff-produced", True)
    return Result(summary=answer.content or "done", output={"tests": tests.output})


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="HOST:PORT (default AGENTRT_TARGET)")
    parser.add_argument("--openai", action="store_true", help="use OPENAI_BASE_URL's model")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--once", action="store_true", help="stop after one attempt")
    return parser.parse_args()


async def main(args: argparse.Namespace, scratch: Path) -> None:
    # `kill` (SIGTERM) stops the worker as Ctrl-C does, so its workspace is removed too.
    stopping = asyncio.current_task()
    assert stopping is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.cancel)
    workspace = make_workspace(scratch)
    model: ModelAdapter = scripted_model(rate_limit_primary_once=False)
    if args.openai:
        from agentrt_sdk.models import OpenAICompatibleModel

        model = ProviderRouter({}, default=OpenAICompatibleModel())
    async with AgentrtClient(args.target) as client:
        worker = Worker(
            client,
            coding_agent,
            model=model,
            tools=tools_for(workspace),
            concurrency=args.concurrency,
            agent_ids=["coding_agent"],
        )
        print(f"worker {worker.worker_id} working in {workspace}", flush=True)
        await worker.run(max_runs=1 if args.once else None)


if __name__ == "__main__":
    options = arguments()
    with tempfile.TemporaryDirectory(prefix="agentrt-workspace-") as scratch:
        try:
            asyncio.run(main(options, Path(scratch)))
        except KeyboardInterrupt:
            # Ctrl-C: asyncio.run cancelled the worker; an attempt it was working on goes
            # back to the queue when its lease expires. Exit as a shell reports Ctrl-C.
            sys.exit(130)
        except asyncio.CancelledError:
            sys.exit(128 + signal.SIGTERM)  # stopped by `kill`
