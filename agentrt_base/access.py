"""Who may do what: the one permission table the server enforces (issue 16, item 2).

Every RPC of every agentrt service has one :class:`Rule` in :data:`RULES`: the permission it
needs and how to find, from the request, the resource it touches (a namespace, or a registry
name, directly or through a thread, run, step, artifact or attempt), and every other id the
request names that the handler looks up (``Rule.links``: a run's parent, the step an approval
resolves), each decided the same way (issue 25). Roles grant permissions
(:data:`ROLE_PERMISSIONS`) and are limited along dimensions (:data:`ROLE_LIMITS`): a
``client`` only in its namespaces, a ``publisher`` only for its agent scopes (patterns over
agent ids and component names), a ``worker`` along both. A call is allowed when one of the
caller's roles grants the permission and admits the resource. :class:`Authorizer` applies
this before any handler runs (``grpc_errors.ErrorMappingInterceptor``); nothing else decides
permissions. List RPCs (``Rule.lists``) answer only what the caller may see: the authorizer
leaves the caller's :class:`Visibility` in :data:`VISIBLE` for the store's query to filter by.

``docs/security.md`` carries :func:`markdown_matrix` of this table (a test keeps them equal),
and the authorisation matrix test drives every RPC with every role against that document.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from agentrt_base.auth import CALLER, Principal
from agentrt_base.roles import ROLES
from agentrt_core import reasons
from agentrt_core.errors import InvalidArgument, PermissionDenied

#: Where a thread (and its runs, messages, blobs and artifacts) lives when nobody says.
DEFAULT_NAMESPACE = "default"
_NAMESPACE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def check_namespace(value: str, field_path: str) -> str:
    """``value``, or the default namespace when empty; a DNS label (RFC 1123: lower-case
    letters, digits and ``-``, at most 63) otherwise INVALID_ARGUMENT naming ``field_path``."""
    if not value:
        return DEFAULT_NAMESPACE
    if not _NAMESPACE.fullmatch(value):
        raise InvalidArgument.for_field(
            field_path, "a namespace is 1-63 lower-case letters, digits or '-' (a DNS label)"
        )
    return value


class Dimension(Enum):
    """What a role's grant is limited by."""

    NAMESPACE = "namespace"  # the principal's `namespaces`
    SCOPE = "scope"  # the principal's `scopes`: patterns over agent ids and component names


#: What each permission lets a caller do (the first column of the matrix in the docs).
PERMISSIONS: Mapping[str, str] = {
    "registry.read": "read components, agent versions, tags and their history",
    "registry.publish": "publish components and agent versions",
    "registry.tag": "move and delete tags",
    "registry.attest": "attach signed attestations to agent versions",
    "threads.create": "create threads",
    "threads.read": "read threads, their messages and events",
    "messages.append": "append messages to threads",
    "runs.create": "create runs",
    "runs.read": "read runs, attempts, steps, artifacts and run events",
    "runs.control": "cancel, pause, resume and amend runs; send inputs",
    "approvals.resolve": "approve or deny tool calls",
    "blobs.read": "read blobs",
    "blobs.write": "upload blobs",
    "work.acquire": "acquire runs",
    "work.record": "heartbeat, record turns, steps, checkpoints and artifacts, finish attempts",
    "audit.read": "provenance, usages, chain verification and bundles",
    "views.own": "keep one's own saved views (named runs-list filters)",
}

_ALL = frozenset(PERMISSIONS)
ROLE_PERMISSIONS: Mapping[str, frozenset[str]] = {
    "publisher": frozenset({"registry.read", "registry.publish", "registry.attest"}),
    # Separate from publishing: CI publishes while only release managers move `prod`.
    "tag-admin": frozenset({"registry.read", "registry.tag"}),
    "client": frozenset(
        {
            "registry.read",
            "threads.create",
            "threads.read",
            "messages.append",
            "runs.create",
            "runs.read",
            "runs.control",
            "blobs.read",
            "blobs.write",
            "views.own",
        }
    ),
    # An approver reads what it approves (the run, its steps and their blobs).
    "approver": frozenset(
        {"registry.read", "runs.read", "blobs.read", "approvals.resolve", "views.own"}
    ),
    # A worker reads its run's thread, writes the agent's replies and records its work.
    "worker": frozenset(
        {
            "registry.read",
            "threads.read",
            "messages.append",
            "runs.read",
            "blobs.read",
            "blobs.write",
            "work.acquire",
            "work.record",
        }
    ),
    # Saved views are for people who read runs lists (a client, an approver, an auditor,
    # an admin); a worker or a publisher is a machine with no list to come back to.
    "auditor": frozenset(
        {"registry.read", "threads.read", "runs.read", "blobs.read", "audit.read", "views.own"}
    ),
    "admin": _ALL,
}

