"""Domain types of the registry (plain, immutable, no protobuf and no SQLAlchemy).

Component specs are carried as the JSON-like mappings that :mod:`agentrt_core.canonical`
normalises and digests; everything else is a small frozen dataclass.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentrt_core.canonical import ComponentKind

__all__ = [
    "AgentDefinition",
    "AgentVersion",
    "ClosureEntry",
    "Component",
    "ComponentDraft",
    "ComponentKind",
    "FieldChange",
    "Provenance",
    "ReferenceKind",
    "Resolution",
    "Tag",
    "TagEvent",
    "VerifiedProvenance",
]


@dataclass(frozen=True)
class Provenance:
    """Where a publish or a tag move came from; stored and returned, never digested."""

    publisher: str = ""
    source_repo: str = ""
    commit: str = ""
    pipeline_url: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "publisher": self.publisher,
            "source_repo": self.source_repo,
            "commit": self.commit,
            "pipeline_url": self.pipeline_url,
            "labels": dict(sorted(self.labels.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provenance:
        return cls(
            publisher=data.get("publisher", ""),
            source_repo=data.get("source_repo", ""),
            commit=data.get("commit", ""),
            pipeline_url=data.get("pipeline_url", ""),
            labels=dict(data.get("labels", {})),
        )


@dataclass(frozen=True)
class VerifiedProvenance:
    """Where a publish came from, as the verified claims of the OIDC token it was made with
    (``agentrt_base.auth.Principal.claims``); stored beside the self-declared
    :class:`Provenance`, never digested."""

    #: Every scalar claim as text, sorted by name (pairs: immutable and hashable).
    claims: tuple[tuple[str, str], ...]

    def claim_map(self) -> dict[str, str]:
        return dict(self.claims)

    def _first(self, *names: str) -> str:
        claims = self.claim_map()
        return next((claims[n] for n in names if claims.get(n)), "")

    # The CI claims a reader asks for most, under GitHub's names then GitLab's.
    @property
    def issuer(self) -> str:
        return self._first("iss")

    @property
    def subject(self) -> str:
        return self._first("sub")

    @property
    def repository(self) -> str:
        return self._first("repository", "project_path")

    @property
    def ref(self) -> str:
        return self._first("ref")

    @property
    def commit_sha(self) -> str:
        return self._first("sha")

    @property
    def workflow(self) -> str:
        return self._first("workflow", "ci_config_ref_uri")

    def to_json(self) -> dict[str, Any]:
        return {"claims": dict(self.claims)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifiedProvenance:
        return cls(tuple(sorted((str(k), str(v)) for k, v in data.get("claims", {}).items())))


@dataclass(frozen=True)
class ComponentDraft:
    """A component as its publisher writes it: everything its digest covers."""

    kind: ComponentKind
    name: str
    version: str
    description: str
    spec: dict[str, Any]


@dataclass(frozen=True)
class Component:
    """A published component version (``anonymous``: an inline system prompt)."""

    kind: ComponentKind
    name: str
    version: str
    digest: str
    description: str
    spec: dict[str, Any]
    schema_digest: str | None
    publish_time: dt.datetime
    provenance: Provenance
    anonymous: bool = False
    #: Who published it: the authenticated principal ('' if recorded before it was kept).
    principal: str = ""
    #: The verified claims of the OIDC token it was published with, if it was.
    verified: VerifiedProvenance | None = None

    @property
    def ref(self) -> str:
        return self.digest if self.anonymous else f"{self.name}@{self.version}"


@dataclass(frozen=True)
class AgentDefinition:
    """An agent definition as written: references, not yet resolved.

    Exactly one of ``system_prompt_text`` (inline) and ``system_prompt_ref`` is set.
    """

    agent_id: str
    version_label: str
    description: str
    system_prompt_text: str | None
    system_prompt_ref: str | None
    model_policy: str
    skills: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    permission_policy: str = ""
    completion_policy: str = ""

    def to_json(self) -> dict[str, Any]:
        prompt = (
            {"text": self.system_prompt_text}
            if self.system_prompt_text is not None
            else {"ref": self.system_prompt_ref}
        )
        return {
            "agent_id": self.agent_id,
            "version_label": self.version_label,
            "description": self.description,
            "system_prompt": prompt,
            "model_policy": self.model_policy,
            "skills": list(self.skills),
            "tools": list(self.tools),
            "permission_policy": self.permission_policy,
            "completion_policy": self.completion_policy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentDefinition:
        prompt = data["system_prompt"]
        return cls(
            agent_id=data["agent_id"],
            version_label=data["version_label"],
            description=data.get("description", ""),
            system_prompt_text=prompt.get("text"),
            system_prompt_ref=prompt.get("ref"),
            model_policy=data["model_policy"],
            skills=tuple(data.get("skills", ())),
            tools=tuple(data.get("tools", ())),
            permission_policy=data.get("permission_policy", ""),
            completion_policy=data.get("completion_policy", ""),
        )


@dataclass(frozen=True)
class ClosureEntry:
    """One reference of a definition, resolved to one component version.

    ``slot`` says where it sits: ``system_prompt``, ``model_policy``, ``skills[<name>]``,
    ``tools[<name>]``, ``permission_policy``, ``completion_policy``.
    """

    slot: str
    kind: ComponentKind
    name: str
    version: str
    digest: str
    requested_ref: str
    schema_digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "kind": self.kind.value,
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "requested_ref": self.requested_ref,
            "schema_digest": self.schema_digest,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClosureEntry:
        return cls(
            slot=data["slot"],
            kind=ComponentKind(data["kind"]),
            name=data["name"],
            version=data["version"],
            digest=data["digest"],
            requested_ref=data["requested_ref"],
            schema_digest=data.get("schema_digest"),
        )

    def render(self) -> str:
        """``name@version sha256:…`` (a bare digest for an inline prompt)."""
        return f"{self.name}@{self.version} {self.digest}" if self.name else self.digest


@dataclass(frozen=True)
class AgentVersion:
    """A published agent version."""

    agent_id: str
    version_label: str
    digest: str
    definition: AgentDefinition
    closure: tuple[ClosureEntry, ...]
    publish_time: dt.datetime
    provenance: Provenance
    tags: tuple[str, ...] = ()
    #: Who published it: the authenticated principal ('' if recorded before it was kept).
    principal: str = ""
    #: The verified claims of the OIDC token it was published with, if it was.
    verified: VerifiedProvenance | None = None

    def slot(self, slot: str) -> ClosureEntry | None:
        return next((e for e in self.closure if e.slot == slot), None)


class ReferenceKind(StrEnum):
    LABEL = "LABEL"
    DIGEST = "DIGEST"
    TAG = "TAG"


@dataclass(frozen=True)
class Resolution:
    """How a reference was resolved to a digest, and when."""

    requested_ref: str
    kind: ReferenceKind
    resolved_digest: str
    resolve_time: dt.datetime
    tag: str = ""
    tag_event_sequence: int = 0


@dataclass(frozen=True)
class Tag:
    agent_id: str
    name: str
    digest: str
    update_time: dt.datetime
    #: The authenticated principal of the move that set the target.
    updated_by: str
    event_sequence: int
    #: The display label that move's caller gave.
    updated_by_label: str = ""


@dataclass(frozen=True)
class TagEvent:
    sequence: int
    agent_id: str
    tag: str
    type: str  # "SET" or "DELETE"
    from_digest: str
    to_digest: str
    #: The authenticated principal that made the move.
    actor: str
    reason: str
    provenance: Provenance
    event_time: dt.datetime
    #: The display label the caller gave (the request's actor field).
    actor_label: str = ""


@dataclass(frozen=True)
class FieldChange:
    path: str
    type: str  # "ADDED", "REMOVED" or "MODIFIED"
    base_value: str = ""
    target_value: str = ""
    base_schema_digest: str = ""
    target_schema_digest: str = ""
