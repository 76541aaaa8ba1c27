"""Attestations on agent versions, required by tag policies (issue 31, item 4), through real
gRPC on both engines: an evaluator attaches a DSSE-signed in-toto statement with a key the
auth config trusts for it, or, with an OIDC token, has the server sign it (recording the
verified claims); each attachment is a registry-log entry; a tag policy requiring a passing
evaluation by that evaluator refuses the tag until one is attached, naming what is missing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt_base.auth import token_entry
from agentrt_core import dsse
from agentrt_core.jcs import canonical_bytes
from agentrt_core.log_entries import ATTESTATION
from agentrt_core.signed_note import Signer
from tests import registry_data as data
from tests.log_support import proven, trusted
from tests.oidc import Issuer, issuer_config
from tests.support import error_details, rpc_error, serving

ADMIN, EVAL, CI = "agentrt_admin-token-for-the-test", "agentrt_eval-bot-token", "agentrt_ci-token"
EVAL_V1 = "https://agentrt.dev/eval/v1"
EVALUATOR = Signer("eval.example", Ed25519PrivateKey.generate())
POLICY = f"""
[[tag_policies]]
name = "prod-passes-eval"
tags = ["prod"]
[[tag_policies.attestations]]
predicate_type = "{EVAL_V1}"
signer = "eval-bot"
condition = "score >= 0.9"
"""


def _as(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[tuple[Any, Issuer]]:
    issuer = Issuer()
    (tmp_path / "jwks.json").write_text(json.dumps(issuer.jwks()))
    config = tmp_path / "auth.toml"
    config.write_text(
        token_entry("admin", ADMIN, ["admin"], ["*"], [])
        + token_entry("eval-bot", EVAL, ["publisher"], ["*"], [])
        + f"attestation_keys = [{json.dumps(EVALUATOR.verifier.encode())}]\n"
        + token_entry("ci", CI, ["publisher"], ["*"], [])
        + issuer_config(jwks_file="jwks.json")
        + POLICY
    )
    with (
        serving(database_url, auth_config=str(config)) as thread,
        grpc.insecure_channel(thread.address) as channel,
    ):
        stub = registry_service_pb2_grpc.RegistryServiceStub(channel)
        for draft in data.coding_components():
            stub.PublishComponent(
                pb.PublishComponentRequest(component=draft), timeout=10, metadata=_as(ADMIN)
            )
        yield stub, issuer


def statement(digest: str, **predicate: Any) -> dict[str, Any]:
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "coding_agent", "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": EVAL_V1,
        "predicate": predicate,
    }


def envelope(document: dict[str, Any], signer: Signer = EVALUATOR) -> str:
    return json.dumps(dsse.sign(canonical_bytes(document), signer))


def publish(stub: Any, label: str) -> str:
    return str(
        stub.PublishAgentVersion(
            pb.PublishAgentVersionRequest(definition=data.coding_definition(label)),
            timeout=10,
            metadata=_as(ADMIN),
        ).agent_version.digest
    )


def attach(stub: Any, token: str, digest: str, **content: str) -> pb.AttachAttestationResponse:
    response: pb.AttachAttestationResponse = stub.AttachAttestation(
        pb.AttachAttestationRequest(agent_id="coding_agent", digest=digest, **content),
        timeout=10,
        metadata=_as(token),
    )
    return response


def set_prod(stub: Any, digest: str) -> Any:
    return stub.SetTag(
        pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=digest),
        timeout=10,
        metadata=_as(ADMIN),
    )


def refused(stub: Any, digest: str) -> list[str]:
    with pytest.raises(grpc.RpcError) as info:
        set_prod(stub, digest)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = error_details(info.value)
    assert details["ErrorInfo"].reason == "TAG_POLICY"
    assert details["ErrorInfo"].metadata["policy"] == "prod-passes-eval"
    return [f"{v.type}: {v.description}" for v in details["PreconditionFailure"].violations]


def test_a_tag_policy_waits_for_a_passing_evaluation(world: tuple[Any, Issuer]) -> None:
    stub, _ = world
    keys = [*trusted_as(stub, ADMIN)]
    digest = publish(stub, "agent_v1")
    expected = (
        f"ATTESTATION: missing an attestation of type {EVAL_V1!r} by 'eval-bot' with score >= 0.9"
    )
    assert refused(stub, digest) == [expected]

    failing = attach(stub, EVAL, digest, envelope=envelope(statement(digest, score=0.5)))
    assert failing.created and failing.attestation.principal == "eval-bot"
    assert failing.attestation.key_id == EVALUATOR.verifier.key_id
    entry = proven(failing.log_inclusion, keys)
    assert entry.leaf.type == ATTESTATION and entry.leaf.fields["digest"] == digest
    assert refused(stub, digest) == [expected]

    passing_envelope = envelope(statement(digest, score=0.95, suite="swe-bench-lite"))
    passing = attach(stub, EVAL, digest, envelope=passing_envelope)
    again = attach(stub, EVAL, digest, envelope=passing_envelope)
    assert not again.created and again.attestation.id == passing.attestation.id
    assert again.log_inclusion.entry.index == passing.log_inclusion.entry.index
    assert set_prod(stub, digest).tag.digest == digest

    listed = stub.ListAttestations(
        pb.ListAttestationsRequest(digest=digest, page_size=1), timeout=10, metadata=_as(CI)
    )
    assert [a.id for a in listed.attestations] == [failing.attestation.id]
    rest = stub.ListAttestations(
        pb.ListAttestationsRequest(digest=digest, page_token=listed.next_page_token),
        timeout=10,
        metadata=_as(CI),
    )
    assert [a.id for a in rest.attestations] == [passing.attestation.id]
    assert json.loads(rest.attestations[0].envelope) == json.loads(passing_envelope)


def trusted_as(stub: Any, token: str) -> list[Any]:
    class Authed:
        def GetSigningKeys(self, request: Any, timeout: float) -> Any:
            return stub.GetSigningKeys(request, timeout=timeout, metadata=_as(token))

    return trusted(Authed())


def test_the_server_signs_for_an_oidc_caller_only(world: tuple[Any, Issuer]) -> None:
    stub, issuer = world
    digest = publish(stub, "agent_v2")
    document = json.dumps(statement(digest, score=0.99))
    error = rpc_error(attach, stub, CI, digest, statement=document)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_details(error)["ErrorInfo"].reason == "ATTESTATION_UNTRUSTED"

    signed = attach(stub, issuer.token(), digest, statement=document)
    server_key = trusted_as(stub, ADMIN)
    assert signed.attestation.key_id == server_key[0].key_id
    assert signed.attestation.verified.repository == "acme/agents"
    assert dsse.statement(json.loads(signed.attestation.envelope), server_key)["predicate"] == {
        "score": 0.99
    }
    # Attested by the CI job, not by eval-bot: the policy still refuses.
    assert len(refused(stub, digest)) == 1


def test_refusals_name_what_is_wrong(world: tuple[Any, Issuer]) -> None:
    stub, _ = world
    digest = publish(stub, "agent_v3")
    stranger = Signer("eval.example", Ed25519PrivateKey.generate())
    cases: list[tuple[dict[str, str], grpc.StatusCode, str]] = [
        (
            {"envelope": envelope(statement(digest), stranger)},
            grpc.StatusCode.PERMISSION_DENIED,
            "",
        ),
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "content"),
        ({"envelope": "not json"}, grpc.StatusCode.INVALID_ARGUMENT, "envelope"),
        (
            {"envelope": envelope(statement("sha256:" + "0" * 64))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "statement",
        ),
        (
            {"envelope": envelope({**statement(digest), "predicate": "yes"})},
            grpc.StatusCode.INVALID_ARGUMENT,
            "statement",
        ),
    ]
    for content, code, field in cases:
        error = rpc_error(attach, stub, EVAL, digest, **content)
        assert error.code() == code, (content, error.details())
        if field:
            violations = error_details(error)["BadRequest"].field_violations
            assert [v.field for v in violations] == [field]
    error = rpc_error(
        stub.AttachAttestation,
        pb.AttachAttestationRequest(
            agent_id="other_agent", digest=digest, envelope=envelope(statement(digest))
        ),
        timeout=10,
        metadata=_as(EVAL),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(
        stub.ListAttestations,
        pb.ListAttestationsRequest(digest="sha256:" + "1" * 64),
        timeout=10,
        metadata=_as(CI),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_the_auth_config_refuses_a_bad_condition(tmp_path: Path) -> None:
    from agentrt_base.auth import AuthConfig

    config = tmp_path / "auth.toml"
    config.write_text(POLICY.replace("score >= 0.9", "score >= high"))
    with pytest.raises(ValueError, match="is not a JSON value"):
        AuthConfig.load(str(config))
    config.write_text(POLICY.replace('"score >= 0.9"', "'score >= \"x\"'"))
    with pytest.raises(ValueError, match="compares numbers only"):
        AuthConfig.load(str(config))