ROLE_LIMITS: Mapping[str, frozenset[Dimension]] = {
    "publisher": frozenset({Dimension.SCOPE}),
    "tag-admin": frozenset({Dimension.SCOPE}),
    "client": frozenset({Dimension.NAMESPACE}),
    "approver": frozenset({Dimension.NAMESPACE}),
    "worker": frozenset({Dimension.NAMESPACE, Dimension.SCOPE}),
    "auditor": frozenset({Dimension.NAMESPACE}),
    "admin": frozenset(),
}
assert set(ROLE_PERMISSIONS) == set(ROLES) == set(ROLE_LIMITS)


class Kind(Enum):
    """What a request field names."""

    NAMESPACE = "namespace"
    NAME = "name"  # an agent id or a component name (a registry scope applies)
    THREAD = "thread"
    RUN = "run"
    STEP = "step"
    ARTIFACT = "artifact"
    ATTEMPT = "attempt"


@dataclass(frozen=True)
class Field:
    kind: Kind
    path: str  # dotted, from the request message: "fence.attempt_id"


@dataclass(frozen=True)
class Link:
    """Another id the request names, which the handler looks up and links to or acts on
    besides the main resource (a run's parent, the step an approval resolves): the caller
    needs ``permission`` on what it names, decided as if it were a main resource (issue 25:
    without this a team-b client linked its run to a team-a run, and the link went into the
    run and its hash-chained event)."""

    permission: str
    field: Field


#: What a linked run, step or attempt needs: reading it. A link reveals, in the caller's own
#: ledger, that the thing exists and whose it is; that is what runs.read grants.
LINK_PERMISSION = "runs.read"


@dataclass(frozen=True)
class Rule:
    permission: str
    #: The fields that name the resource, tried in order; the first one set is the resource.
    #: None of them set (or none declared) means the call touches no one resource.
    fields: tuple[Field, ...] = ()
    #: The answer lists resources, filtered to the caller's :class:`Visibility` along these
    #: dimensions (empty: not a list).
    lists: frozenset[Dimension] = frozenset()
    #: Every other id the request names that the handler looks up: each one set must pass
    #: :func:`decide` too (ids the handler only filters by, within the main resource, need
    #: none; docs/security.md lists every id field and how it is checked).
    links: tuple[Link, ...] = ()


_NS = frozenset({Dimension.NAMESPACE})
_NS_SCOPE = frozenset({Dimension.NAMESPACE, Dimension.SCOPE})


def _r(
    permission: str,
    *fields: tuple[Kind, str],
    lists: frozenset[Dimension] = frozenset(),
    links: tuple[tuple[Kind, str], ...] = (),
) -> Rule:
    return Rule(
        permission,
        tuple(Field(k, p) for k, p in fields),
        lists,
        tuple(Link(LINK_PERMISSION, Field(k, p)) for k, p in links),
    )


_REG = "/agentrt.registry.v1.RegistryService/"
_RUN = "/agentrt.runtime.v1.RuntimeService/"
_WRK = "/agentrt.runtime.v1.WorkerService/"
_AUD = "/agentrt.audit.v1.AuditService/"
_FENCE = (Kind.ATTEMPT, "fence.attempt_id")

