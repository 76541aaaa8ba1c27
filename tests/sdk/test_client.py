"""The client SDK against a real server: typed wrappers, typed errors from the google.rpc
details, retries that keep their request id, and a watch that survives a server restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_sdk import (
    AgentrtClient,
    AlreadyExistsError,
    Client,
    InvalidArgumentError,
    NotFoundError,
    RetryPolicy,
    UnavailableError,
)
from agentrt_sdk.transport import repeatable
from tests.support import ServerThread, free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.yaml"


def test_publish_thread_run_and_lists(server_address: str) -> None:
    with Client(server_address) as client:
        published = client.registry.publish(EXAMPLE, tag="prod")
        assert published.created and published.agent_version.version_label == "agent_v7"
        assert next(c.name for c, _ in published.components) == "repo-debug"
        again = client.registry.publish(EXAMPLE)
        assert not again.created
        assert again.agent_version.digest == published.agent_version.digest
        assert client.registry.get("coding_agent:prod").digest == published.agent_version.digest
        assert [t.name for t in client.registry.tags("coding_agent")] == ["prod"]

        thread = client.threads.create("login returns 500")
        client.threads.append_message(thread.id, "POST /login answers 500 since the deploy")
        run = client.runs.create(
            thread.id, "coding_agent:prod", "fix the login failure", priority=3
        )
        assert run.agent.agent_digest == published.agent_version.digest
        assert run.agent.resolved_via_tag == "prod"
        assert client.runs.get(run.id).id == run.id
        assert [r.id for r in client.runs.list(thread_id=thread.id)] == [run.id]
        assert [m.content for m in client.threads.messages(thread.id)] == [
            "POST /login answers 500 since the deploy"
        ]
        steer = client.runs.steer(run.id, "keep legacy tokens working", sender="alice")
        assert steer.kind == enum_pb2.INPUT_KIND_STEER
        assert steer.sender == "alice"
        cancelled = client.runs.cancel(run.id, "not needed", actor="alice")
        assert cancelled.status == enum_pb2.RUN_STATUS_CANCELLED
        received = [e for e in client.watch_run(run.id) if e.HasField("input_received_attributes")]
        assert received[0].input_received_attributes.sender == "alice"


def test_errors_are_typed_from_the_status_details(server_address: str, tmp_path: Path) -> None:
    with Client(server_address) as client:
        with pytest.raises(NotFoundError) as missing:
            client.runs.get("run_00000000000000000000000000")
        assert missing.value.code is grpc.StatusCode.NOT_FOUND
        assert missing.value.resource_type

        with pytest.raises(InvalidArgumentError) as bad:
            client.runs.create("", "coding_agent:prod", "x")
        assert "thread_id" in [v.field for v in bad.value.field_violations]
        assert bad.value.reason == "INVALID_ARGUMENT"

        first = client.registry.publish(EXAMPLE)
        changed = tmp_path / "changed.yaml"
        changed.write_text(
            EXAMPLE.read_text().replace("You are a careful coding agent", "You are an agent")
        )
        with pytest.raises(AlreadyExistsError) as exists:
            client.registry.publish(changed)
        assert exists.value.existing_digest == first.agent_version.digest


def test_keyless_requests_get_one_request_id_for_every_try() -> None:
    request = pb.CreateThreadRequest(title="t")
    assert repeatable("CreateThread", request)
    key = request.request_id
    assert key
    assert repeatable("CreateThread", request) and request.request_id == key
    # Acquiring twice would start two attempts: never retried on its own.
    assert not repeatable("AcquireRun", pb.GetRunRequest())
    assert repeatable("GetRun", pb.GetRunRequest())


class _Flaky:
    """A RuntimeService whose CreateThread answers UNAVAILABLE twice, then OK."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []

    async def create_thread(
        self, request: pb.CreateThreadRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateThreadResponse:
        self.request_ids.append(request.request_id)
        if len(self.request_ids) < 3:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        response = pb.CreateThreadResponse()
        response.thread.id = "thr_flaky"
        return response


async def _flaky_server(flaky: _Flaky) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "agentrt.runtime.v1.RuntimeService",
        {
            "CreateThread": grpc.unary_unary_rpc_method_handler(
                flaky.create_thread,
                request_deserializer=pb.CreateThreadRequest.FromString,
                response_serializer=pb.CreateThreadResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_unavailable_is_retried_with_the_same_request_id() -> None:
    async def scenario() -> None:
        flaky = _Flaky()
        server, address = await _flaky_server(flaky)
        try:
            fast = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)
            async with AgentrtClient(address, retry=fast) as client:
                thread = await client.threads.create("t")
            assert thread.id == "thr_flaky"
            assert len(flaky.request_ids) == 3 and len(set(flaky.request_ids)) == 1
            assert flaky.request_ids[0]

            flaky.request_ids.clear()
            once = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02)
            async with AgentrtClient(address, retry=once) as client:
                with pytest.raises(UnavailableError):
                    await client.threads.create("t")
            assert len(flaky.request_ids) == 2
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_watch_resumes_across_a_server_restart_without_gaps_or_repeats(
    database_url: str,
) -> None:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    first = ServerThread(database_url, listen=listen)
    address = first.start()

    async def scenario() -> list[int]:
        nonlocal first
        fast = RetryPolicy(attempts=50, initial_backoff=0.05, max_backoff=0.2)
        async with AgentrtClient(address, retry=fast) as client:
            await client.registry.publish(EXAMPLE, tag="prod")
            thread = await client.threads.create("watch")
            run = await client.runs.create(thread.id, "coding_agent:prod", "watch me")
            seen: list[int] = []
            events = client.watch_run(run.id)
            async for event in events:
                seen.append(event.sequence)
                if len(seen) == 1:
                    # The server goes away under the stream and comes back on the same port;
                    # meanwhile the run gets new events.
                    await asyncio.to_thread(first.stop)
                    first = ServerThread(database_url, listen=listen)
                    await asyncio.to_thread(first.start)
                    await client.runs.steer(run.id, "one")
                    await client.runs.cancel(run.id, "done")
            return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        first.stop()
    assert seen == list(range(1, len(seen) + 1))
    assert len(seen) >= 3  # created, the steer, the cancellation and the end


def test_blobs_round_trip_in_chunks_and_audit_calls(server_address: str) -> None:
    import hashlib

    content = bytes(range(256)) * 10_000  # 2.5 MB: three chunks
    with Client(server_address) as client:
        blob = client.blobs.put(content, media_type="application/octet-stream")
        assert blob.digest == "sha256:" + hashlib.sha256(content).hexdigest()
        assert blob.size == len(content)
        again = client.blobs.put(content)
        assert again.digest == blob.digest
        got, data = client.blobs.get(blob.digest)
        assert data == content and got.size == len(content)
        with pytest.raises(NotFoundError):
            client.blobs.get("sha256:" + "0" * 64)

        published = client.registry.publish(EXAMPLE, tag="prod")
        thread = client.threads.create("audit me")
        run = client.runs.create(thread.id, "coding_agent:prod", "be audited")
        client.runs.cancel(run.id, "enough")
        assert client.audit.verify(run.id).intact
        info, bundle = client.audit.export_bundle(run.id)
        assert info.digest == "sha256:" + hashlib.sha256(bundle).hexdigest()
        assert info.size == len(bundle)
        (record,) = client.audit.provenance(run_id=run.id).records
        assert record.agent_version.digest == published.agent_version.digest
        usages = client.audit.find_usages(agent_digest=published.agent_version.digest)
        assert run.id in {u.run_id for u in usages}
        with pytest.raises(ValueError):
            client.audit.provenance()
