"""Helpers for runtime tests: stubs, a published agent, a thread and a run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import (
    enum_pb2,
    message_pb2,
    runtime_service_pb2_grpc,
    worker_service_pb2_grpc,
)
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core.connect import client_channel
from tests import registry_data

#: The reference of the agent :meth:`Stubs.publish_plain_agent` publishes.
PLAIN = "plain_agent:prod"


@dataclass
class Stubs:
    channel: grpc.Channel
    registry: Any
    runtime: Any
    worker: Any

    @classmethod
    def open(cls, address: str, token: str | None = None) -> Stubs:
        """Stubs on their own connection to ``address``, sending ``token`` (if any) with
        every call as the ``agentrt`` command does."""
        channel = (
            client_channel(SimpleNamespace(token=token), address)
            if token is not None
            else grpc.insecure_channel(address)
        )
        return cls(
            channel,
            registry_service_pb2_grpc.RegistryServiceStub(channel),
            runtime_service_pb2_grpc.RuntimeServiceStub(channel),
            worker_service_pb2_grpc.WorkerServiceStub(channel),
        )

    def __enter__(self) -> Stubs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def publish_agent(self) -> str:
        registry_data.publish_all(self.registry, registry_data.coding_components())
        version = self.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition()), timeout=10
        ).agent_version
        self.registry.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=version.digest)
        )
        return str(version.digest)

    def publish_plain_agent(self) -> str:
        """coding_agent's components, and ``plain_agent:prod``: the same definition without a
        completion policy, so a worker may complete its runs without completion-check steps."""
        self.publish_agent()
        definition = registry_data.coding_definition(agent_id="plain_agent", label="v1")
        definition.ClearField("completion_policy")
        digest = self.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=definition), timeout=10
        ).agent_version.digest
        self.registry.SetTag(rpb.SetTagRequest(agent_id="plain_agent", tag="prod", digest=digest))
        return str(digest)

    def thread(self, policy: int = enum_pb2.CONCURRENCY_POLICY_ALLOW, **kwargs: Any) -> Any:
        return self.runtime.CreateThread(
            pb.CreateThreadRequest(title="t", concurrency_policy=policy, **kwargs), timeout=10
        ).thread

    def run(self, thread_id: str, ref: str = "coding_agent:prod", **kwargs: Any) -> Any:
        return self.runtime.CreateRun(
            pb.CreateRunRequest(
                thread_id=thread_id,
                agent_ref=ref,
                goal=message_pb2.Goal(objective="make the tests pass", scope=["src/"]),
                **kwargs,
            ),
            timeout=10,
        ).run

    def acquire(
        self, worker: str = "w1", wait: float = 0.0, ttl: float = 30.0, **kwargs: Any
    ) -> Any:
        return self.worker.AcquireRun(
            wpb.AcquireRunRequest(
                worker_id=worker,
                wait=duration_pb2.Duration(seconds=int(wait), nanos=int((wait % 1) * 1e9)),
                lease_ttl=duration_pb2.Duration(seconds=int(ttl), nanos=int((ttl % 1) * 1e9)),
                **kwargs,
            ),
            timeout=wait + 10,
        )

    def finish(self, fence: Any, outcome: int, **kwargs: Any) -> Any:
        return self.worker.FinishAttempt(
            wpb.FinishAttemptRequest(fence=fence, outcome=outcome, **kwargs), timeout=10
        )

    def complete(self, fence: Any, **kwargs: Any) -> Any:
        """Finish an attempt successfully the way a real worker must: the bound completion
        policy (test-and-diff@3: tests-pass, diff-reviewed) requires a SUCCEEDED
        COMPLETION_CHECK step per check before FinishAttempt(SUCCEEDED_COMPLETE_RUN) is
        accepted (otherwise FAILED_PRECONDITION COMPLETION_CHECKS_MISSING)."""
        turn = self.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn
        for check in ("tests-pass", "diff-reviewed"):
            step = self.worker.BeginStep(
                wpb.BeginStepRequest(
                    fence=fence,
                    turn_id=turn.id,
                    type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
                    completion_check=message_pb2.CompletionCheckSpec(check=check),
                ),
                timeout=10,
            ).step
            self.worker.EndStep(
                wpb.EndStepRequest(
                    fence=fence, step_id=step.id, status=enum_pb2.STEP_STATUS_SUCCEEDED
                ),
                timeout=10,
            )
        return self.finish(fence, enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN, **kwargs)

    def close(self) -> None:
        self.channel.close()


def get_run(stubs: Stubs, run_id: str) -> message_pb2.Run:
    run: message_pb2.Run = stubs.runtime.GetRun(pb.GetRunRequest(run_id=run_id), timeout=10).run
    return run


def in_seconds(seconds: float) -> timestamp_pb2.Timestamp:
    """The wall-clock time ``seconds`` from now (negative: ago), as the contract carries it."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int((time.time() + seconds) * 1e9))
    return stamp