#: The permission table: every method of every agentrt service (a test checks none is missing;
#: a method without a rule is refused).
RULES: Mapping[str, Rule] = {
    _REG + "PublishComponent": _r("registry.publish", (Kind.NAME, "component.name")),
    _REG + "GetComponent": _r("registry.read"),
    _REG + "ListComponents": _r("registry.read"),
    _REG + "PublishAgentVersion": _r("registry.publish", (Kind.NAME, "definition.agent_id")),
    _REG + "GetAgentVersion": _r("registry.read"),
    _REG + "ListAgentVersions": _r("registry.read"),
    _REG + "ComputeDigest": _r("registry.read"),
    _REG + "SetTag": _r("registry.tag", (Kind.NAME, "agent_id")),
    _REG + "DeleteTag": _r("registry.tag", (Kind.NAME, "agent_id")),
    _REG + "ListTags": _r("registry.read"),
    _REG + "ListTagHistory": _r("registry.read"),
    _REG + "DiffAgentVersions": _r("registry.read"),
    # The registry log: what anyone who may read the registry may check it against.
    _REG + "GetSigningKeys": _r("registry.read"),
    _REG + "GetCheckpoint": _r("registry.read"),
    _REG + "GetInclusionProof": _r("registry.read"),
    _REG + "GetConsistencyProof": _r("registry.read"),
    _REG + "GetLogEntries": _r("registry.read"),
    _REG + "GetAgentCard": _r("registry.read"),
    _REG + "AttachAttestation": _r("registry.attest", (Kind.NAME, "agent_id")),
    _REG + "ListAttestations": _r("registry.read"),
    _RUN + "CreateThread": _r("threads.create", (Kind.NAMESPACE, "namespace")),
    _RUN + "GetThread": _r("threads.read", (Kind.THREAD, "thread_id")),
    _RUN + "ListThreads": _r("threads.read", (Kind.NAMESPACE, "namespace"), lists=_NS),
    _RUN + "AppendMessage": _r(
        "messages.append", (Kind.THREAD, "thread_id"), links=((Kind.RUN, "run_id"),)
    ),
    _RUN + "ListMessages": _r("threads.read", (Kind.THREAD, "thread_id")),
    _RUN + "WatchThread": _r("threads.read", (Kind.THREAD, "thread_id")),
    _RUN + "CreateRun": _r(
        "runs.create",
        (Kind.THREAD, "thread_id"),
        links=((Kind.RUN, "parent_run_id"), (Kind.RUN, "derived_from_run_id")),
    ),
    _RUN + "GetRun": _r("runs.read", (Kind.RUN, "run_id")),
    _RUN + "ListRuns": _r(
        "runs.read", (Kind.THREAD, "thread_id"), (Kind.NAMESPACE, "namespace"), lists=_NS_SCOPE
    ),
    # A principal's own views: no resource but its own, in no namespace.
    _RUN + "SaveView": _r("views.own"),
    _RUN + "ListViews": _r("views.own"),
    _RUN + "DeleteView": _r("views.own"),
    _RUN + "ListAttempts": _r("runs.read", (Kind.RUN, "run_id")),
    _RUN + "ListSteps": _r("runs.read", (Kind.RUN, "run_id")),
    _RUN + "GetStep": _r("runs.read", (Kind.STEP, "step_id")),
    _RUN + "ListArtifacts": _r("runs.read", (Kind.RUN, "run_id"), (Kind.THREAD, "thread_id")),
    _RUN + "WatchRun": _r("runs.read", (Kind.RUN, "run_id")),
    _RUN + "CancelRun": _r("runs.control", (Kind.RUN, "run_id")),
    _RUN + "PauseRun": _r("runs.control", (Kind.RUN, "run_id")),
    _RUN + "ResumeRun": _r("runs.control", (Kind.RUN, "run_id")),
    _RUN + "AmendRun": _r("runs.control", (Kind.RUN, "run_id")),
    _RUN + "SendInput": _r("runs.control", (Kind.RUN, "run_id")),
    _RUN + "ResolveApproval": _r(
        "approvals.resolve", (Kind.RUN, "run_id"), links=((Kind.STEP, "step_id"),)
    ),
    _RUN + "PutBlob": _r("blobs.write", (Kind.NAMESPACE, "header.namespace")),
    _RUN + "GetBlob": _r("blobs.read", (Kind.NAMESPACE, "namespace")),
    _WRK + "AcquireRun": _r("work.acquire", lists=_NS_SCOPE),
    _WRK + "Heartbeat": _r("work.record", _FENCE),
    _WRK + "BeginTurn": _r("work.record", _FENCE),
    _WRK + "EndTurn": _r("work.record", _FENCE),
    _WRK + "BeginStep": _r("work.record", _FENCE),
    _WRK + "EndStep": _r("work.record", _FENCE),
    _WRK + "WriteCheckpoint": _r("work.record", _FENCE),
    _WRK + "CreateArtifact": _r("work.record", _FENCE),
    _WRK + "FinishAttempt": _r("work.record", _FENCE),
    _AUD + "GetProvenance": _r(
        "audit.read",
        (Kind.RUN, "run_id"),
        (Kind.STEP, "step_id"),
        (Kind.ARTIFACT, "artifact_id"),
        lists=_NS,  # a blob's provenance spans runs: only those the caller may see
    ),
    _AUD + "FindUsages": _r("audit.read", lists=_NS),
    _AUD + "VerifyRun": _r("audit.read", (Kind.RUN, "run_id")),
    _AUD + "ExportBundle": _r("audit.read", (Kind.RUN, "run_id")),
    _AUD + "GetRunAttestation": _r("audit.read", (Kind.RUN, "run_id")),
}


