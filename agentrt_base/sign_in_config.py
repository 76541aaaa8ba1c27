"""The console's sign-in with an OpenID Provider, as the auth config describes it::

    [console_sign_in]                   # "Sign in with …" on the console (issue 30)
    issuer = "https://sso.example.com"  # one of this file's [[oidc]] issuers
    client_id = "agentrt-console"       # among that issuer's audiences: the ID token's aud
    client_secret_file = "console.secret"   # relative to this file (or client_secret = "…")
    authorization_url = "https://sso.example.com/authorize"
    token_url = "https://sso.example.com/token"
    label = "Acme SSO"                  # the button's text (default: the issuer)
    scopes = ["openid", "email"]        # default ["openid"]

The console runs the authorization code flow with PKCE (RFC 6749 section 4.1, RFC 7636):
the browser goes to ``authorization_url``, comes back with a code, and the console trades
the code at ``token_url`` for an ID token. That token then proves the session's principal
exactly as a bearer token proves a caller's: verified by the issuer's [[oidc]] entry (keys,
audience, expiry) and mapped to roles by its rules (``agentrt_base.auth``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrt_base import oidc


@dataclass(frozen=True)
class ConsoleSignIn:
    issuer: str
    client_id: str
    client_secret: str = field(repr=False)
    authorization_url: str
    token_url: str
    label: str
    scopes: tuple[str, ...]


def parse(
    entry: Any, where: str, relative_to: Path, issuers: dict[str, oidc.OidcIssuer]
) -> ConsoleSignIn:
    """The ``[console_sign_in]`` table; ValueError naming ``where`` and the problem."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a table")
    known = {
        "issuer",
        "client_id",
        "client_secret",
        "client_secret_file",
        "authorization_url",
        "token_url",
        "label",
        "scopes",
    }
    unknown = set(entry) - known
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")

    def text(key: str, default: str | None = None) -> str:
        value = entry.get(key, default)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: {key} is required (a string)")
        return value

    issuer = text("issuer")
    configured = issuers.get(issuer)
    if configured is None:
        raise ValueError(f"{where}: issuer {issuer!r} is not one of this file's [[oidc]] issuers")
    client_id = text("client_id")
    if client_id not in configured.audiences:
        raise ValueError(
            f"{where}: client_id {client_id!r} must be among issuer {issuer!r}'s audiences"
            " (it is the ID token's aud)"
        )
    if ("client_secret" in entry) == ("client_secret_file" in entry):
        raise ValueError(f"{where}: give one of client_secret and client_secret_file")
    if "client_secret" in entry:
        secret = text("client_secret")
    else:
        path = relative_to / text("client_secret_file")
        try:
            secret = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"{where}: client_secret_file: {exc}") from None
        if not secret:
            raise ValueError(f"{where}: client_secret_file {path} is empty")
    urls = {key: text(key) for key in ("authorization_url", "token_url")}
    for key, url in urls.items():
        try:
            oidc.check_url(url, key)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    scopes = entry.get("scopes", ["openid"])
    if (
        not isinstance(scopes, list)
        or not all(isinstance(s, str) and s and " " not in s for s in scopes)
        or "openid" not in scopes
    ):
        raise ValueError(f"{where}: scopes must be a list of scope names including 'openid'")
    return ConsoleSignIn(
        issuer=issuer,
        client_id=client_id,
        client_secret=secret,
        authorization_url=urls["authorization_url"],
        token_url=urls["token_url"],
        label=text("label", issuer),
        scopes=tuple(scopes),
    )
