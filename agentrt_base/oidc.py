"""OIDC/JWT bearer tokens: verification against an issuer's JWKS (PyJWT over cryptography).

What a token must be to pass :func:`verify`: a JWS whose issuer (``iss``) is configured, whose
``alg`` is one the issuer allows (asymmetric only: never ``none`` or an HMAC, which would let
anyone holding a public key forge tokens), signed by a key of the issuer's JWKS (by ``kid``),
unexpired (``exp``, ``nbf``, ``iat`` with a small leeway), and addressed to this server
(``aud``). Anything else is ``UNAUTHENTICATED`` with ErrorInfo metadata ``cause`` saying which
check failed (never key material).

The JWKS (a file, or an HTTPS URL; plain HTTP only on loopback) is cached by
:class:`JwksKeys`. It is fetched on a worker thread, never on the event loop: once at first use
(a file: at load, so a broken file stops the start or a reload), again when the cache is older
than ``cache_seconds``, and when a token names a ``kid`` the cache does not hold (the issuer
rotated its keys) -- at most once per ``refetch_seconds``, so tokens with made-up ``kid`` values
cannot make the server hammer the issuer. A failed fetch keeps the keys already held.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from agentrt_core import reasons
from agentrt_core.errors import Unauthenticated, Unavailable

log = logging.getLogger("agentrt.auth")

#: The signature algorithms an issuer may allow: asymmetric ones only.
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
DEFAULT_ALGORITHMS = ("RS256", "ES256")
#: Claims every accepted token carries.
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "iat")
#: The claims RFC 7519 defines as NumericDate.
_NUMERIC_DATES = ("exp", "nbf", "iat")
#: Bounds on a JWKS document (an issuer publishes a handful of keys).
MAX_JWKS_BYTES = 1 << 20
FETCH_TIMEOUT_SECONDS = 5.0


def refuse(cause: str, message: str) -> Unauthenticated:
    """The one shape of a refused bearer token: reason UNAUTHENTICATED, metadata ``cause``."""
    return Unauthenticated(
        f"bearer token refused: {message}",
        reason=reasons.UNAUTHENTICATED,
        metadata={"cause": cause},
    )


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts joined by dots (an agentrt API token has no dot)."""
    parts = token.split(".")
    return len(parts) == 3 and all(parts[:2])


def check_jwks_url(url: str) -> None:
    """HTTPS, or plain HTTP to a loopback address (a test, a sidecar): keys fetched in the
    clear from elsewhere could be replaced on the way. Raises ValueError."""
    check_url(url, "jwks_url")


def check_url(url: str, what: str) -> None:
    """``url`` is HTTPS, or plain HTTP to a loopback address: what is fetched from an
    issuer (keys, tokens) or sent to it (codes, secrets) must not travel in the clear
    elsewhere. Raises ValueError naming ``what``."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https" and parsed.hostname:
        return
    if parsed.scheme == "http" and parsed.hostname:
        host = parsed.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            return
    raise ValueError(f"{what} {url!r}: must be https:// (http:// only to a loopback address)")


@dataclass(frozen=True)
class SigningKey:
    """One key of a JWKS, with the algorithm it declares ("" when it declares none)."""

    jwk: jwt.PyJWK = field(repr=False)
    algorithm: str


def parse_jwks(document: Any, where: str) -> dict[str, SigningKey]:
    """Signing keys by ``kid`` ("" for a key without one). Keys for encryption, symmetric keys
    and keys PyJWT cannot use are left out; a document with no usable key is an error."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError(f"{where}: not a JWKS (a JSON object with a `keys` list)")
    keys: dict[str, SigningKey] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("kty") == "oct":
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            keys[str(entry.get("kid", ""))] = SigningKey(
                jwt.PyJWK(entry), str(entry.get("alg", ""))
            )
        except jwt.PyJWTError as exc:
            log.warning("%s: key %r left out: %s", where, entry.get("kid", ""), exc)
    if not keys:
        raise ValueError(f"{where}: no usable signing key")
    return keys


def _read_jwks(source: str, is_url: bool) -> dict[str, SigningKey]:
    """Blocking: read or fetch and parse. Raises ValueError or OSError."""
    if is_url:
        request = urllib.request.Request(source, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SECONDS) as response:
            data = response.read(MAX_JWKS_BYTES + 1)
    else:
        data = Path(source).read_bytes()
    if len(data) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS {source}: larger than {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"JWKS {source}: not JSON ({exc})") from None
    return parse_jwks(document, f"JWKS {source}")