@dataclass(frozen=True)
class Resource:
    """What a request touches, as far as permissions care: None where it has no such facet
    (a registry name has no namespace; a thread has no agent)."""

    namespace: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Visibility:
    """What a caller may see in a list: None means no limit along that dimension."""

    namespaces: frozenset[str] | None = None
    scopes: tuple[str, ...] | None = None

    def admits(self, resource: Resource) -> bool:
        namespace, name = resource.namespace, resource.name
        if self.namespaces is not None and namespace is not None:
            return namespace in self.namespaces and self._name_admitted(name)
        return self._name_admitted(name)

    def covers(self, other: Visibility) -> bool:
        """Whether everything ``other`` admits, this admits too (as far as the namespaces
        and scope patterns say): a call made under ``other`` sees nothing this may not."""
        namespaces = self.namespaces is None or (
            other.namespaces is not None and other.namespaces <= self.namespaces
        )
        scopes = self.scopes is None or (
            other.scopes is not None and set(other.scopes) <= set(self.scopes)
        )
        return namespaces and scopes

    def _name_admitted(self, name: str | None) -> bool:
        if self.scopes is None or name is None:
            return True
        return any(scope_matches(p, name) for p in self.scopes)


EVERYTHING = Visibility()
#: What the caller of the list being served may see (set by :class:`Authorizer`; everything
#: when nobody is authenticated).
VISIBLE: contextvars.ContextVar[Visibility] = contextvars.ContextVar(
    "agentrt_visible", default=EVERYTHING
)


@lru_cache(maxsize=1024)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def scope_matches(pattern: str, name: str) -> bool:
    """A scope pattern matches a name: ``*`` stands for any run of characters, nothing else
    is special (``coding_agent*`` matches ``coding_agent`` and ``coding_agent_v2``)."""
    return _pattern(pattern).fullmatch(name) is not None


