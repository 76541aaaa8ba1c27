"""Helpers shared by the ``test_steps_*`` suites and the other tests that drive steps.

A :class:`Worker` wraps one acquired attempt: its fence, its open turn, and short calls for
the steps a worker begins and ends. Everything goes through real gRPC.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import struct_pb2

from agentrt.registry.v1 import enum_pb2 as renum
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from tests import registry_data
from tests.runtime_support import Stubs

# Re-exported: the step suites take every helper they use from this module.
from tests.runtime_support import get_run as get_run
from tests.support import error_details, rpc_error

T = 10  # per-call timeout, seconds

OK = enum_pb2.STEP_STATUS_SUCCEEDED
FAILED = enum_pb2.STEP_STATUS_FAILED


def args(**kw: Any) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(kw)
    return s


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def expect(
    code: grpc.StatusCode, call: Callable[..., Any], *a: Any, reason: str = "", **kw: Any
) -> dict[str, Any]:
    """Assert ``call`` fails with ``code`` (and ErrorInfo ``reason``); return the details."""
    error = rpc_error(call, *a, **kw)
    assert error.code() == code, (error.code(), error.details())
    details = error_details(error)
    if reason:
        assert details["ErrorInfo"].reason == reason, details
    return details


def violations(details: dict[str, Any]) -> list[str]:
    return [v.field for v in details["BadRequest"].field_violations]


def put_blob(
    stubs: Stubs, data: bytes, media_type: str = "text/plain", chunk: int = 1024 * 1024
) -> Any:
    def messages() -> Iterator[pb.PutBlobRequest]:
        yield pb.PutBlobRequest(
            header=message_pb2.BlobHeader(media_type=media_type, size=len(data))
        )
        for i in range(0, len(data), chunk):
            yield pb.PutBlobRequest(chunk=data[i : i + chunk])

    return stubs.runtime.PutBlob(messages(), timeout=T)


def put(stubs: Stubs, *messages: pb.PutBlobRequest) -> Any:
    """PutBlob with exactly these messages (put_blob makes well-formed ones)."""
    return stubs.runtime.PutBlob(iter(messages), timeout=T)


def header(size: int, expected: str = "", media_type: str = "") -> pb.PutBlobRequest:
    return pb.PutBlobRequest(
        header=message_pb2.BlobHeader(size=size, expected_digest=expected, media_type=media_type)
    )


def chunk(data: bytes) -> pb.PutBlobRequest:
    return pb.PutBlobRequest(chunk=data)


def events(stubs: Stubs, run_id: str) -> list[event_pb2.Event]:
    """Every event of the run committed so far (replayed through WatchRun)."""
    last = get_run(stubs, run_id).last_event_sequence
    out: list[event_pb2.Event] = []
    stream = stubs.runtime.WatchRun(pb.WatchRunRequest(run_id=run_id), timeout=T)
    for response in stream:
        out.append(response.event)
        if response.event.sequence >= last:
            break
    stream.cancel()
    assert [e.sequence for e in out] == list(range(1, last + 1))
    return out


def of_type(found: list[event_pb2.Event], event_type: int) -> list[event_pb2.Event]:
    return [e for e in found if e.event_type == event_type]


def get_step(stubs: Stubs, step_id: str) -> Any:
    return stubs.runtime.GetStep(pb.GetStepRequest(step_id=step_id), timeout=T).step


def list_steps(stubs: Stubs, run_id: str, **kw: Any) -> list[message_pb2.Step]:
    return list(stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=run_id, **kw), timeout=T).steps)


def send(stubs: Stubs, run_id: str, kind: Any, content: str, **kw: Any) -> Any:
    return stubs.runtime.SendInput(
        pb.SendInputRequest(run_id=run_id, kind=kind, content=content, **kw), timeout=T
    ).input


def closure(stubs: Stubs, ref: str) -> Any:
    return stubs.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref=ref), timeout=T
    ).agent_version


@dataclass
class Worker:
    stubs: Stubs
    acquired: wpb.AcquireRunResponse
    turn_id: str = ""

    @property
    def fence(self) -> message_pb2.Fence:
        return self.acquired.fence

    @property
    def run_id(self) -> str:
        return str(self.acquired.run.id)

    @property
    def attempt_id(self) -> str:
        return str(self.acquired.attempt.id)

    def begin_turn(self, **kw: Any) -> Any:
        response = self.stubs.worker.BeginTurn(
            wpb.BeginTurnRequest(fence=self.fence, **kw), timeout=T
        )
        self.turn_id = response.turn.id
        return response

    def end_turn(self, turn_id: str = "") -> Any:
        response = self.stubs.worker.EndTurn(
            wpb.EndTurnRequest(fence=self.fence, turn_id=turn_id or self.turn_id), timeout=T
        )
        if response.HasField("next_turn"):
            self.turn_id = response.next_turn.id
        return response

    def begin(self, **kw: Any) -> Any:
        kw.setdefault("fence", self.fence)
        kw.setdefault("turn_id", self.turn_id)
        return self.stubs.worker.BeginStep(wpb.BeginStepRequest(**kw), timeout=T)

    def model(self, key: str = "", **spec: Any) -> Any:
        extra = {
            k: spec.pop(k) for k in ("operation", "input_ref", "retry_of_step_id") if k in spec
        }
        return self.begin(
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key=key,
            model_call=message_pb2.ModelCallSpec(**spec),
            **extra,
        )

    def tool(self, tool: str, key: str = "", **arguments: Any) -> Any:
        return self.begin(
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key=key,
            tool_call=message_pb2.ToolCallSpec(tool=tool, arguments=args(**arguments)),
        )

    def check(self, name: str, status: Any = OK) -> Any:
        step = self.begin(
            type=enum_pb2.STEP_TYPE_COMPLETION_CHECK,
            completion_check=message_pb2.CompletionCheckSpec(check=name),
        ).step
        return self.end(step.id, status)

    def end(self, step_id: str, status: Any = OK, **kw: Any) -> Any:
        kw.setdefault("fence", self.fence)
        return self.stubs.worker.EndStep(
            wpb.EndStepRequest(step_id=step_id, status=status, **kw), timeout=T
        ).step

    def finish(self, outcome: Any, **kw: Any) -> Any:
        return self.stubs.finish(self.fence, outcome, **kw)

    def complete(self) -> Any:
        """Pass the completion policy's checks, then complete the run."""
        for name in ("tests-pass", "diff-reviewed"):
            self.check(name)
        return self.finish(enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN)


