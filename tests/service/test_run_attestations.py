"""Run attestations (issue 31, item 3) through real gRPC on both engines, over the audit
suite's history: a run is signed when it ends, and that envelope is kept and served; it is a
DSSE envelope of an in-toto Statement v1 the published key verifies, whose subjects are the
run's record (by its chain head) and its artifacts, and whose predicate follows
docs/run-provenance.schema.json and says what the served records say."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.db_engines import normalise_url
from agentrt_core import dsse
from agentrt_core.signed_note import Verifier
from tests.runtime_support import Stubs
from tests.service.audit_history import History, build_history
from tests.support import ServerThread, error_details, rpc_error

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "run-provenance.schema.json").read_text()
)


@pytest.fixture(scope="module")
def world(shared_server: ServerThread) -> Iterator[tuple[Stubs, Any, History]]:
    with Stubs.open(shared_server.address) as stubs:
        audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
        yield stubs, audit, build_history(stubs)


def keys(stubs: Stubs) -> list[Verifier]:
    found = stubs.registry.GetSigningKeys(rpb.GetSigningKeysRequest(), timeout=10).keys
    return [Verifier.parse(k.verifier_key) for k in found]


def kept(database_url: str, run_id: str) -> str | None:
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT envelope FROM runtime_run_attestations WHERE run_id = :r"),
                {"r": run_id},
            ).scalar()
    finally:
        engine.dispose()


def test_a_run_is_attested_when_it_ends(
    world: tuple[Stubs, Any, History], shared_database_url: str
) -> None:
    _, audit, history = world
    deadline = time.monotonic() + 10
    while (stored := kept(shared_database_url, history.run_a)) is None:
        assert time.monotonic() < deadline, "the ended run was not attested"
        time.sleep(0.05)
    served = audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=history.run_a))
    assert served.final and served.envelope == stored
    again = audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=history.run_a))
    assert again.envelope == stored


def test_the_statement_says_what_produced_what(world: tuple[Stubs, Any, History]) -> None:
    stubs, audit, history = world
    envelope = json.loads(
        audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=history.run_a)).envelope
    )
    statement = dsse.statement(envelope, keys(stubs))
    assert statement["predicateType"] == "https://agentrt.dev/run-provenance/v1"
    predicate = statement["predicate"]
    jsonschema.Draft202012Validator(SCHEMA).validate(predicate)

    run = stubs.runtime.GetRun(pb.GetRunRequest(run_id=history.run_a), timeout=10).run
    verified = audit.VerifyRun(apb.VerifyRunRequest(run_id=history.run_a))
    assert verified.intact
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects[f"agentrt-run:{run.id}"] == verified.head_hash.removeprefix("sha256:")
    (artifact,) = stubs.runtime.ListArtifacts(
        pb.ListArtifactsRequest(run_id=run.id), timeout=10
    ).artifacts
    assert artifact.id == history.artifact
    assert subjects[f"artifact:{artifact.id}:{artifact.name}"] == history.blob.removeprefix(
        "sha256:"
    )
    assert predicate["agent"]["digest"] == run.agent.agent_digest == history.v7
    assert predicate["agent"]["tag"] == "prod"
    assert predicate["run"]["status"] == "COMPLETED"
    assert predicate["chain"]["head_hash"] == verified.head_hash
    steps = stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=run.id), timeout=10).steps
    assert [s["id"] for s in predicate["steps"]] == [s.id for s in steps]
    for recorded, served in zip(predicate["steps"], steps, strict=True):
        if served.versions.HasField("model"):
            assert recorded["model"]["requested"] == served.versions.model.requested_model_id
            assert recorded["model"]["reported"] == served.versions.model.reported_model_id
        assert [t["schema_digest"] for t in recorded["tools"]] == [
            t.schema_digest for t in served.versions.tools
        ]
    assert predicate["usage"]["input_tokens"] == run.usage.input_tokens


def test_a_changed_envelope_does_not_verify(world: tuple[Stubs, Any, History]) -> None:
    stubs, audit, history = world
    envelope = json.loads(
        audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=history.run_a)).envelope
    )
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["agent"]["digest"] = history.v8
    forged = dict(envelope, payload=base64.b64encode(json.dumps(statement).encode()).decode())
    with pytest.raises(dsse.EnvelopeError, match="does not verify"):
        dsse.statement(forged, keys(stubs))


def test_a_running_run_is_attested_as_it_stands(
    world: tuple[Stubs, Any, History], shared_database_url: str
) -> None:
    from tests.service.steps_support import acquire

    stubs, audit, _ = world
    stubs.run(stubs.thread().id)
    worker = acquire(stubs)
    now = audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=worker.run_id))
    assert not now.final
    statement = dsse.statement(json.loads(now.envelope), keys(stubs))
    assert statement["predicate"]["run"]["status"] == "RUNNING"
    assert kept(shared_database_url, worker.run_id) is None
    worker.complete()
    ended = audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=worker.run_id))
    assert ended.final
    final = dsse.statement(json.loads(ended.envelope), keys(stubs))
    assert final["predicate"]["run"]["status"] == "COMPLETED"
    assert kept(shared_database_url, worker.run_id) == ended.envelope


def test_refusals(world: tuple[Stubs, Any, History]) -> None:
    _, audit, _ = world
    error = rpc_error(audit.GetRunAttestation, apb.GetRunAttestationRequest(run_id="run_nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(audit.GetRunAttestation, apb.GetRunAttestationRequest())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error_details(error)["BadRequest"].field_violations] == ["run_id"]