def scope_like(pattern: str) -> str:
    """:func:`scope_matches` as a SQL ``LIKE`` pattern with ``\\`` as its escape, for lists
    filtered in the database (a unit test holds the two to the same answers)."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def _granting(principal: Principal, permission: str) -> list[str]:
    return [r for r in principal.roles if permission in ROLE_PERMISSIONS.get(r, ())]


def _role_visibility(principal: Principal, role: str) -> Visibility:
    limits = ROLE_LIMITS[role]
    return Visibility(
        frozenset(principal.namespaces) if Dimension.NAMESPACE in limits else None,
        principal.scopes if Dimension.SCOPE in limits else None,
    )


def visibility(principal: Principal, permission: str) -> Visibility:
    """What ``principal`` may see under ``permission``: the union over its granting roles,
    kept simple — the widest role along each dimension (unlimited if any role is)."""
    namespaces: set[str] = set()
    scopes: list[str] = []
    any_namespace = any_scope = False
    for role in _granting(principal, permission):
        v = _role_visibility(principal, role)
        if v.namespaces is None:
            any_namespace = True
        else:
            namespaces |= v.namespaces
        if v.scopes is None:
            any_scope = True
        else:
            scopes.extend(v.scopes)
    return Visibility(
        None if any_namespace else frozenset(namespaces),
        None if any_scope else tuple(dict.fromkeys(scopes)),
    )


def decide(principal: Principal, rule: Rule, resource: Resource | None) -> str | None:
    """None if ``principal`` may make a call under ``rule`` touching ``resource``; else why
    not (the ErrorInfo reason). The one function that decides."""
    roles = _granting(principal, rule.permission)
    if not roles:
        return reasons.ROLE_MISSING
    if resource is None:
        return None
    if any(_role_visibility(principal, r).admits(resource) for r in roles):
        return None
    return reasons.OUTSIDE_SCOPE


def field_value(request: Any, path: str) -> str:
    value = request
    for part in path.split("."):
        value = getattr(value, part)
    return str(value)


#: Finds what a thread, run, step, artifact or attempt id belongs to (None: no such thing;
#: the handler then answers NOT_FOUND as it would for anyone).
Lookup = Callable[[Kind, str], Awaitable[Resource | None]]


class Authorizer:
    """Applies :data:`RULES` to each call, after authentication set :data:`CALLER`."""

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup

    async def authorize(self, method: str, request: Any) -> None:
        principal = CALLER.get()
        if principal is None:  # health and reflection never get here; agentrt calls do
            return
        rule = await self._check(principal, method, request)
        if rule.lists:
            VISIBLE.set(visibility(principal, rule.permission))

    async def permits(self, principal: Principal, method: str, request: Any) -> bool:
        """Whether ``principal`` may make this call, asked without making it (the console
        shows only the controls that would be let through)."""
        try:
            await self._check(principal, method, request)
        except PermissionDenied:
            return False
        return True

    async def _check(self, principal: Principal, method: str, request: Any) -> Rule:
        """The call's rule, or PermissionDenied saying why not."""
        rule = RULES.get(method)
        if rule is None:
            raise PermissionDenied(
                f"{method} has no permission rule",
                reason=reasons.NO_RULE,
                metadata={"method": method},
            )
        resource = await self._resource(rule, request)
        why = decide(principal, rule, resource)
        if why is not None:
            raise _denied(principal, rule.permission, why, resource)
        for link in rule.links:
            await self._check_link(principal, link, request)
        return rule

    async def _check_link(self, principal: Principal, link: Link, request: Any) -> None:
        value = field_value(request, link.field.path)
        if not value:
            return
        # No such thing: the handler answers NOT_FOUND, as it does for anyone (and as naming
        # it as the main resource would).
        linked = await self._lookup(link.field.kind, value)
        if linked is None:
            return
        why = decide(principal, Rule(link.permission), linked)
        if why is not None:
            error = _denied(principal, link.permission, why, linked)
            error.metadata["field"] = link.field.path
            raise error

    async def _resource(self, rule: Rule, request: Any) -> Resource | None:
        for f in rule.fields:
            value = field_value(request, f.path)
            if f.kind is Kind.NAMESPACE:
                if value or not rule.lists:  # a list without one filters instead
                    return Resource(namespace=check_namespace(value, f.path))
                continue
            if not value:
                continue
            if f.kind is Kind.NAME:
                return Resource(name=value)
            return await self._lookup(f.kind, value)
        return None


def roles_granting(permission: str) -> list[str]:
    """The roles that grant ``permission``, in the table's order."""
    return [r for r, granted in ROLE_PERMISSIONS.items() if permission in granted]


