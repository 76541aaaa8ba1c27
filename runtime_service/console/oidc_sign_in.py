"""Signing in to the console with an OpenID Provider (``[console_sign_in]`` in the auth
config, ``agentrt_base.sign_in_config``): the authorization code flow with PKCE.

1. ``GET /sign-in/oidc`` sends the browser to the provider with a fresh ``state``, ``nonce``
   and PKCE challenge (RFC 7636, S256), kept here for ten minutes, the state also in a
   cookie of this browser's (so a sign-in begun in another browser, an attacker's, cannot
   be finished in this one: login CSRF).
2. ``GET /sign-in/oidc/callback`` takes the code back, trades it at the provider's token
   endpoint (with the client's secret and the PKCE verifier) for an ID token, and has the
   server's gate verify that token exactly as it verifies any bearer token (the issuer's
   keys, its audience, expiry, and the [[oidc]] rules that make it a principal with roles);
   its ``nonce`` must be the one sent. The session then calls the API with that ID token,
   and ends when it expires (the API refuses it, and the console asks to sign in again).

The callback answers with a page that moves on by itself rather than a redirect: the
session cookie is ``SameSite=Strict``, and a browser does not send it on a redirect chain
that began at the provider's site.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote_plus, urlencode

import aiohttp
from aiohttp import web

from agentrt_base.sign_in_config import ConsoleSignIn
from runtime_service.console.sessions import (
    SESSION_COOKIE,
    next_path,
    set_session_cookie,
)

if TYPE_CHECKING:
    from runtime_service.console.web import Console

log = logging.getLogger("agentrt.console")

#: The cookie that ties a callback to the browser that began the sign-in.
STATE_COOKIE: Final = "agentrt_oidc_state"
#: How long a begun sign-in may take at the provider, and how many may be under way.
PENDING_SECONDS: Final = 600.0
PENDING_KEPT: Final = 1000
#: How long the provider's token endpoint may take.
TOKEN_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class _Pending:
    nonce: str
    verifier: str
    going: str
    redirect_uri: str
    begun: float


class OidcSignIn:
    def __init__(self, console: Console, config: Callable[[], ConsoleSignIn | None]) -> None:
        self.c = console
        self._config = config
        self._pending: dict[str, _Pending] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/sign-in/oidc", self.begin),
            web.get("/sign-in/oidc/callback", self.callback),
        ]

    async def begin(self, request: web.Request) -> web.StreamResponse:
        config = self._config()
        if config is None:
            raise web.HTTPNotFound(text="no OpenID Provider is configured for the console")
        self._forget_stale()
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        redirect_uri = f"{request.scheme}://{request.host}/sign-in/oidc/callback"
        self._pending[state] = _Pending(
            nonce, verifier, next_path(request.query.get("next")), redirect_uri, time.monotonic()
        )
        parameters = {
            "response_type": "code",
            "client_id": config.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(config.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": _challenge(verifier),
            "code_challenge_method": "S256",
        }
        joiner = "&" if "?" in config.authorization_url else "?"
        response = web.HTTPSeeOther(config.authorization_url + joiner + urlencode(parameters))
        # Lax, not Strict: the provider sends the browser back with a cross-site navigation.
        response.set_cookie(
            STATE_COOKIE,
            state,
            max_age=int(PENDING_SECONDS),
            httponly=True,
            samesite="Lax",
            secure=request.secure,
            path="/sign-in/oidc",
        )
        raise response

    async def callback(self, request: web.Request) -> web.StreamResponse:
        config = self._config()
        if config is None:
            raise web.HTTPNotFound(text="no OpenID Provider is configured for the console")
        state = request.query.get("state", "")
        pending = self._pending.pop(state, None) if state else None
        if (
            pending is None
            or request.cookies.get(STATE_COOKIE) != state
            or time.monotonic() - pending.begun > PENDING_SECONDS
        ):
            return self._refused(
                request,
                "That sign-in was not begun in this browser, or took too long: sign in again.",
                400,
            )
        if "error" in request.query:
            said = request.query.get("error_description") or request.query["error"]
            return self._refused(request, f"The provider did not sign you in: {said}", 401)
        code = request.query.get("code", "")
        if not code:
            return self._refused(request, "The provider sent no code back.", 400)
        id_token = await self._trade(config, code, pending)
        if id_token is None:
            return self._refused(
                request, "The provider did not give an ID token for that code.", 502
            )
        principal = await self.c.sign_in(id_token) if self.c.sign_in is not None else None
        if principal is None:
            log.info("console sign-in with %s refused: its ID token is not admitted", config.issuer)
            return self._refused(
                request,
                "This server admits no one for that account (no [[oidc]] rule matches it).",
                401,
            )
        if _claims(id_token).get("nonce") != pending.nonce:
            return self._refused(request, "The ID token was not issued for this sign-in.", 401)
        self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
        session = self.c.sessions.open(principal, id_token)
        log.info("console sign-in with %s: %s", config.issuer, principal.name)
        response = self.c.render(request, "signed_in.html", going=pending.going, who=principal.name)
        set_session_cookie(request, response, session)
        response.del_cookie(STATE_COOKIE, path="/sign-in/oidc")
        return response

    async def _trade(self, config: ConsoleSignIn, code: str, pending: _Pending) -> str | None:
        """The ID token the provider gives for ``code`` (None when it gives none)."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "code_verifier": pending.verifier,
        }
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TOKEN_TIMEOUT)) as client,
                client.post(
                    config.token_url,
                    data=form,
                    headers={"Accept": "application/json", "Authorization": _basic(config)},
                ) as answer,
            ):
                body = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("console sign-in: the token endpoint %s failed: %s", config.token_url, exc)
            return None
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if status != 200 or not isinstance(document, dict):
            log.warning("console sign-in: the token endpoint answered %d", status)
            return None
        token = document.get("id_token")
        return token if isinstance(token, str) and token else None

    def _refused(self, request: web.Request, message: str, status: int) -> web.Response:
        response = self.c.render(request, "sign_in_failed.html", status=status, error=message)
        response.del_cookie(STATE_COOKIE, path="/sign-in/oidc")
        return response

    def _forget_stale(self) -> None:
        now = time.monotonic()
        for state in [s for s, p in self._pending.items() if now - p.begun > PENDING_SECONDS]:
            del self._pending[state]
        while len(self._pending) >= PENDING_KEPT:
            self._pending.pop(next(iter(self._pending)))


def _basic(config: ConsoleSignIn) -> str:
    """HTTP Basic client authentication as RFC 6749 section 2.3.1 has it: the client id and
    secret each form-urlencoded, then joined and base64-encoded."""
    pair = f"{quote_plus(config.client_id)}:{quote_plus(config.client_secret)}"
    return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")


def _challenge(verifier: str) -> str:
    """PKCE's S256 challenge: BASE64URL(SHA256(verifier)) without padding (RFC 7636 4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _claims(token: str) -> dict[str, Any]:
    """The payload of a JWT the gate has already verified (read for its nonce only)."""
    try:
        payload = token.split(".")[1]
        decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return {}
    return decoded if isinstance(decoded, dict) else {}
