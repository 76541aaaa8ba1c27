"""The bound definition of a run: its agent version with every component's content.

Built once per agent digest and cached (an agent version never changes): AcquireRun hands
its JSON to the worker, and BeginStep resolves against its parsed form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from agentrt_base.lru import LruCache
from registry import service as registry_service
from registry import store as registry_store
from runtime_service.resolution import BoundDefinition, bound_definition


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

    def get(self, session: Session, digest: str) -> Bound:
        cached = self._cache.get(digest)
        if cached is not None:
            return cached
        version, _ = registry_service.resolve_agent(session, digest)
        components: dict[str, Any] = {}
        for entry in version.closure:
            row = registry_store.component_by_digest(session, entry.digest)
            components[entry.slot] = {
                **entry.to_json(),
                "spec": json.loads(row.spec_json) if row else {},
            }
        document = {
            "agent_id": version.agent_id,
            "version_label": version.version_label,
            "digest": version.digest,
            "definition": version.definition.to_json(),
            "components": components,
        }
        bound = Bound(
            json=json.dumps(document, ensure_ascii=False, sort_keys=True).encode(),
            definition=bound_definition(document),
            tool_names=[e.name for e in version.closure if e.slot.startswith("tools[")],
            skill_names=[e.name for e in version.closure if e.slot.startswith("skills[")],
        )
        self._cache.put(digest, bound)
        return bound
