"""Inline system prompts are anonymous PROMPT components known by their digest alone: any
number of them can be published, through real gRPC on both engines, and publishing races
answer what a caller can act on (the idempotent answer or ALREADY_EXISTS), never INTERNAL."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from agentrt.registry.v1 import message_pb2, registry_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_base.db_engines import normalise_url
from agentrt_core import canonical
from tests import registry_data as data

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def inline_agent(agent_id: str, label: str, prompt: str) -> message_pb2.AgentDefinition:
    return message_pb2.AgentDefinition(
        agent_id=agent_id,
        version_label=label,
        system_prompt=message_pb2.SystemPrompt(text=prompt),
        model_policy="coding-balanced@3",
    )


def publish(stub: Any, definition: message_pb2.AgentDefinition) -> Any:
    return stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(definition=definition), timeout=30
    )


def anonymous_prompt_digest(text: str) -> str:
    return canonical.component_digest("PROMPT", "", "", "", {"text": text})


def test_two_agents_with_different_inline_prompts_both_publish(stub: Any) -> None:
    vector = json.loads((VECTORS / "agent_inline_prompt.json").read_text())
    prompt_vector = json.loads((VECTORS / "prompt_inline.json").read_text())
    policy = stub.PublishComponent(
        pb.PublishComponentRequest(component=data.model_policy()), timeout=10
    ).component

    # The vector's agent (its model policy is the test data's), published for real: the
    # stored prompt digest is the vector's, the agent digest what the digest spec computes.
    first = publish(stub, inline_agent("coding_agent", "1", prompt_vector["input"]["spec"]["text"]))
    assert first.created
    assert first.agent_version.closure.system_prompt.digest == prompt_vector["digest"]
    closure = dict(vector["input"]["closure"])
    closure["model_policy"] = {**closure["model_policy"], "digest": policy.digest}
    expected = canonical.agent_digest(
        "coding_agent", "1", "", canonical.AgentClosure.from_mapping(closure)
    )
    assert first.agent_version.digest == expected

    second = publish(stub, inline_agent("agent_b", "v1", "You are agent B."))
    assert second.created
    b_prompt = second.agent_version.closure.system_prompt
    assert b_prompt.digest == anonymous_prompt_digest("You are agent B.")
    assert (b_prompt.name, b_prompt.version, b_prompt.requested_ref) == ("", "", "")

    # A third, and one that shares the first one's prompt (the component is stored once).
    third = publish(stub, inline_agent("agent_c", "v1", "You are agent C."))
    shared = publish(stub, inline_agent("agent_d", "v1", prompt_vector["input"]["spec"]["text"]))
    assert third.created and shared.created
    assert shared.agent_version.closure.system_prompt.digest == prompt_vector["digest"]

    for response in (first, second, third, shared):
        version = response.agent_version
        got = stub.GetAgentVersion(pb.GetAgentVersionRequest(ref=version.digest)).agent_version
        assert got == version
        by_label = stub.GetAgentVersion(
            pb.GetAgentVersionRequest(
                ref=f"{version.definition.agent_id}@{version.definition.version_label}"
            )
        ).agent_version
        assert by_label.digest == version.digest
        prompt = stub.GetComponent(
            pb.GetComponentRequest(ref=version.closure.system_prompt.digest)
        ).component
        assert prompt.digest == version.closure.system_prompt.digest
        assert prompt.spec.prompt.text == version.definition.system_prompt.text

    # Re-publishing is idempotent, digests unchanged.
    for response in (first, second, third, shared):
        again = publish(stub, response.agent_version.definition)
        assert not again.created
        assert again.agent_version.digest == response.agent_version.digest

    # Anonymous prompts are not named components: listing shows only the named one.
    listed = stub.ListComponents(pb.ListComponentsRequest()).components
    assert [c.name for c in listed] == ["coding-balanced"]


def test_racing_publishes_answer_created_idempotent_or_already_exists(stub: Any) -> None:
    """Many publishes of one new agent at once: per label, the same content twice (one is
    created, the other idempotent) and different content once (one of them wins, the other
    answers ALREADY_EXISTS), with new inline prompts, one per label and one shared by all."""
    data.publish_all(stub, [data.model_policy()])
    own = [inline_agent("racer", f"v{i}", f"You are racer {i}.") for i in range(4)]
    shared = [inline_agent("racer", f"v{i}", "You are any racer.") for i in range(4)]
    jobs = own + own + shared
    codes: list[grpc.StatusCode] = []
    created: list[Any] = []
    answered: dict[str, set[str]] = {}
    start = threading.Barrier(len(jobs))

    def run(definition: message_pb2.AgentDefinition) -> None:
        start.wait()
        try:
            response = publish(stub, definition)
        except grpc.RpcError as error:
            codes.append(error.code())
        else:
            codes.append(grpc.StatusCode.OK)
            version = response.agent_version
            answered.setdefault(version.definition.version_label, set()).add(version.digest)
            if response.created:
                created.append(response.agent_version)

    threads = [threading.Thread(target=run, args=(d,)) for d in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS}, codes
    labels = sorted(v.definition.version_label for v in created)
    assert labels == ["v0", "v1", "v2", "v3"]
    assert all(len(digests) == 1 for digests in answered.values()), answered
    listed = stub.ListAgentVersions(pb.ListAgentVersionsRequest(agent_id="racer")).agent_versions
    assert sorted(v.digest for v in listed) == sorted(v.digest for v in created)


@pytest.mark.postgres
def test_publish_that_meets_two_concurrent_winners_still_answers(
    postgres_session_url: str, tmp_path: Path
) -> None:
    """On PostgreSQL a publish can lose a unique-key race more than once (a new agent row,
    then a new inline prompt, each inserted first by someone else). Held open here by two
    transactions of the test's own, committed one after the other while the publish waits:
    the publish must still answer, not INTERNAL after its second lost race."""
    from tests.conftest import _truncate
    from tests.support import running_server

    url = postgres_session_url
    prompt = "You are shared."
    engine = sa.create_engine(normalise_url(url))
    try:
        with running_server(url) as address, grpc.insecure_channel(address) as channel:
            stub = registry_service_pb2_grpc.RegistryServiceStub(channel)
            data.publish_all(stub, [data.model_policy()])
            first = engine.connect()
            second = engine.connect()
            holders = _rows_holding_keys(first, second, "contested", prompt)
            result: dict[str, Any] = {}

            def run() -> None:
                try:
                    result["ok"] = publish(stub, inline_agent("contested", "v2", prompt))
                except grpc.RpcError as error:
                    result["error"] = error

            publisher = threading.Thread(target=run)
            publisher.start()
            for holder in holders:
                _wait_for_lock_waiter(engine)
                holder.commit()
            publisher.join(30)
            first.close()
            second.close()
            assert "error" not in result, result["error"]
            version = result["ok"].agent_version
            assert result["ok"].created
            assert version.closure.system_prompt.digest == anonymous_prompt_digest(prompt)
    finally:
        engine.dispose()
        _truncate(url)


def _rows_holding_keys(
    first: sa.Connection, second: sa.Connection, agent_id: str, prompt: str
) -> list[sa.Connection]:
    """Insert (uncommitted) the agent row and the inline prompt a publish of ``agent_id``
    will insert, on two connections, in the order the publish inserts them."""
    from agentrt_core.publishing import digest_inline_prompt
    from registry import store

    now = sa.func.now()
    agent = sa.insert(store.AgentRow).values(
        agent_id=agent_id, create_time=now, last_tag_sequence=0
    )
    digested = digest_inline_prompt(prompt)
    component = sa.insert(store.ComponentRow).values(
        digest=digested.digest,
        kind="PROMPT",
        name="",
        version="",
        anonymous=True,
        description="",
        spec_json=store.dumps(digested.spec),
        schema_digest=None,
        publish_time=now,
        provenance_json="{}",
    )
    first.execute(agent)
    second.execute(component)
    return [first, second]


def _wait_for_lock_waiter(engine: sa.Engine) -> None:
    """Block until some backend waits on a row lock (the publish, behind a holder)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).scalar()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the publish never waited on the held keys")
