"""Helpers for runtime tests: stubs, a published agent, a thread and a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2

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
from tests import registry_data


@dataclass
class Stubs:
    channel: grpc.Channel
    registry: Any
    runtime: Any
    worker: Any

    @classmethod
    def open(cls, address: str) -> Stubs:
        channel = grpc.insecure_channel(address)
        return cls(
            channel,
            registry_service_pb2_grpc.RegistryServiceStub(channel),
            runtime_service_pb2_grpc.RuntimeServiceStub(channel),
            worker_service_pb2_grpc.WorkerServiceStub(channel),
        )

    def publish_agent(self) -> str:
        registry_data.publish_all(self.registry, registry_data.coding_components())
        version = self.registry.PublishAgentVersion(
            rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition()), timeout=10
        ).agent_version
        self.registry.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=version.digest)
        )
        return str(version.digest)

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
