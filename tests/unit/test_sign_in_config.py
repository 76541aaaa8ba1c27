"""The auth config's ``[console_sign_in]`` (agentrt_base.sign_in_config): what loads, and
every way it is refused, naming the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrt_base.auth import AuthConfig
from tests.oidc import Issuer

ISSUER = "https://sso.example.com"


def _config(tmp_path: Path, sign_in: str, *, audiences: str = '["agentrt-console"]') -> Path:
    (tmp_path / "jwks.json").write_text(json.dumps(Issuer(ISSUER).jwks()))
    (tmp_path / "console.secret").write_text("s3cret\n")
    path = tmp_path / "auth.toml"
    path.write_text(
        f"""
[[oidc]]
issuer = "{ISSUER}"
audiences = {audiences}
jwks_file = "jwks.json"
[[oidc.rules]]
claims = {{ sub = "alice" }}
roles = ["auditor"]

[console_sign_in]
{sign_in}
"""
    )
    return path


GOOD = f"""
issuer = "{ISSUER}"
client_id = "agentrt-console"
client_secret_file = "console.secret"
authorization_url = "{ISSUER}/authorize"
token_url = "{ISSUER}/token"
"""


def test_a_complete_table_loads_with_its_defaults(tmp_path: Path) -> None:
    config = AuthConfig.load(str(_config(tmp_path, GOOD)))
    sign_in = config.console_sign_in
    assert sign_in is not None
    assert sign_in.client_secret == "s3cret"  # read from the file, stripped
    assert sign_in.label == ISSUER and sign_in.scopes == ("openid",)
    assert "s3cret" not in repr(sign_in)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (('issuer = "https://sso.example.com"', 'issuer = "https://other.example"'), "not one of"),
        (('client_id = "agentrt-console"', 'client_id = "someone-else"'), "audiences"),
        (('client_secret_file = "console.secret"', ""), "one of client_secret"),
        (
            (
                'client_secret_file = "console.secret"',
                'client_secret_file = "console.secret"\nclient_secret = "x"',
            ),
            "one of client_secret",
        ),
        (
            ('client_secret_file = "console.secret"', 'client_secret_file = "missing"'),
            "client_secret_file",
        ),
        (("https://sso.example.com/token", "http://sso.example.com/token"), "token_url"),
        (("https://sso.example.com/authorize", "http://10.0.0.1/authorize"), "authorization_url"),
        (
            (
                'token_url = "https://sso.example.com/token"',
                'token_url = "https://sso.example.com/token"\nscopes = ["email"]',
            ),
            "openid",
        ),
        (
            (
                'token_url = "https://sso.example.com/token"',
                'token_url = "https://sso.example.com/token"\nsurprise = 1',
            ),
            "unknown key",
        ),
    ],
)
def test_a_table_that_cannot_work_does_not_load(
    tmp_path: Path, change: tuple[str, str], says: str
) -> None:
    table = GOOD.replace(*change)
    assert table != GOOD
    with pytest.raises(ValueError, match=says) as refused:
        AuthConfig.load(str(_config(tmp_path, table)))
    assert "console_sign_in" in str(refused.value)
    assert "s3cret" not in str(refused.value)