def _quoted(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(repr(v) for v in values) if values else "none"


def _denied(
    principal: Principal, permission: str, why: str, resource: Resource | None
) -> PermissionDenied:
    """The refusal, saying what would allow the call (issue 27: "ci may not registry.publish
    for 'repo-debug'" left the operator guessing which scope or role to grant): the roles that
    grant the permission (metadata ``roles``), or the namespace and scope its token lacks
    (``needs_namespace``, ``needs_scope``)."""
    metadata = {"permission": permission, "principal": principal.name}
    if why == reasons.ROLE_MISSING:
        roles = roles_granting(permission)
        metadata["roles"] = ",".join(roles)
        message = (
            f"{principal.name} has no role that grants {permission}"
            f" (its roles: {_quoted(principal.roles)}); roles that do: {', '.join(roles)}"
        )
        return PermissionDenied(message, reason=why, metadata=metadata)
    limits = frozenset().union(*(ROLE_LIMITS[r] for r in _granting(principal, permission)))
    where, needs = [], []
    if resource is not None and resource.namespace is not None:
        metadata["namespace"] = resource.namespace
        where.append(f"namespace {resource.namespace!r}")
        if Dimension.NAMESPACE in limits and resource.namespace not in principal.namespaces:
            metadata["needs_namespace"] = resource.namespace
            needs.append(
                f"namespace {resource.namespace!r} (its namespaces: "
                f"{_quoted(principal.namespaces)})"
            )
    if resource is not None and resource.name is not None:
        metadata["name"] = resource.name
        where.append(f"{resource.name!r}")
        if Dimension.SCOPE in limits and not any(
            scope_matches(p, resource.name) for p in principal.scopes
        ):
            metadata["needs_scope"] = resource.name
            needs.append(
                f"a scope matching {resource.name!r}, such as {resource.name!r} or '*'"
                f" (its scopes: {_quoted(principal.scopes)})"
            )
    message = f"{principal.name} may not {permission} for {' '.join(where)}"
    if needs:
        message += "; it needs " + " and ".join(needs)
    return PermissionDenied(message, reason=why, metadata=metadata)


#: What each kind of field can limit a call by.
_FACETS: Mapping[Kind, frozenset[Dimension]] = {
    Kind.NAMESPACE: frozenset({Dimension.NAMESPACE}),
    Kind.NAME: frozenset({Dimension.SCOPE}),
    Kind.THREAD: frozenset({Dimension.NAMESPACE}),
    Kind.RUN: frozenset({Dimension.NAMESPACE, Dimension.SCOPE}),
    Kind.STEP: frozenset({Dimension.NAMESPACE, Dimension.SCOPE}),
    Kind.ARTIFACT: frozenset({Dimension.NAMESPACE, Dimension.SCOPE}),
    Kind.ATTEMPT: frozenset({Dimension.NAMESPACE, Dimension.SCOPE}),
}


def cell(rule: Rule, role: str) -> str:
    """One cell of the matrix: ``-`` (the role lacks the permission), ``yes`` (anywhere), or
    what limits the call (``ns``: the principal's namespaces, ``scope``: its agent scopes,
    ``ns+scope``: both), with ``(list)`` where the answer is filtered to what it may see."""
    if rule.permission not in ROLE_PERMISSIONS[role]:
        return "-"
    facets = frozenset().union(*(_FACETS[f.kind] for f in rule.fields))
    limits = ROLE_LIMITS[role] & (facets | rule.lists)
    if not limits:
        return "yes"
    text = "+".join(_SHORT[d] for d in Dimension if d in limits)
    return text + " (list)" if ROLE_LIMITS[role] & rule.lists else text


_SHORT = {Dimension.NAMESPACE: "ns", Dimension.SCOPE: "scope"}


def markdown_matrix() -> str:
    """The table ``docs/security.md`` carries: each RPC, its permission, and for each role
    :func:`cell`."""
    roles = list(ROLE_PERMISSIONS)
    lines = [
        "| RPC | permission | " + " | ".join(roles) + " |",
        "|---|---|" + "---|" * len(roles),
    ]
    for method, rule in RULES.items():
        service, name = method.strip("/").split("/")
        cells = [cell(rule, r) for r in roles]
        label = f"{service.rsplit('.', 1)[1]}.{name}"
        lines.append(f"| {label} | `{rule.permission}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m agentrt_base.access: print the matrix for the docs
    print(markdown_matrix(), end="")
