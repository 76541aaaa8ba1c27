"""Who is calling: principals from static API tokens, OIDC/JWT bearer tokens and mTLS client
certificates; and the registry's tag policies, configured beside them.

Configured in one TOML file (``agentrt serve --auth-config PATH``, env ``AGENTRT_AUTH_CONFIG``),
read again on SIGHUP (a file that does not load is logged and the one in use kept)::

    [[tokens]]                      # `agentrt token create` appends these
    principal = "ci-publisher"
    hash = "sha256:…"               # of the token: the token itself is stored nowhere
    roles = ["publisher"]
    scopes = ["coding_agent*"]      # agent id patterns
    namespaces = []
    attestation_keys = []           # verifier keys its version attestations are signed with

    [[certificates]]                # mTLS: a client certificate's SAN (URI, DNS or e-mail)
    san = "spiffe://example.org/worker-1"
    principal = "worker-1"
    roles = ["worker"]
    limits = { long_polls = 32 }    # optional, on any entry: this principal's own limits

    [[oidc]]                        # OIDC/JWT bearer tokens of one issuer (agentrt_base.oidc)
    issuer = "https://token.actions.githubusercontent.com"
    audiences = ["agentrt"]
    jwks_url = "https://token.actions.githubusercontent.com/.well-known/jwks"  # or jwks_file
    principal = "{repository}@{ref}"    # template over the claims; default "{sub}"
    [[oidc.rules]]                  # claims (glob patterns) -> roles; rules that match add up
    claims = { repository = "acme/agents", ref = "refs/heads/main" }
    roles = ["publisher"]
    scopes = ["coding_agent*"]

    [[tag_policies]]                # registry: which versions a tag may point at
    name = "prod-from-main"
    tags = ["prod", "release-*"]
    claims = { repository = "acme/agents", ref = "refs/heads/main" }
    [[tag_policies.attestations]]   # and which attestations it must have
    predicate_type = "https://agentrt.dev/eval/v1"
    signer = "eval-bot"             # the attesting principal (a pattern)
    condition = "passed = true"     # on the predicate: = != >= > <= <, a JSON value

    [console_sign_in]               # the console's sign-in with an OpenID Provider
    issuer = "https://sso.example.com"  # (agentrt_base.sign_in_config)
    client_id = "agentrt-console"

Every call to an agentrt service is authenticated by the error-mapping interceptor's gate
(:class:`agentrt_base.auth_gate.Authenticator`, with the configuration this module reads),
before any domain code: a bearer token in ``authorization`` (a JWT
is verified as one; anything else is looked up as an API token), else the client
certificate's SAN; none, or one not configured, is ``UNAUTHENTICATED``. A JWT is mapped to a
principal in the spirit of Temporal's ClaimMapper: the name from a template over its claims,
roles, scopes and namespaces from every rule whose claims match; a token no rule matches is
refused, since an issuer such as GitHub's signs tokens for every repository it hosts. Health is
open (load balancers probe it); reflection describes only the public contract. With no file
configured, nobody is authenticated and the server listens on loopback only
(``docs/security.md``). Roles and scopes are carried on the principal for the authorisation
that is still to come (issue 16, item 2).
"""

from __future__ import annotations

import contextvars
import fnmatch
import hashlib
import json
import re
import secrets
import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrt_base import oidc, sign_in_config
from agentrt_base.limits import LimitOverrides
from agentrt_base.roles import ROLES
from agentrt_base.sign_in_config import ConsoleSignIn
from agentrt_core.attestation_policy import Condition, Requirement
from agentrt_core.signed_note import Verifier
from agentrt_core.tag_names import is_tag_spelling, tag_spelling

