"""Verified CI provenance and tag policies (issue 16, items 3 and 4): a version published with
an OIDC token records the token's verified claims, one published with a static token only
its self-declared provenance; the recorded publisher and tag mover are the authenticated
principals, the names callers give are labels beside them; a tag policy refuses `prod` for
a version without matching verified provenance. Both engines."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentrt.registry.v1 import message_pb2, registry_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt_base.auth import token_entry
from runtime_service.cli.main import main as agentrt
from tests import registry_data as data
from tests.oidc import ISSUER, Issuer, issuer_config
from tests.support import ServerThread, error_details, serving

STATIC = "agentrt_release-manager-token-for-the-test"
POLICY = (
    '[[tag_policies]]\nname = "prod-from-main"\ntags = ["prod"]\n'
    'claims = { repository = "acme/agents", ref = "refs/heads/main" }\n'
)


@contextlib.contextmanager
def _serving(database_url: str, config: Path) -> Iterator[tuple[ServerThread, Any]]:
    with (
        serving(database_url, auth_config=str(config)) as thread,
        grpc.insecure_channel(thread.address) as channel,
    ):
        yield thread, registry_service_pb2_grpc.RegistryServiceStub(channel)


def _as(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def _config(tmp_path: Path, issuer: Issuer, policies: str = POLICY) -> Path:
    (tmp_path / "jwks.json").write_text(json.dumps(issuer.jwks()))
    config = tmp_path / "auth.toml"
    config.write_text(
        token_entry("release-manager", STATIC, ["admin"], ["*"], [])
        + issuer_config(jwks_file="jwks.json")
        + policies
    )
    return config


def _publish(stub: Any, token: str, label: str, **provenance: str) -> message_pb2.AgentVersion:
    response = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition(label),
            provenance=message_pb2.Provenance(**provenance),
        ),
        timeout=10,
        metadata=_as(token),
    )
    version: message_pb2.AgentVersion = response.agent_version
    return version


def _set_tag(stub: Any, token: str, tag: str, digest: str, actor: str = "") -> pb.SetTagResponse:
    response: pb.SetTagResponse = stub.SetTag(
        pb.SetTagRequest(agent_id="coding_agent", tag=tag, digest=digest, actor=actor),
        timeout=10,
        metadata=_as(token),
    )
    return response


def _refused_by_policy(stub: Any, token: str, tag: str, digest: str) -> list[Any]:
    with pytest.raises(grpc.RpcError) as refused:
        _set_tag(stub, token, tag, digest)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = error_details(refused.value)
    assert details["ErrorInfo"].reason == "TAG_POLICY"
    assert details["ErrorInfo"].metadata["tag"] == tag
    violations: list[Any] = list(details["PreconditionFailure"].violations)
    return [details["ErrorInfo"].metadata["policy"], *violations]


def test_publishing_with_an_oidc_token_records_verified_provenance_and_policies_hold(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    issuer = Issuer()
    config = _config(tmp_path, issuer)
    main_token, feature_token = issuer.token(), issuer.token(ref="refs/heads/feature")
    with _serving(database_url, config) as (thread, stub):
        for draft in data.coding_components():
            stub.PublishComponent(
                pb.PublishComponentRequest(component=draft), timeout=10, metadata=_as(STATIC)
            )
        # From CI, with the job's OIDC token; the name it gives is a label only.
        ci = _publish(stub, main_token, "agent_v1", publisher="someone-famous", commit="forged")
        assert ci.publish.principal == "acme/agents@refs/heads/main"
        verified = ci.publish.verified_provenance
        assert verified.verified
        assert (verified.issuer, verified.repository, verified.ref, verified.workflow) == (
            ISSUER,
            "acme/agents",
            "refs/heads/main",
            "publish",
        )
        assert verified.commit_sha == "0123456789abcdef0123456789abcdef01234567"
        assert verified.subject == "repo:acme/agents:ref:refs/heads/main"
        assert verified.claims["run_id"] == "4242"
        # The self-declared provenance stays, beside it.
        assert (ci.publish.provenance.publisher, ci.publish.provenance.commit) == (
            "someone-famous",
            "forged",
        )
        # Provenance is not content: the digest is what ComputeDigest gives for the definition.
        computed = stub.ComputeDigest(
            pb.ComputeDigestRequest(agent_definition=data.coding_definition("agent_v1")),
            timeout=10,
            metadata=_as(STATIC),
        )
        assert computed.digest == ci.digest

        # By hand, with a static token and a self-declared commit: unverified.
        manual = _publish(stub, STATIC, "agent_v2", publisher="alice", commit="abc123")
        assert manual.publish.principal == "release-manager"
        assert not manual.publish.verified_provenance.verified
        assert manual.publish.verified_provenance.claims == {}
        assert manual.publish.provenance.commit == "abc123"
        component = stub.GetComponent(
            pb.GetComponentRequest(ref="read_file@1"), timeout=10, metadata=_as(STATIC)
        ).component
        assert component.publish.principal == "release-manager"
        assert not component.publish.verified_provenance.verified

        # From CI, but another branch: verified, with that ref.
        feature = _publish(stub, feature_token, "agent_v3")
        assert feature.publish.verified_provenance.ref == "refs/heads/feature"

        # `prod` may only point at versions published from main of acme/agents.
        policy, violation = _refused_by_policy(stub, STATIC, "prod", manual.digest)
        assert policy == "prod-from-main"
        assert violation.type == "VERIFIED_PROVENANCE"
        assert violation.subject == f"coding_agent@{manual.digest}"
        policy, violation = _refused_by_policy(stub, main_token, "prod", feature.digest)
        assert (policy, violation.type) == ("prod-from-main", "CLAIM")
        assert "refs/heads/feature" in violation.description
        # Refused requests changed nothing.
        history = stub.ListTagHistory(
            pb.ListTagHistoryRequest(agent_id="coding_agent"), timeout=10, metadata=_as(STATIC)
        )
        assert list(history.events) == []

        moved = _set_tag(stub, STATIC, "prod", ci.digest, actor="the-ceo")
        assert (moved.event.actor, moved.event.actor_label) == ("release-manager", "the-ceo")
        assert (moved.tag.updated_by, moved.tag.updated_by_label) == ("release-manager", "the-ceo")
        # Tags no policy covers move as before.
        _set_tag(stub, main_token, "canary", manual.digest)
        stub.DeleteTag(
            pb.DeleteTagRequest(agent_id="coding_agent", tag="canary", actor="cleanup"),
            timeout=10,
            metadata=_as(STATIC),
        )
        history = stub.ListTagHistory(
            pb.ListTagHistoryRequest(agent_id="coding_agent"), timeout=10, metadata=_as(STATIC)
        )
        assert [(e.tag, e.actor, e.actor_label) for e in history.events] == [
            ("canary", "release-manager", "cleanup"),
            ("canary", "acme/agents@refs/heads/main", ""),
            ("prod", "release-manager", "the-ceo"),
        ]

        # Policies are read again with the file (SIGHUP): now release-* needs one too.
        config.write_text(
            config.read_text() + '[[tag_policies]]\nname = "releases"\ntags = ["release-*"]\n'
            'agents = ["coding_*"]\n'
        )
        assert thread.server.authenticator.reload()
        policy, violation = _refused_by_policy(stub, STATIC, "release-1", manual.digest)
        assert (policy, violation.type) == ("releases", "VERIFIED_PROVENANCE")
        _set_tag(stub, STATIC, "release-1", feature.digest)  # any verified ref will do

        # The command line shows principals and whether provenance is verified.
        address = f"127.0.0.1:{thread.server.port}"
        target = ["--target", address, "--token", STATIC]
        assert agentrt(["versions", "coding_agent", *target]) == 0
        rows = {line.split()[0]: line.split()[3:] for line in capsys.readouterr().out.splitlines()}
        assert rows["agent_v1"] == ["acme/agents@refs/heads/main", "verified", "prod"]
        assert rows["agent_v2"] == ["release-manager", "unverified", "-"]
        assert agentrt(["show", "coding_agent:prod", *target]) == 0
        shown = capsys.readouterr().out
        assert 'by acme/agents@refs/heads/main (says "someone-famous")' in shown
        assert "verified     yes: acme/agents, ref refs/heads/main" in shown
        assert agentrt(["tag-history", "coding_agent", "--tag", "prod", *target]) == 0
        assert 'by release-manager (says "the-ceo")' in capsys.readouterr().out
