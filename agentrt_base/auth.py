"""Who is calling: principals from static API tokens and from mTLS client certificates.

Configured in one TOML file (``agentrt serve --auth-config PATH``, env ``AGENTRT_AUTH_CONFIG``),
read again on SIGHUP (a file that does not load is logged and the one in use kept)::

    [[tokens]]                      # `agentrt token create` appends these
    principal = "ci-publisher"
    hash = "sha256:…"               # of the token: the token itself is stored nowhere
    roles = ["publisher"]
    scopes = ["coding_agent*"]      # agent id patterns
    namespaces = []

    [[certificates]]                # mTLS: a client certificate's SAN (URI, DNS or e-mail)
    san = "spiffe://example.org/worker-1"
    principal = "worker-1"
    roles = ["worker"]

Every call to an agentrt service is authenticated by the error-mapping interceptor's gate
(:class:`Authenticator`), before any domain code: a bearer token in ``authorization``, else
the client certificate's SAN; none, or one not configured, is ``UNAUTHENTICATED``. Health is
open (load balancers probe it); reflection describes only the public contract. With no file
configured, nobody is authenticated and the server listens on loopback only
(``docs/security.md``). Roles and scopes are carried on the principal for the authorisation
that is still to come (issue 16, item 2).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import secrets
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrt_base.errors import Unauthenticated

log = logging.getLogger("agentrt.auth")

#: A token's prefix: says what it is when one turns up in a log or a paste.
TOKEN_PREFIX = "agentrt_"
ROLES = ("publisher", "tag-admin", "client", "approver", "worker", "auditor", "admin")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    #: How it proved who it is: "token" or "certificate".
    method: str = ""


#: The principal of the call being served (set by the gate, read by what records actors).
CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "agentrt_caller", default=None
)


#: The principal recorded for a call when the server authenticates nobody (no auth config:
#: loopback only, every caller is the operator's own process).
ANONYMOUS = "anonymous"


def caller_name() -> str:
    """The authenticated principal of the call being served, the name recorded as its actor
    (publisher, tag mover, approver, canceller, worker): :data:`ANONYMOUS` when the server
    authenticates nobody."""
    principal = CALLER.get()
    return principal.name if principal is not None else ANONYMOUS


def display_actor(principal: str, label: str) -> str:
    """How a recorded actor reads in a message or a listing: the principal, with the label
    the caller gave beside it when the label says something else (a label is never taken
    for the identity). A record from before principals were recorded has only its label,
    and says so."""
    if not principal:
        return f"{label or '-'} (label only, no principal recorded)"
    if label and label != principal:
        return f"{principal} (label {label!r})"
    return principal


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A new API token (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class AuthConfig:
    by_token_hash: dict[str, Principal]
    by_san: dict[str, Principal]

    @classmethod
    def load(cls, path: str) -> AuthConfig:
        """The configuration in ``path``; raises ValueError naming the file and the problem."""
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"auth config {path}: {exc}") from None
        by_hash: dict[str, Principal] = {}
        by_san: dict[str, Principal] = {}
        for i, entry in enumerate(document.get("tokens", [])):
            where = f"auth config {path}: tokens[{i}]"
            digest = _text(entry, "hash", where)
            if not digest.startswith("sha256:") or len(digest) != 71:
                raise ValueError(f"{where}: hash must be sha256:<64 hex digits>")
            by_hash[digest] = _principal(entry, where, "token")
        for i, entry in enumerate(document.get("certificates", [])):
            where = f"auth config {path}: certificates[{i}]"
            by_san[_text(entry, "san", where)] = _principal(entry, where, "certificate")
        unknown = set(document) - {"tokens", "certificates"}
        if unknown:
            raise ValueError(f"auth config {path}: unknown table(s) {sorted(unknown)}")
        return cls(by_hash, by_san)


def _text(entry: Any, key: str, where: str) -> str:
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: {key} is required (a string)")
    return value


def _list(entry: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _principal(entry: dict[str, Any], where: str, method: str) -> Principal:
    roles = _list(entry, "roles", where)
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"{where}: unknown role(s) {bad} (roles: {', '.join(ROLES)})")
    return Principal(
        _text(entry, "principal", where),
        roles,
        _list(entry, "scopes", where),
        _list(entry, "namespaces", where),
        method,
    )


class Authenticator:
    """The gate every agentrt call passes (``grpc_errors.ErrorMappingInterceptor``)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._config = AuthConfig.load(path) if path else None

    @property
    def configured(self) -> bool:
        return self._config is not None

    def reload(self) -> bool:
        """Read the file again (SIGHUP); keep the configuration in use if it does not load."""
        if not self.path:
            return False
        try:
            self._config = AuthConfig.load(self.path)
        except ValueError as exc:
            log.error("%s; keeping the configuration in use", exc)
            return False
        log.info("auth config %s read again", self.path)
        return True

    def authenticate(self, metadata: Sequence[tuple[str, Any]], auth_context: Any) -> None:
        """Set :data:`CALLER` for this call, or raise UNAUTHENTICATED (a no-op without a
        configuration)."""
        config = self._config
        if config is None:
            return
        principal = _from_token(config, metadata)
        if principal is None:
            principal = _from_certificate(config, auth_context)
        if principal is None:
            raise Unauthenticated(
                "no valid credentials: send `authorization: Bearer <token>` or connect with a"
                " client certificate this server knows",
                reason="UNAUTHENTICATED",
            )
        CALLER.set(principal)


def _from_token(config: AuthConfig, metadata: Sequence[tuple[str, Any]]) -> Principal | None:
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token:
                return config.by_token_hash.get(token_hash(token.strip()))
    return None


def _from_certificate(config: AuthConfig, auth_context: Any) -> Principal | None:
    if not config.by_san or not auth_context:
        return None
    for san in auth_context.get("x509_subject_alternative_name", []):
        name = san.decode() if isinstance(san, bytes) else str(san)
        principal = config.by_san.get(name)
        if principal is not None:
            return principal
    return None


def token_entry(
    principal: str,
    token: str,
    roles: Sequence[str],
    scopes: Sequence[str],
    namespaces: Sequence[str],
) -> str:
    """The ``[[tokens]]`` entry ``agentrt token create`` appends (strings as TOML basic
    strings: JSON's escaping is valid TOML for them)."""

    def strings(values: Sequence[str]) -> str:
        return "[" + ", ".join(json.dumps(v) for v in values) + "]"

    return (
        "\n[[tokens]]\n"
        f"principal = {json.dumps(principal)}\n"
        f"hash = {json.dumps(token_hash(token))}\n"
        f"roles = {strings(roles)}\n"
        f"scopes = {strings(scopes)}\n"
        f"namespaces = {strings(namespaces)}\n"
    )