#: A token's prefix: says what it is when one turns up in a log or a paste.
TOKEN_PREFIX = "agentrt_"
#: A scope: a pattern over agent ids and component names (lower case, like the names).
_SCOPE = re.compile(r"[a-z0-9_.*-]{1,128}")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    #: How it proved who it is: "token", "certificate" or "oidc".
    method: str = ""
    #: Its own limits (``limits = {...}`` on its entry); None: the server's
    #: (``agentrt_base.limits``).
    limits: LimitOverrides | None = None
    #: For "oidc": the token's verified claims as text, sorted by name (pairs, so a principal
    #: stays immutable and hashable; :meth:`claim_map` reads them as a mapping).
    claims: tuple[tuple[str, str], ...] = ()
    #: The verifier keys (C2SP form) its attestations may be signed with (``attestation_keys``
    #: on its entry; ``registry/attestations.py``).
    attestation_keys: tuple[str, ...] = ()

    def claim_map(self) -> dict[str, str]:
        return dict(self.claims)


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


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A new API token (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def claims_match(constraints: Sequence[tuple[str, str]], claims: Mapping[str, str]) -> bool:
    """Whether every constraint ``(claim, pattern)`` holds: the claim is present and matches
    the glob pattern (``fnmatch``, case-sensitive; ``*`` also spans ``/``). The one rule for
    OIDC rules and tag policies."""
    return all(
        name in claims and fnmatch.fnmatchcase(claims[name], pattern)
        for name, pattern in constraints
    )


@dataclass(frozen=True)
class ClaimRule:
    """Claims to match -> what a matching token's principal may do."""

    claims: tuple[tuple[str, str], ...]
    roles: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimMapping:
    """How an issuer's verified claims become a principal."""

    #: ``{claim}`` fields and literal text, e.g. ``{sub}`` or ``{repository}@{ref}``.
    principal: str
    rules: tuple[ClaimRule, ...]

    def principal_for(self, claims: Mapping[str, str]) -> Principal:
        """The principal, or UNAUTHENTICATED when no rule matches or a named claim is absent."""
        matched = [rule for rule in self.rules if claims_match(rule.claims, claims)]
        if not matched:
            raise oidc.refuse("no_rule", "no rule of this server admits its claims")
        name = ""
        for literal, claim, _, _ in string.Formatter().parse(self.principal):
            name += literal
            if claim is not None:
                if not claims.get(claim):
                    raise oidc.refuse("claims", f"claim {claim!r} is missing")
                name += claims[claim]

        def union(values: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(v for group in values for v in group))

        return Principal(
            name,
            union([r.roles for r in matched]),
            union([r.scopes for r in matched]),
            union([r.namespaces for r in matched]),
            "oidc",
            claims=tuple(sorted(claims.items())),
        )


@dataclass(frozen=True)
class TagPolicy:
    """A registry rule: tags matching ``tags`` (of agents matching ``agents``) may only point
    at versions published with verified provenance whose claims match ``claims``
    (``registry.tag_policy`` applies it)."""

    name: str
    tags: tuple[str, ...]
    agents: tuple[str, ...] = ("*",)
    claims: tuple[tuple[str, str], ...] = ()
    #: Attestations the version must have (``[[tag_policies.attestations]]``).
    attestations: tuple[Requirement, ...] = ()

    def covers(self, agent_id: str, tag: str) -> bool:
        return any(fnmatch.fnmatchcase(agent_id, p) for p in self.agents) and any(
            fnmatch.fnmatchcase(tag, p) for p in self.tags
        )


@dataclass(frozen=True)
class AuthConfig:
    by_token_hash: dict[str, Principal]
    by_san: dict[str, Principal]
    #: By ``iss``: how to verify its tokens, and how their claims become a principal.
    issuers: dict[str, oidc.OidcIssuer]
    mappings: dict[str, ClaimMapping]
    tag_policies: tuple[TagPolicy, ...] = ()
    #: The console's "Sign in with …" (``agentrt_base.sign_in_config``), when configured.
    console_sign_in: ConsoleSignIn | None = None

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
        issuers: dict[str, oidc.OidcIssuer] = {}
        mappings: dict[str, ClaimMapping] = {}
        for i, entry in enumerate(document.get("oidc", [])):
            where = f"auth config {path}: oidc[{i}]"
            issuer, mapping = _issuer(entry, where, Path(path).parent)
            if issuer.issuer in issuers:
                raise ValueError(f"{where}: issuer {issuer.issuer!r} is configured twice")
            issuers[issuer.issuer], mappings[issuer.issuer] = issuer, mapping
        policies = tuple(
            _tag_policy(entry, f"auth config {path}: tag_policies[{i}]")
            for i, entry in enumerate(document.get("tag_policies", []))
        )
        sign_in = None
        if "console_sign_in" in document:
            sign_in = sign_in_config.parse(
                document["console_sign_in"],
                f"auth config {path}: console_sign_in",
                Path(path).parent,
                issuers,
            )
        known = {"tokens", "certificates", "oidc", "tag_policies", "console_sign_in"}
        unknown = set(document) - known
        if unknown:
            raise ValueError(f"auth config {path}: unknown table(s) {sorted(unknown)}")
        return cls(by_hash, by_san, issuers, mappings, policies, sign_in)

    def role_grants(self) -> list[tuple[str, ...]]:
        """The roles each way in grants: every token, certificate and OIDC rule."""
        fixed = [p.roles for p in [*self.by_token_hash.values(), *self.by_san.values()]]
        return fixed + [rule.roles for m in self.mappings.values() for rule in m.rules]


def reload_refusal(in_use: AuthConfig | None, new: AuthConfig) -> str | None:
    """Why a reload to ``new`` must be refused, or None. A reload may not lock the operator
    out of a running server: a file that admits nobody (no token, certificate or OIDC rule —
    an emptied or truncated file, say) is refused, and so is one without an ``admin`` when
    the file in use has one. The first start takes any file that loads: there is nothing yet
    to lock out, and the operator chose it."""
    grants = new.role_grants()
    if not grants:
        return "it admits nobody (no token, certificate or OIDC rule)"
    had_admin = in_use is not None and any("admin" in r for r in in_use.role_grants())
    if had_admin and not any("admin" in roles for roles in grants):
        return "no principal in it has the admin role, and the file in use has one"
    return None


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


def _roles(entry: dict[str, Any], where: str) -> tuple[str, ...]:
    roles = _list(entry, "roles", where)
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"{where}: unknown role(s) {bad} (roles: {', '.join(ROLES)})")
    return roles


