"""Authentication by OIDC/JWT bearer tokens (issue 16, item 1): a token is verified against
its issuer's JWKS (a file, or a URL served here by a local HTTP server), its issuer,
audience and lifetime checked, and its claims mapped to a principal by rules. Keys, JWKS and
tokens are made in the test. Refused tokens answer UNAUTHENTICATED with ErrorInfo metadata
``cause``. Both engines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import runtime_service_pb2_grpc
from agentrt_base.auth import CALLER, AuthConfig, Principal
from agentrt_base.auth_gate import Authenticator
from tests.oidc import AUDIENCE, ISSUER, Issuer, JwksServer, issuer_config, unsigned
from tests.support import ServerThread, error_details, serving


@contextlib.contextmanager
def _serving(database_url: str, config: Path) -> Iterator[tuple[ServerThread, grpc.Channel]]:
    with (
        serving(database_url, auth_config=str(config)) as thread,
        grpc.insecure_channel(thread.address) as channel,
    ):
        yield thread, channel


def _call(channel: grpc.Channel, token: str | None) -> Any:
    stub = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    return stub.ListThreads(pb.ListThreadsRequest(), timeout=10, metadata=metadata)


def _refused(channel: grpc.Channel, token: str | None, cause: str | None) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _call(channel, token)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    info = error_details(refused.value)["ErrorInfo"]
    assert info.reason == "UNAUTHENTICATED"
    assert info.metadata.get("cause") == cause


def _write_jwks(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document))


def test_a_jwt_verified_against_a_jwks_file_serves_and_every_bad_token_is_refused(
    tmp_path: Path, database_url: str
) -> None:
    issuer = Issuer()
    _write_jwks(tmp_path / "jwks.json", issuer.jwks())
    config = tmp_path / "auth.toml"
    config.write_text(issuer_config(jwks_file="jwks.json"))  # relative to the config file
    stranger = Issuer()  # another key pair under the same kid
    other_issuer = Issuer("https://elsewhere.test")
    now = int(time.time())
    with _serving(database_url, config) as (_, channel):
        _call(channel, issuer.token())
        _refused(channel, None, None)
        _refused(channel, issuer.token(exp=now - 3600, iat=now - 7200, nbf=now - 7200), "expired")
        _refused(channel, issuer.token(aud="someone-else"), "audience")
        _refused(channel, other_issuer.token(), "unknown_issuer")
        _refused(channel, issuer.token(key=stranger.keys["k1"]), "signature")
        _refused(channel, issuer.token(kid="k9", key=stranger.keys["k1"]), "unknown_key")
        _refused(channel, issuer.token(nbf=now + 3600), "not_yet_valid")
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "iat": now, "exp": now + 60}
        _refused(channel, unsigned({"alg": "none", "kid": "k1"}, payload), "algorithm")
        # Algorithm confusion: an HMAC keyed with the (public) RSA key is never accepted.
        public_pem = (
            issuer.keys["k1"]
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _refused(channel, _hs256(payload, public_pem), "algorithm")
        # A verified token whose claims no rule admits (GitHub signs for every repository).
        _refused(channel, issuer.token(repository="mallory/agents"), "no_rule")
        _refused(channel, "not.a.jwt", "malformed")


def _hs256(payload: dict[str, Any], secret: bytes) -> str:
    import base64
    import hashlib
    import hmac

    def part(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).rstrip(b"=").decode()

    head = part(json.dumps({"alg": "HS256", "kid": "k1"}).encode())
    body = part(json.dumps(payload).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{part(mac)}"


def test_a_jwks_url_is_fetched_cached_and_fetched_again_for_a_new_key(
    tmp_path: Path, database_url: str
) -> None:
    issuer = Issuer()
    with JwksServer(issuer.jwks()) as jwks:
        config = tmp_path / "auth.toml"
        config.write_text(issuer_config(jwks_url=jwks.url, extra="jwks_refetch_seconds = 0"))
        with _serving(database_url, config) as (thread, channel):
            assert jwks.hits == 0  # fetched on first use, not at start
            _call(channel, issuer.token())
            _call(channel, issuer.token())
            assert jwks.hits == 1  # cached
            # The issuer rotates: a new key (an EC one) is published; a token signed with
            # it names a kid the cache lacks, and the JWKS is fetched again.
            issuer.add_key("k2", curve=True)
            jwks.document = issuer.jwks()
            _call(channel, issuer.token(kid="k2", algorithm="ES256"))
            assert jwks.hits == 2
            # An unknown kid after that: fetched again (refetch interval 0), still refused.
            _refused(channel, issuer.token(kid="k3", key=issuer.keys["k1"]), "unknown_key")
            assert jwks.hits == 3

            # With a refetch interval, made-up kids do not make the server hammer the issuer.
            config.write_text(issuer_config(jwks_url=jwks.url, extra="jwks_refetch_seconds = 3600"))
            assert thread.server.authenticator.reload()
            _call(channel, issuer.token(kid="k2", algorithm="ES256"))  # cache kept on reload
            for _ in range(3):
                _refused(channel, issuer.token(kid="k4", key=issuer.keys["k1"]), "unknown_key")
            assert jwks.hits == 3


def test_an_unreachable_jwks_is_unavailable_not_a_refusal(tmp_path: Path, sqlite_url: str) -> None:
    issuer = Issuer()
    with JwksServer(issuer.jwks()) as jwks:
        url = jwks.url
    config = tmp_path / "auth.toml"  # the server above is gone: nothing listens at url
    config.write_text(issuer_config(jwks_url=url))
    with _serving(sqlite_url, config) as (_, channel), pytest.raises(grpc.RpcError) as failed:
        _call(channel, issuer.token())
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details(failed.value)["ErrorInfo"].reason == "JWKS_UNAVAILABLE"


def _principal(authenticator: Authenticator, token: str) -> Principal:
    async def who() -> Principal:
        await authenticator.authenticate([("authorization", f"Bearer {token}")], None)
        principal = CALLER.get()
        assert principal is not None
        return principal

    return asyncio.run(who())


def test_claims_map_to_a_principal_roles_scopes_and_namespaces(tmp_path: Path) -> None:
    issuer = Issuer()
    _write_jwks(tmp_path / "jwks.json", issuer.jwks())
    rules = (
        '[[oidc.rules]]\nclaims = { repository = "acme/*" }\nroles = ["client"]\n'
        'namespaces = ["acme"]\n'
        '[[oidc.rules]]\nclaims = { repository = "acme/agents", ref = "refs/heads/main" }\n'
        'roles = ["publisher", "client"]\nscopes = ["coding_agent*"]\n'
    )
    config = tmp_path / "auth.toml"
    config.write_text(issuer_config(jwks_file="jwks.json", rules=rules))
    authenticator = Authenticator(str(config))

    main = _principal(authenticator, issuer.token())
    assert main.name == "acme/agents@refs/heads/main"
    assert main.method == "oidc"
    assert main.roles == ("client", "publisher")
    assert main.scopes == ("coding_agent*",)
    assert main.namespaces == ("acme",)
    claims = main.claim_map()
    assert claims["iss"] == ISSUER and claims["sha"] == "0123456789abcdef0123456789abcdef01234567"
    assert hash(main)  # immutable, hashable

    branch = _principal(authenticator, issuer.token(ref="refs/heads/feature"))
    assert (branch.name, branch.roles, branch.scopes) == (
        "acme/agents@refs/heads/feature",
        ("client",),
        (),
    )


def test_sighup_reload_picks_up_a_new_issuer(tmp_path: Path, database_url: str) -> None:
    first, second = Issuer(), Issuer("https://ci.example.test")
    _write_jwks(tmp_path / "first.json", first.jwks())
    _write_jwks(tmp_path / "second.json", second.jwks())
    config = tmp_path / "auth.toml"
    config.write_text(issuer_config(jwks_file="first.json"))
    with _serving(database_url, config) as (thread, channel):
        _call(channel, first.token())
        _refused(channel, second.token(), "unknown_issuer")
        config.write_text(
            issuer_config(jwks_file="first.json")
            + issuer_config(issuer=second.issuer, jwks_file="second.json", principal="{sub}")
        )
        assert thread.server.authenticator.reload()
        _call(channel, second.token())
        # A broken issuer table keeps the configuration in use.
        config.write_text(issuer_config(jwks_file="missing.json"))
        assert not thread.server.authenticator.reload()
        _call(channel, second.token())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ('algorithms = ["HS256"]', "not allowed"),
        ('algorithms = ["none"]', "not allowed"),
        ("url", "https://"),
        ("no rules", "rules"),
        ('principal = "{sub.__class__}"', None),
    ],
)
def test_issuer_tables_that_would_weaken_verification_do_not_load(
    tmp_path: Path, change: str, problem: str | None
) -> None:
    issuer = Issuer()
    _write_jwks(tmp_path / "jwks.json", issuer.jwks())
    config = tmp_path / "auth.toml"
    if change == "url":
        text = issuer_config(jwks_url="http://keys.example.com/jwks")
    elif change == "no rules":
        text = issuer_config(jwks_file="jwks.json", rules="# none")
    else:
        text = issuer_config(jwks_file="jwks.json", extra=change)
        if change.startswith("principal"):
            text = text.replace('principal = "{repository}@{ref}"\n', "")
    config.write_text(text)
    if problem is None:
        # A template field is a claim name only: "{sub.__class__}" is the claim of that
        # name, absent from every token, so the token is refused rather than evaluated.
        authenticator = Authenticator(str(config))
        with pytest.raises(Exception, match="missing"):
            _principal(authenticator, issuer.token())
        return
    with pytest.raises(ValueError, match=problem):
        AuthConfig.load(str(config))
