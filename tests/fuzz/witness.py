"""The witness: real state for fuzzed requests to aim at, and the snapshot that shows whether
a refused call changed anything.

The witness is a published agent (two versions, two tags), two threads with messages, and
runs: one with a live attempt that has a turn, finished steps with usage, a blob, a
checkpoint and artifacts (its fence is live, so fuzzed step calls pass the fence check), one
whose first attempt failed and was retried (two attempts), one queued; two saved views; and two
attestations of the agent version.
Every List RPC has at least two items to page through, so it hands out a real page token to
tamper with.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import grpc
import sqlalchemy as sa
from google.protobuf import duration_pb2, struct_pb2

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from runtime_service.schema import metadata
from tests import registry_data
from tests.runtime_support import Stubs

T = 10.0
LEASE = duration_pb2.Duration(seconds=600)  # the longest lease: it outlives any fuzz run


@dataclass
class Witness:
    run_id: str
    fence: Any  # Fence of the witness run's live attempt
    turn_id: str  # its open turn
    responses: list[Any]  # every response of the setup, for the pool to harvest


def _acquire(stubs: Stubs, worker: str) -> Any:
    return stubs.worker.AcquireRun(
        wpb.AcquireRunRequest(
            worker_id=worker, wait=duration_pb2.Duration(seconds=0), lease_ttl=LEASE
        ),
        timeout=T,
    )


def _step(stubs: Stubs, fence: Any, turn_id: str, path: str, tokens: int) -> list[Any]:
    arguments = struct_pb2.Struct()
    arguments.update({"path": path})
    begun = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn_id,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=arguments),
        ),
        timeout=T,
    )
    ended = stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=begun.step.id,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            usage=message_pb2.Usage(input_tokens=tokens, output_tokens=tokens, cost_usd=0.01),
        ),
        timeout=T,
    )
    model = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn_id,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            model_call=message_pb2.ModelCallSpec(estimated_input_tokens=100),
        ),
        timeout=T,
    )
    model_end = stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=model.step.id,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            reported_model_id="claude-sonnet-4",
            usage=message_pb2.Usage(input_tokens=tokens, output_tokens=1),
        ),
        timeout=T,
    )
    return [begun, ended, model, model_end]


def build(stubs: Stubs) -> Witness:
    out: list[Any] = []
    digest = stubs.publish_agent()
    second = stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=registry_data.coding_definition("agent_v8")),
        timeout=T,
    )
    out.append(second)
    out.append(
        stubs.registry.SetTag(
            rpb.SetTagRequest(agent_id="coding_agent", tag="canary", digest=digest), timeout=T
        )
    )
    out.append(
        stubs.registry.SetTag(
            rpb.SetTagRequest(
                agent_id="coding_agent", tag="prod", digest=second.agent_version.digest
            ),
            timeout=T,
        )
    )
    threads = [stubs.thread(), stubs.thread()]
    thread_id = threads[0].id
    for text in ("hello", "world"):
        out.append(
            stubs.runtime.AppendMessage(
                pb.AppendMessageRequest(
                    thread_id=thread_id, role=enum_pb2.MESSAGE_ROLE_USER, content=text
                ),
                timeout=T,
            )
        )
    # The first run created is the first acquired: it becomes the witness.
    runs = [stubs.run(thread_id, max_attempts=5) for _ in range(3)]
    acquired = _acquire(stubs, "w1")
    fence = acquired.fence
    assert acquired.run.id == runs[0].id, "the witness run was not the one acquired"
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=T)
    out += [acquired, turn]
    steps = _step(stubs, fence, turn.turn.id, "a.txt", 10)
    out += steps + _step(stubs, fence, turn.turn.id, "b.txt", 20)
    content = b"witness blob"
    blob = stubs.runtime.PutBlob(
        iter(
            [
                pb.PutBlobRequest(header=message_pb2.BlobHeader(size=len(content))),
                pb.PutBlobRequest(chunk=content),
            ]
        ),
        timeout=T,
    )
    assert blob.blob.digest == "sha256:" + hashlib.sha256(content).hexdigest()
    out.append(blob)
    out.append(
        stubs.worker.WriteCheckpoint(
            wpb.WriteCheckpointRequest(fence=fence, state_ref=blob.blob.digest), timeout=T
        )
    )
    step_id = steps[1].step.id
    for name in ("a.txt", "b.txt"):
        out.append(
            stubs.worker.CreateArtifact(
                wpb.CreateArtifactRequest(
                    fence=fence, step_id=step_id, name=name, blob_digest=blob.blob.digest
                ),
                timeout=T,
            )
        )
    # A second run whose first attempt failed and was retried: two attempts to list.
    retried = _acquire(stubs, "w2")
    out.append(retried)
    out.append(
        stubs.worker.FinishAttempt(
            wpb.FinishAttemptRequest(
                fence=retried.fence, outcome=enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE
            ),
            timeout=T,
        )
    )
    out.append(_acquire(stubs, "w2"))
    out.append(stubs.runtime.GetRun(pb.GetRunRequest(run_id=runs[0].id), timeout=T))
    # Two saved views, so ListViews pages too.
    for name, status in (
        ("queued", enum_pb2.RUN_STATUS_QUEUED),
        ("running", enum_pb2.RUN_STATUS_RUNNING),
    ):
        view = message_pb2.SavedView(name=name, query=message_pb2.RunsQuery(statuses=[status]))
        out.append(stubs.runtime.SaveView(pb.SaveViewRequest(view=view), timeout=T))
    out += threads + runs
    # Two attestations of agent_v8 (the first digest the pool files; the server signs them:
    # the fuzz server authenticates nobody), so ListAttestations pages.
    attested = second.agent_version.digest
    for passed in (True, False):
        statement = {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "coding_agent", "digest": {"sha256": attested[7:]}}],
            "predicateType": "https://agentrt.dev/eval/v1",
            "predicate": {"passed": passed},
        }
        out.append(
            stubs.registry.AttachAttestation(
                rpb.AttachAttestationRequest(
                    agent_id="coding_agent", digest=attested, statement=json.dumps(statement)
                ),
                timeout=T,
            )
        )
    return Witness(run_id=runs[0].id, fence=fence, turn_id=turn.turn.id, responses=out)


class Snapshots:
    """Row counts of every table and the witness run's VerifyRun answer."""

    def __init__(self, database_url: str, verify: Any) -> None:
        self._engine = sa.create_engine(normalise_url(database_url), pool_size=1)
        self._verify = verify  # (run_id) -> VerifyRunResponse bytes or an error code name
        tables = [t.name for t in metadata.sorted_tables]
        self._names = tables
        self._query = sa.text(
            "SELECT " + ", ".join(f'(SELECT count(*) FROM "{name}")' for name in tables)
        )

    def take(self, run_id: str) -> dict[str, Any]:
        with self._engine.connect() as conn:
            counts = conn.execute(self._query).one()
        state: dict[str, Any] = dict(zip(self._names, counts, strict=True))
        state["VerifyRun(witness)"] = self._verify(run_id)
        return state

    def close(self) -> None:
        self._engine.dispose()


def verify_run(stubs: Stubs, run_id: str) -> str:
    stub = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
    try:
        answer = stub.VerifyRun(apb.VerifyRunRequest(run_id=run_id), timeout=T)
    except grpc.RpcError as exc:  # the snapshot records what VerifyRun said, error or not
        return f"error {exc.code().name}"
    return f"intact={answer.intact} events={answer.event_count} head={answer.head_hash}"
