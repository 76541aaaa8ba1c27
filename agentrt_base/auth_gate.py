"""The gate every agentrt call passes: who is calling, from the credentials it presents.

:class:`Authenticator` holds the auth configuration in force (:class:`agentrt_base.auth.AuthConfig`,
read from its file and again on SIGHUP) and, for every call, before any domain code (the
error-mapping interceptor of :mod:`agentrt_base.grpc_errors` calls it), sets
:data:`agentrt_base.auth.CALLER` or refuses ``UNAUTHENTICATED``: a bearer token in
``authorization`` (a JWT is verified as one; anything else is looked up as an API token), else
the client certificate's SAN. Without a configuration it authenticates nobody. What the file
holds and how principals are made from it is :mod:`agentrt_base.auth`'s concern.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from agentrt_base import oidc
from agentrt_base.auth import CALLER, AuthConfig, Principal, TagPolicy, reload_refusal, token_hash
from agentrt_base.sign_in_config import ConsoleSignIn
from agentrt_core import reasons
from agentrt_core.errors import Unauthenticated

__all__ = ["Authenticator"]

# The logger auth has always used, so operators find reload and refusal lines where they were.
log = logging.getLogger("agentrt.auth")


class Authenticator:
    """The gate every agentrt call passes (``grpc_errors.ErrorMappingInterceptor``)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._config = AuthConfig.load(path) if path else None
        #: Moves on with every configuration taken on reload: a call that outlives one (a
        #: watch, a long poll) is judged again under the new one (``grpc_errors``).
        self.generation = 0
        # Reload may run on another thread than the server's loop (tests, a future admin
        # RPC), hence a lock and call_soon_threadsafe to wake the waiters.
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def changed(self, generation: int) -> None:
        """Return once a configuration newer than ``generation`` is in force."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self.generation != generation:
                return
            self._waiters.append((loop, waiter))
        try:
            await waiter
        finally:
            with self._lock:
                if (loop, waiter) in self._waiters:
                    self._waiters.remove((loop, waiter))

    @property
    def configured(self) -> bool:
        return self._config is not None

    def console_sign_in(self) -> ConsoleSignIn | None:
        """The console's sign-in with an OpenID Provider, as configured now (None: none)."""
        config = self._config
        return config.console_sign_in if config is not None else None

    def tag_policies(self) -> tuple[TagPolicy, ...]:
        """The tag policies in force now (the registry asks on every SetTag)."""
        config = self._config
        return config.tag_policies if config is not None else ()

    def reload(self) -> bool:
        """Read the file again (SIGHUP); keep the configuration in use if it does not load."""
        if not self.path:
            return False
        try:
            config = AuthConfig.load(self.path)
        except ValueError as exc:
            log.error("%s; keeping the configuration in use", exc)
            return False
        previous = self._config
        refusal = reload_refusal(previous, config)
        if refusal is not None:
            log.error("auth config %s not taken: %s; keeping the one in use", self.path, refusal)
            return False
        if previous is not None:
            # An issuer whose JWKS URL did not change keeps the keys already fetched.
            for name, issuer in config.issuers.items():
                old = previous.issuers.get(name)
                if old is not None and old.keys.same_source(issuer.keys):
                    issuer.keys.adopt(old.keys)
        self._config = config
        with self._lock:
            self.generation += 1
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)
        log.info("auth config %s read again", self.path)
        return True

    async def authenticate(self, metadata: Iterable[tuple[str, Any]], auth_context: Any) -> None:
        """Set :data:`CALLER` for this call, or raise UNAUTHENTICATED (a no-op without a
        configuration)."""
        principal = await self.principal_of(metadata, auth_context)
        if principal is not None:
            CALLER.set(principal)

    async def principal_of(
        self, metadata: Iterable[tuple[str, Any]], auth_context: Any
    ) -> Principal | None:
        """Who the credentials prove the caller is (None without a configuration), or
        UNAUTHENTICATED. The gate's rule, and the console's sign-in's. Awaits only to verify
        a JWT whose issuer keys must be fetched, which happens on a worker thread
        (``oidc.JwksKeys``)."""
        config = self._config
        if config is None:
            return None
        token = _bearer(metadata)
        if token is not None and oidc.looks_like_jwt(token):
            claims = await oidc.verify(token, config.issuers)
            return config.mappings[claims["iss"]].principal_for(claims)
        if token is not None:
            # A credential presented is the credential judged: an unknown token is refused
            # even on a connection whose client certificate would be admitted.
            principal = config.by_token_hash.get(token_hash(token))
            if principal is None:
                raise oidc.refuse("unknown_token", "not a token this server knows")
        else:
            principal = _from_certificate(config, auth_context)
        if principal is None:
            raise Unauthenticated(
                "no valid credentials: send `authorization: Bearer <token>` or connect with a"
                " client certificate this server knows",
                reason=reasons.UNAUTHENTICATED,
            )
        return principal


#: RFC 6750's b64token: what a bearer token may be (API tokens and JWTs are within it).
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _bearer(metadata: Iterable[tuple[str, Any]]) -> str | None:
    """The token of ``authorization: Bearer <token>``, None when the call sends no
    ``authorization``; UNAUTHENTICATED (cause ``malformed``) for any other value — another
    scheme, bytes that are not text, whitespace or control characters around or in the token,
    several values. Malformed credentials are refused, never repaired, and never echoed."""
    values = [value for key, value in metadata if key == "authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise oidc.refuse("malformed", "more than one authorization header")
    value = values[0]
    scheme, _, token = value.partition(" ") if isinstance(value, str) else ("", "", "")
    if scheme.lower() != "bearer" or not _B64TOKEN.fullmatch(token):
        raise oidc.refuse(
            "malformed", "the authorization header is not `Bearer <token>` (RFC 6750 b64token)"
        )
    return token


def _from_certificate(config: AuthConfig, auth_context: Any) -> Principal | None:
    if not config.by_san or not auth_context:
        return None
    for san in auth_context.get("x509_subject_alternative_name", []):
        name = san.decode() if isinstance(san, bytes) else str(san)
        principal = config.by_san.get(name)
        if principal is not None:
            return principal
    return None