def acquire(stubs: Stubs, *, turn: bool = True, **kw: Any) -> Worker:
    got = stubs.acquire(**kw)
    assert got.HasField("run"), "no run was offered"
    worker = Worker(stubs, got)
    if turn:
        worker.begin_turn()
    return worker


def start(stubs: Stubs, *, publish: bool = True, turn: bool = True, **run_kw: Any) -> Worker:
    """Publish coding_agent (once), create a run in a new thread, acquire it, open a turn."""
    if publish:
        stubs.publish_agent()
    stubs.run(stubs.thread().id, **run_kw)
    return acquire(stubs, turn=turn)


def publish_variant(
    stubs: Stubs,
    agent_id: str,
    *,
    permission_rules: dict[str, Any] | None = None,
    model_policy: rmsg.ComponentDraft | None = None,
    completion_policy: rmsg.ComponentDraft | None = None,
) -> str:
    """Publish another agent over coding_agent's components (which must be published), with
    its own permission policy, model policy and/or completion policy; return its digest."""
    definition = registry_data.coding_definition(agent_id=agent_id, label="v1")
    drafts = []
    if permission_rules is not None:
        drafts.append(
            rmsg.ComponentDraft(
                kind=renum.COMPONENT_KIND_PERMISSION_POLICY,
                name=f"{agent_id}-perms",
                version="1",
                spec=rmsg.ComponentSpec(
                    permission_policy=rmsg.PermissionPolicySpec(
                        rules=[
                            rmsg.PermissionRule(tool=t, decision=d)
                            for t, d in permission_rules.items()
                        ],
                        default_decision=renum.PERMISSION_DECISION_DENY,
                    )
                ),
            )
        )
        definition.permission_policy = f"{agent_id}-perms@1"
    if model_policy is not None:
        drafts.append(model_policy)
        definition.model_policy = f"{model_policy.name}@{model_policy.version}"
    if completion_policy is not None:
        drafts.append(completion_policy)
        definition.completion_policy = f"{completion_policy.name}@{completion_policy.version}"
    registry_data.publish_all(stubs.registry, drafts)
    version = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=definition), timeout=T
    ).agent_version
    return str(version.digest)