class JwksKeys:
    """An issuer's keys, cached; refreshed off the event loop (see the module docstring)."""

    def __init__(
        self,
        source: str,
        *,
        is_url: bool,
        cache_seconds: float,
        refetch_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.is_url = is_url
        self.cache_seconds = cache_seconds
        self.refetch_seconds = refetch_seconds
        self._clock = clock
        self._keys: dict[str, SigningKey] | None = None
        self._fetched_at = 0.0
        self._attempted_at: float | None = None
        #: How many reads or fetches were attempted (tests count them).
        self.fetches = 0
        # Created on first use, on the loop that serves (the object is built before it runs).
        self._lock: asyncio.Lock | None = None
        if not is_url:
            # A file is read at load: a broken one stops the start (or the reload).
            try:
                self._store(_read_jwks(source, False))
            except OSError as exc:
                raise ValueError(f"JWKS {source}: {exc.strerror or exc}") from None

    def same_source(self, other: JwksKeys) -> bool:
        return (self.source, self.is_url) == (other.source, other.is_url)

    def adopt(self, previous: JwksKeys) -> None:
        """Keep what ``previous`` (the same URL, before a reload) already fetched."""
        if self.is_url and self._keys is None:
            self._keys, self._fetched_at = previous._keys, previous._fetched_at
            self._attempted_at = previous._attempted_at

    def _store(self, keys: dict[str, SigningKey]) -> None:
        self._keys = keys
        self._fetched_at = self._attempted_at = self._clock()
        self.fetches += 1

    def _pick(self, kid: str | None) -> SigningKey | None:
        keys = self._keys or {}
        if kid is None:
            # No kid: acceptable only when the issuer has exactly one key.
            return next(iter(keys.values())) if len(keys) == 1 else None
        return keys.get(kid)

    def _due(self, kid: str | None) -> bool:
        now = self._clock()
        if self._attempted_at is None:
            return True
        if now - self._attempted_at < self.refetch_seconds:
            return False
        return (
            self._keys is None
            or now - self._fetched_at >= self.cache_seconds
            or self._pick(kid) is None
        )

    async def key(self, kid: str | None) -> SigningKey:
        """The key a token names; refreshes first if due. Raises UNAUTHENTICATED for a key
        the issuer does not publish, UNAVAILABLE if the keys were never obtained."""
        if self._due(kid):
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                # Single flight: callers that waited find the cache refreshed.
                if self._due(kid):
                    await self._refresh()
        found = self._pick(kid)
        if found is not None:
            return found
        if self._keys is None:
            raise Unavailable(
                "the token's issuer keys could not be obtained; retry later",
                reason=reasons.JWKS_UNAVAILABLE,
            )
        raise refuse("unknown_key", "signed with a key its issuer does not publish")

    async def _refresh(self) -> None:
        self._attempted_at = self._clock()
        try:
            keys = await asyncio.to_thread(_read_jwks, self.source, self.is_url)
        except (OSError, ValueError) as exc:
            self.fetches += 1
            log.warning("JWKS %s: %s; keeping the keys already held", self.source, exc)
            return
        self._store(keys)


@dataclass(frozen=True)
class OidcIssuer:
    """What a token of one issuer must satisfy."""

    issuer: str
    audiences: tuple[str, ...]
    algorithms: tuple[str, ...]
    keys: JwksKeys = field(compare=False)
    leeway_seconds: float = 30.0


def _text_claims(claims: Mapping[str, Any]) -> dict[str, str]:
    """The scalar claims as text (lists of strings, such as ``aud``, joined by spaces);
    nested objects are left out."""
    out: dict[str, str] = {}
    for name, value in claims.items():
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[name] = str(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[name] = " ".join(value)
    return out


def _is_numeric_date(value: Any) -> bool:
    """RFC 7519 §2: a NumericDate is a JSON number. PyJWT alone would take the string
    "9999999999" (it calls int() on it); Python's JSON reader also takes NaN and Infinity,
    which are no JSON numbers (RFC 8259 §6). A token that is not what the RFC says is
    refused, not repaired."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


async def verify(token: str, issuers: Mapping[str, OidcIssuer]) -> dict[str, str]:
    """The verified claims of ``token`` as text, or raise (see the module docstring)."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise refuse("malformed", "not a well-formed JWT") from None
    for name in _NUMERIC_DATES:
        if name in unverified and not _is_numeric_date(unverified[name]):
            raise refuse("malformed", f"claim {name!r} is not a NumericDate (a JSON number)")
    claimed_issuer = unverified.get("iss")
    issuer = issuers.get(claimed_issuer) if isinstance(claimed_issuer, str) else None
    if issuer is None:
        raise refuse("unknown_issuer", "its issuer is not configured on this server")
    algorithm = header.get("alg")
    if algorithm not in issuer.algorithms:
        raise refuse("algorithm", f"algorithm {str(algorithm)[:20]!r} is not allowed")
    kid = header.get("kid")
    key = await issuer.keys.key(kid if isinstance(kid, str) else None)
    if key.algorithm and key.algorithm != algorithm:
        raise refuse("algorithm", "the key is not for the token's algorithm")
    try:
        claims = jwt.decode(
            token,
            key.jwk.key,
            algorithms=[algorithm],
            audience=list(issuer.audiences),
            issuer=issuer.issuer,
            leeway=issuer.leeway_seconds,
            options={"require": list(REQUIRED_CLAIMS)},
        )
    except jwt.ExpiredSignatureError:
        raise refuse("expired", "expired") from None
    except jwt.ImmatureSignatureError:
        raise refuse("not_yet_valid", "not valid yet (nbf or iat in the future)") from None
    except jwt.InvalidAudienceError:
        raise refuse("audience", "not addressed to this server (aud)") from None
    except jwt.InvalidIssuerError:
        raise refuse("issuer", "wrong issuer") from None
    except jwt.MissingRequiredClaimError as exc:
        raise refuse("claims", f"claim {exc.claim!r} is missing") from None
    except jwt.InvalidSignatureError:
        raise refuse("signature", "the signature does not verify") from None
    except (jwt.PyJWTError, ValueError, TypeError):
        # Wrong key type for the algorithm, malformed claims (a non-numeric exp), ...
        raise refuse("invalid", "does not verify") from None
    return _text_claims(claims)