def _number(entry: dict[str, Any], key: str, default: float, where: str) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: {key} must be a number >= 0")
    return float(value)


def _claims(entry: dict[str, Any], where: str, *, required: bool) -> tuple[tuple[str, str], ...]:
    value = entry.get("claims", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()
    ):
        raise ValueError(f'{where}: claims must be a table of claim = "pattern"')
    if required and not value:
        raise ValueError(f"{where}: claims is required (at least one claim to match)")
    return tuple(sorted(value.items()))


def _issuer(entry: Any, where: str, relative_to: Path) -> tuple[oidc.OidcIssuer, ClaimMapping]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a table")
    known = {
        "issuer",
        "audiences",
        "jwks_url",
        "jwks_file",
        "algorithms",
        "principal",
        "rules",
        "leeway_seconds",
        "jwks_cache_seconds",
        "jwks_refetch_seconds",
    }
    if set(entry) - known:
        raise ValueError(f"{where}: unknown key(s) {sorted(set(entry) - known)}")
    audiences = _list(entry, "audiences", where)
    if not audiences:
        raise ValueError(f"{where}: audiences is required (what this server is called in aud)")
    algorithms = _list(entry, "algorithms", where) or oidc.DEFAULT_ALGORITHMS
    bad = [a for a in algorithms if a not in oidc.ASYMMETRIC_ALGORITHMS]
    if bad:
        raise ValueError(
            f"{where}: algorithm(s) {bad} not allowed (asymmetric only: "
            f"{', '.join(oidc.ASYMMETRIC_ALGORITHMS)})"
        )
    if ("jwks_url" in entry) == ("jwks_file" in entry):
        raise ValueError(f"{where}: exactly one of jwks_url and jwks_file is required")
    is_url = "jwks_url" in entry
    if is_url:
        source = _text(entry, "jwks_url", where)
        oidc.check_jwks_url(source)
    else:
        # A relative path is relative to the configuration file.
        source = str(relative_to / _text(entry, "jwks_file", where))
    keys = oidc.JwksKeys(
        source,
        is_url=is_url,
        cache_seconds=_number(entry, "jwks_cache_seconds", 3600, where),
        refetch_seconds=_number(entry, "jwks_refetch_seconds", 60, where),
    )
    template = entry.get("principal", "{sub}")
    try:
        fields = list(string.Formatter().parse(template)) if isinstance(template, str) else None
    except ValueError:
        fields = None
    if (
        not template
        or fields is None
        or any(
            claim is not None and (not claim or spec or conversion)
            for _, claim, spec, conversion in fields
        )
    ):
        raise ValueError(f"{where}: principal must be a template of {{claim}} fields and text")
    rules = []
    for j, rule in enumerate(entry.get("rules", [])):
        at = f"{where}.rules[{j}]"
        if not isinstance(rule, dict) or set(rule) - {"claims", "roles", "scopes", "namespaces"}:
            raise ValueError(f"{at}: a table of claims, roles, scopes, namespaces")
        rules.append(
            ClaimRule(
                _claims(rule, at, required=False),
                _roles(rule, at),
                _scopes(rule, at),
                _list(rule, "namespaces", at),
            )
        )
    if not rules:
        raise ValueError(
            f"{where}: at least one [[oidc.rules]] (a token no rule admits is refused)"
        )
    issuer = oidc.OidcIssuer(
        _text(entry, "issuer", where),
        audiences,
        algorithms,
        keys,
        _number(entry, "leeway_seconds", 30, where),
    )
    return issuer, ClaimMapping(template, tuple(rules))


