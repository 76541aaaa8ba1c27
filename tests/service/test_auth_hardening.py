"""What an outside attack run found in authentication (issue 25, items 3-5 in part), each
refused now: a malformed or unknown bearer token beside an admitted client certificate, a
JWT whose dates are not numbers, a reload that would lock everybody out, bearer tokens over
plaintext beyond loopback, and a tag spelled in capitals to slip past a policy. The
authenticator is driven directly where the rule is its own (no server needed); the rest
through a real server."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.auth import CALLER, AuthConfig, Principal, token_hash
from agentrt_base.auth_gate import Authenticator
from agentrt_base.limits import Kind as LimitKind
from agentrt_base.limits import Limiter
from agentrt_base.settings import ServerSettings
from agentrt_core.errors import Unauthenticated
from runtime_service.cli.main import main as agentrt
from runtime_service.listening import StartupError
from runtime_service.server import AgentrtServer
from tests import registry_data as data
from tests.oidc import Issuer, issuer_config
from tests.runtime_support import Stubs
from tests.support import error_details, rpc_error, serving

TOKEN = "agentrt_" + "a" * 43
SAN = "spiffe://agentrt.test/worker-1"


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    return str(path)


def _token_entry(name: str, token: str, role: str) -> str:
    return f'[[tokens]]\nprincipal = "{name}"\nhash = "{token_hash(token)}"\nroles = ["{role}"]\n'


CERT_ENTRY = f'[[certificates]]\nsan = "{SAN}"\nprincipal = "worker-1"\nroles = ["worker"]\n'
CERT_CONTEXT = {"x509_subject_alternative_name": [SAN.encode()]}


def _authenticate(
    authenticator: Authenticator, metadata: list[tuple[str, Any]], context: Any = None
) -> Principal:
    async def who() -> Principal:
        await authenticator.authenticate(metadata, context)
        principal = CALLER.get()
        assert principal is not None
        return principal

    return asyncio.run(who())


def _cause(authenticator: Authenticator, metadata: list[tuple[str, Any]], context: Any) -> str:
    with pytest.raises(Unauthenticated) as refused:
        _authenticate(authenticator, metadata, context)
    assert TOKEN not in str(refused.value)  # a refusal never echoes the credential
    return refused.value.metadata.get("cause", "")


def test_a_presented_credential_is_judged_even_beside_an_admitted_certificate(
    tmp_path: Path,
) -> None:
    authenticator = Authenticator(
        _config(tmp_path, _token_entry("client-a", TOKEN, "client") + CERT_ENTRY)
    )
    assert _authenticate(authenticator, [], CERT_CONTEXT).name == "worker-1"
    # A valid token beside the certificate: the token is the credential judged.
    bearer = [("authorization", f"Bearer {TOKEN}")]
    assert _authenticate(authenticator, bearer, CERT_CONTEXT).name == "client-a"
    # An unknown token is not ignored in favour of the certificate.
    unknown = [("authorization", "Bearer agentrt_guessed")]
    assert _cause(authenticator, unknown, CERT_CONTEXT) == "unknown_token"


@pytest.mark.parametrize(
    "value",
    [
        f"Bearer {TOKEN}\r\n",
        f"Bearer {TOKEN}\n",
        f"Bearer {TOKEN} ",
        f"Bearer  {TOKEN}",
        f"Bearer {TOKEN}\x7f",
        f"Bearer {TOKEN[:20]} {TOKEN[20:]}",
        f"Basic {TOKEN}",
        f"{TOKEN}",
        "Bearer ",
        (f"Bearer {TOKEN}").encode() + b"\x7f\xff",  # grpcio hands undecodable values as bytes
    ],
)
def test_a_malformed_authorization_is_refused_not_repaired(tmp_path: Path, value: Any) -> None:
    authenticator = Authenticator(
        _config(tmp_path, _token_entry("client-a", TOKEN, "client") + CERT_ENTRY)
    )
    assert _cause(authenticator, [("authorization", value)], CERT_CONTEXT) == "malformed"


def test_two_authorization_values_are_refused(tmp_path: Path) -> None:
    authenticator = Authenticator(_config(tmp_path, _token_entry("client-a", TOKEN, "client")))
    twice = [("authorization", f"Bearer {TOKEN}")] * 2
    assert _cause(authenticator, twice, None) == "malformed"


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
def test_a_jwt_date_that_is_not_a_number_is_refused(tmp_path: Path, claim: str) -> None:
    issuer = Issuer()
    (tmp_path / "jwks.json").write_text(json.dumps(issuer.jwks()))
    authenticator = Authenticator(_config(tmp_path, issuer_config(jwks_file="jwks.json")))
    good = issuer.token()
    assert _authenticate(authenticator, [("authorization", f"Bearer {good}")]).method == "oidc"
    # RFC 7519 §2: NumericDate is a JSON number; PyJWT alone would take the digit string.
    texts = {"exp": "9999999999", "iat": "1000000000", "nbf": "1000000000"}
    bad = issuer.token(**{claim: texts[claim]})
    assert _cause(authenticator, [("authorization", f"Bearer {bad}")], None) == "malformed"
    # Nor is a boolean, NaN or Infinity (no JSON numbers, RFC 8259 §6, though Python's JSON
    # reader takes the last two; PyJWT then said "invalid", not what is wrong).
    for value in (True, float("inf"), float("-inf"), float("nan")):
        odd = issuer.token(**{claim: value})
        assert _cause(authenticator, [("authorization", f"Bearer {odd}")], None) == "malformed"


def test_a_reload_that_would_lock_everybody_out_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    admin = "agentrt_" + "b" * 43
    path = _config(
        tmp_path, _token_entry("root", admin, "admin") + _token_entry("client-a", TOKEN, "client")
    )
    authenticator = Authenticator(path)
    as_admin = [("authorization", f"Bearer {admin}")]
    for locked_out in (
        "",  # emptied
        "# truncated\n",
        '[[tag_policies]]\nname = "p"\ntags = ["prod"]\n',  # no principal at all
        _token_entry("client-a", TOKEN, "client"),  # the last admin removed
    ):
        Path(path).write_text(locked_out)
        with caplog.at_level(logging.ERROR, logger="agentrt.auth"):
            assert not authenticator.reload()
        assert "keeping the one in use" in caplog.text
        caplog.clear()
        assert _authenticate(authenticator, as_admin).name == "root"
    # A file that keeps an admin is taken; the revoked client is then refused.
    Path(path).write_text(_token_entry("root", admin, "admin"))
    assert authenticator.reload()
    assert _cause(authenticator, [("authorization", f"Bearer {TOKEN}")], None) == "unknown_token"
    # Without an admin in the file in use, a file that admits somebody is taken.
    Path(path).write_text(_token_entry("client-a", TOKEN, "client"))
    other = Authenticator(path)
    Path(path).write_text(_token_entry("client-b", admin, "client"))
    assert other.reload()
    # The first start takes any file that loads (the operator's choice; nothing to lock out).
    Path(path).write_text("")
    assert Authenticator(path).configured


def test_bearer_tokens_are_not_sent_over_plaintext_beyond_loopback(
    tmp_path: Path,
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(tmp_path, _token_entry("client-a", TOKEN, "client"))
    server = AgentrtServer(
        ServerSettings(listen="0.0.0.0:0", database_url=sqlite_url, auth_config=config)
    )
    with pytest.raises(StartupError, match="in clear"):
        asyncio.run(server.start())
    # The command says so in one line and cannot start (exit 3, as for every refused start).
    serve = ["serve", "--listen", "0.0.0.0:0", "--database-url", sqlite_url]
    assert agentrt([*serve, "--auth-config", config]) == 3
    refusal = capsys.readouterr().err
    assert refusal.count("\n") == 1 and "in clear" in refusal and "--insecure" in refusal
    # --insecure accepts the risk, and the server says it at WARNING, not INFO.
    with (
        caplog.at_level(logging.INFO, logger="agentrt.server"),
        serving(sqlite_url, listen="0.0.0.0:0", auth_config=config, insecure=True),
    ):
        pass
    said = [r for r in caplog.records if "listening on" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert "bearer tokens cross the network in clear" in said[0].getMessage()


class _Authorized(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._metadata = [("authorization", f"Bearer {token}")]

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(details._replace(metadata=self._metadata), request)


@pytest.fixture
def registry_stub_with_policy(tmp_path: Path, database_url: str) -> Iterator[tuple[Any, str]]:
    """An admin's registry stub on a server whose policy covers ``prod``, and the digest of
    a published coding_agent version (published without verified provenance)."""
    config = _config(
        tmp_path,
        _token_entry("root", TOKEN, "admin")
        + '[[tag_policies]]\nname = "prod-from-main"\ntags = ["prod"]\n'
        + 'claims = { ref = "refs/heads/main" }\n',
    )
    with serving(database_url, auth_config=config) as thread:
        channel = grpc.intercept_channel(
            grpc.insecure_channel(f"127.0.0.1:{thread.server.port}"), _Authorized(TOKEN)
        )
        with channel:
            stub = registry_service_pb2_grpc.RegistryServiceStub(channel)
            data.publish_all(stub, data.coding_components())
            version = stub.PublishAgentVersion(
                rpb.PublishAgentVersionRequest(definition=data.coding_definition()), timeout=10
            )
            yield stub, version.agent_version.digest


def test_tags_are_set_in_lower_case_so_a_policy_covers_every_spelling(
    tmp_path: Path, registry_stub_with_policy: tuple[Any, str]
) -> None:
    stub, digest = registry_stub_with_policy
    refused = rpc_error(
        stub.SetTag, rpb.SetTagRequest(agent_id="coding_agent", tag="PROD", digest=digest)
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = error_details(refused)["BadRequest"].field_violations
    assert [v.field for v in violations] == ["tag"]
    assert stub.ListTags(rpb.ListTagsRequest(agent_id="coding_agent")).tags == []
    # The lower-case spelling meets the policy (no verified provenance: refused by it).
    policy = rpc_error(
        stub.SetTag, rpb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=digest)
    )
    assert policy.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_details(policy)["ErrorInfo"].reason == "TAG_POLICY"
    # A policy pattern in capitals would protect nothing: the file does not load.
    path = _config(tmp_path, '[[tag_policies]]\nname = "p"\ntags = ["PROD"]\n')
    with pytest.raises(ValueError, match="lower case"):
        AuthConfig.load(path)


def _read(stream: Any) -> Any:
    return next(stream)


def _ended_with(stream: Any) -> grpc.StatusCode:
    """How a stream ends: reading it on raises the status it ended with (its deadline
    bounds the wait: a stream that goes on fails the test with DEADLINE_EXCEEDED)."""
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    return ended.value.code()


def _holding_long_polls(limiter: Limiter, *principals: str) -> None:
    """Wait (bounded) until each principal's long poll is in the server: a future only says
    the call was sent."""
    deadline = time.monotonic() + 10
    while any(limiter.held(LimitKind.LONG_POLL, p) == 0 for p in principals):
        assert time.monotonic() < deadline, "the long polls never reached the server"
        time.sleep(0.01)


def test_a_revoked_principal_loses_its_streams_and_long_polls(
    tmp_path: Path, database_url: str
) -> None:
    tokens = {name: f"agentrt_{name}_" + "x" * 36 for name in ("root", "a", "b", "c", "w", "v")}
    entries = {
        "root": _token_entry("root", tokens["root"], "admin"),
        "a": _token_entry("client-a", tokens["a"], "client") + 'namespaces = ["team-a"]\n',
        "b": _token_entry("client-b", tokens["b"], "client") + 'namespaces = ["team-a"]\n',
        "c": _token_entry("client-c", tokens["c"], "client") + 'namespaces = ["team-a"]\n',
        "w": _token_entry("worker", tokens["w"], "worker")
        + 'namespaces = ["team-z"]\nscopes = ["*"]\n',
        "v": _token_entry("worker-v", tokens["v"], "worker")
        + 'namespaces = ["team-y", "team-z"]\nscopes = ["*"]\n',
    }
    path = _config(tmp_path, "".join(entries.values()))
    with serving(database_url, auth_config=path) as thread:
        address = f"127.0.0.1:{thread.server.port}"
        stubs = {name: Stubs.open(address, token) for name, token in tokens.items()}
        try:
            stubs["root"].publish_agent()
            team_thread = stubs["a"].thread(namespace="team-a")
            run = stubs["a"].run(team_thread.id)
            watch = {
                name: stubs[name].runtime.WatchRun(pb.WatchRunRequest(run_id=run.id), timeout=20)
                for name in ("a", "b")
            }
            thread_watch = stubs["c"].runtime.WatchThread(
                pb.WatchThreadRequest(thread_id=team_thread.id), timeout=20
            )
            for stream in (*watch.values(), thread_watch):
                _read(stream)  # streaming: the run's first event arrived
            long_poll, narrowed = (
                stubs[name].worker.AcquireRun.future(
                    wpb.AcquireRunRequest(worker_id=name, wait=duration_pb2.Duration(seconds=15)),
                    timeout=20,
                )
                for name in ("w", "v")
            )
            _holding_long_polls(thread.server.limiter, "worker", "worker-v")
            # client-a's token removed; client-c moved to another namespace; the worker gone.
            Path(path).write_text(
                entries["root"]
                + entries["b"]
                + entries["c"].replace('["team-a"]', '["team-b"]')
                + entries["v"].replace('"team-y", ', "")
            )
            assert thread.server.authenticator.reload()
            assert _ended_with(watch["a"]) == grpc.StatusCode.UNAUTHENTICATED
            assert _ended_with(thread_watch) == grpc.StatusCode.PERMISSION_DENIED
            refused = long_poll.exception(timeout=20)
            assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED
            # A worker still admitted, but to fewer namespaces than its long poll serves.
            shrunk = narrowed.exception(timeout=20)
            assert shrunk is not None and shrunk.code() == grpc.StatusCode.PERMISSION_DENIED
            # client-b, unaffected, sees every event after the reload, once and in order.
            stubs["b"].runtime.CancelRun(pb.CancelRunRequest(run_id=run.id), timeout=10)
            rest = [r.event.sequence for r in watch["b"]]
            assert rest == list(range(2, 2 + len(rest))) and rest
        finally:
            for opened in stubs.values():
                opened.close()
