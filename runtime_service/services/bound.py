"""The bound definition of a run: its agent version with every component's content.

Built once per agent digest and cached (an agent version never changes): AcquireRun hands
its JSON to the worker (``agentrt_core.publishing.bound_agent_document`` in RFC 8785 form, the
shape docs/digest.md §1.5 documents), and BeginStep resolves against its parsed form.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from agentrt_base.db import Database
from agentrt_core import publishing
from agentrt_core.jcs import canonical_bytes
from agentrt_core.lru import LruCache
from agentrt_core.model import ComponentDraft, ComponentKind
from agentrt_core.resolution import BoundDefinition, bound_definition
from registry import service_lookup
from registry import store as registry_store


@dataclass(frozen=True)
class Bound:
    json: bytes
    definition: BoundDefinition
    tool_names: list[str]
    skill_names: list[str]


class BoundAgents:
    def __init__(self, capacity: int = 256) -> None:
        self._cache: LruCache[str, Bound] = LruCache(capacity)

    def cached(self, digest: str) -> Bound | None:
        """The bound definition if it is already built (no database needed), else None."""
        return self._cache.get(digest)

    def definition_now(self, database: Database, digest: str) -> BoundDefinition:
        """A run's bound definition on the calling thread (not the event loop's): from the
        cache, else read once on a read connection (it is immutable and committed before the
        run)."""
        cached = self.cached(digest)
        if cached is None:
            cached = database.read_sync(lambda session: self.get(session, digest))
        return cached.definition

    def get(self, session: Session, digest: str) -> Bound:
        cached = self._cache.get(digest)
        if cached is not None:
            return cached
        version, _ = service_lookup.resolve_agent(session, digest)
        drafts: dict[str, ComponentDraft] = {}
        for entry in version.closure:
            row = registry_store.component_by_digest(session, entry.digest)
            if row is None:  # a closure row's foreign key makes this unreachable
                raise LookupError(f"component {entry.digest} of {digest} is not stored")
            drafts[entry.digest] = ComponentDraft(
                ComponentKind(row.kind),
                row.name,
                row.version,
                row.description,
                registry_store.loads(row.spec_json),
            )
        document = publishing.bound_agent_document(
            version.digest,
            version.agent_id,
            version.version_label,
            version.definition.description,
            version.closure,
            drafts,
        )
        bound = Bound(
            # RFC 8785, as BoundAgent.definition_json promises: a worker may hash its members.
            json=canonical_bytes(document),
            definition=bound_definition(document),
            tool_names=[e.name for e in version.closure if e.slot.startswith("tools[")],
            skill_names=[e.name for e in version.closure if e.slot.startswith("skills[")],
        )
        self._cache.put(digest, bound)
        return bound