def _tag_policy(entry: Any, where: str) -> TagPolicy:
    if not isinstance(entry, dict) or set(entry) - {
        "name",
        "tags",
        "agents",
        "claims",
        "attestations",
    }:
        raise ValueError(f"{where}: a table of name, tags, agents, claims, attestations")
    tags = _list(entry, "tags", where)
    if not tags:
        raise ValueError(f"{where}: tags is required (tag name patterns)")
    misspelt = [p for p in tags if not is_tag_spelling(p)]
    if misspelt:
        # Tags are set in lower case (the same rule SetTag applies): a pattern with a capital
        # would match no tag a caller can set, and so protect nothing.
        raise ValueError(
            f"{where}: tag pattern(s) {misspelt} would protect nothing: tags are set in lower"
            f" case (write {[tag_spelling(p) for p in misspelt]})"
        )
    return TagPolicy(
        _text(entry, "name", where),
        tags,
        _list(entry, "agents", where) or ("*",),
        _claims(entry, where, required=False),
        _requirements(entry.get("attestations", []), f"{where}.attestations"),
    )


def _requirements(value: Any, where: str) -> tuple[Requirement, ...]:
    """``[[tag_policies.attestations]]``: predicate_type, signer (a principal pattern,
    default any), condition (``passed = true``; agentrt_core.attestation_policy)."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: a list of tables")
    out = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or set(item) - {"predicate_type", "signer", "condition"}:
            raise ValueError(f"{at}: a table of predicate_type, signer, condition")
        condition = item.get("condition")
        if condition is not None and not isinstance(condition, str):
            raise ValueError(f"{at}: condition must be a string")
        try:
            parsed = Condition.parse(condition) if condition else None
        except ValueError as exc:
            raise ValueError(f"{at}: {exc}") from None
        signer = item.get("signer", "*")
        if not isinstance(signer, str) or not signer:
            raise ValueError(f"{at}: signer must be a principal name pattern")
        out.append(Requirement(_text(item, "predicate_type", at), signer, parsed))
    return tuple(out)


def _scopes(entry: dict[str, Any], where: str) -> tuple[str, ...]:
    scopes = _list(entry, "scopes", where)
    bad = [s for s in scopes if not _SCOPE.fullmatch(s)]
    if bad:
        raise ValueError(
            f"{where}: scope(s) {bad} are not name patterns (lower-case letters, digits,"
            " '_', '-', '.', and '*' for any run of characters)"
        )
    return scopes


def _principal(entry: dict[str, Any], where: str, method: str) -> Principal:
    roles = _roles(entry, where)
    scopes = _scopes(entry, where)
    limits = entry.get("limits")
    keys = _list(entry, "attestation_keys", where)
    for key in keys:
        try:
            Verifier.parse(key)
        except ValueError as exc:
            raise ValueError(f"{where}: attestation_keys: {exc}") from None
    return Principal(
        _text(entry, "principal", where),
        roles,
        scopes,
        _list(entry, "namespaces", where),
        method,
        None if limits is None else LimitOverrides.parse(limits, where),
        attestation_keys=keys,
    )


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
