"""Finding published content: references resolved to components and agent versions, and
what changed between two versions.

The runtime resolves a run's agent here too (``resolve_agent``, when a run is created), in
its own transaction: these functions take the caller's session and never commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_core import refs
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.lru import LruCache
from agentrt_core.model import (
    AgentDefinition,
    AgentVersion,
    Component,
    FieldChange,
    ReferenceKind,
    Resolution,
)
from agentrt_core.publishing import ComponentSource
from registry import store


class StoreSource(ComponentSource):
    """References resolve against the published components, inside the caller's transaction.

    Look-ups fetch only digests; the (immutable) components themselves come from the cache
    when they can, so resolving a definition of 60 components parses no JSON twice.
    """

    def __init__(self, session: Session, cache: LruCache[str, Component] | None = None) -> None:
        self._session = session
        self._cache = cache
        # name -> {version: digest}, filled by prefetch(): one query for a whole definition
        # instead of one per reference.
        self._known: dict[str, dict[str, str]] = {}

    def prefetch(self, definition: AgentDefinition) -> None:
        """Read the versions of every name the definition references, in one query."""
        names = {
            ref.partition("@")[0]
            for ref in (
                definition.system_prompt_ref or "",
                definition.model_policy,
                *definition.skills,
                *definition.tools,
                definition.permission_policy,
                definition.completion_policy,
            )
            if ref and not ref.startswith("sha256:")
        }
        for name, version, digest in store.component_versions_named(self._session, names):
            self._known.setdefault(name, {})[version] = digest
        for name in names:
            self._known.setdefault(name, {})

    def _load(self, digest: str) -> Component | None:
        cached = self._cache.get(digest) if self._cache else None
        if cached is not None:
            return cached
        row = store.component_by_digest(self._session, digest)
        if row is None:
            return None
        component = store.component_of(row)
        if self._cache is not None:
            self._cache.put(digest, component)
        return component

    def by_version(self, name: str, version: str) -> Component | None:
        if name in self._known:
            digest = self._known[name].get(version)
        else:
            digest = store.component_digest_by_version(self._session, name, version)
        return self._load(digest) if digest else None

    def by_digest(self, digest: str) -> Component | None:
        return self._load(digest)

    def versions(self, name: str) -> Sequence[Component]:
        if name in self._known:
            digests: Sequence[str] = list(self._known[name].values())
        else:
            digests = store.component_digests_named(self._session, name)
        found = (self._load(d) for d in digests)
        return [c for c in found if c is not None]


def parse_lookup_ref(ref: str, field_path: str = "ref") -> refs.Ref:
    """A reference for a look-up: ranges are refused (they only mean something at publish)."""
    if not ref:
        raise InvalidArgument.for_field(field_path, "required")
    try:
        return refs.parse_ref(ref)
    except refs.RefError as exc:
        raise InvalidArgument.for_field(field_path, str(exc)) from exc


def resolve_agent(
    session: Session,
    ref: str,
    *,
    field_path: str = "ref",
    cache: LruCache[str, AgentVersion] | None = None,
) -> tuple[AgentVersion, Resolution]:
    """Resolve an agent reference to a published version, recording how it resolved.

    Raises:
        InvalidArgument: malformed reference, a range, or a bare agent id.
        NotFound: nothing matches.
    """
    parsed = parse_lookup_ref(ref, field_path)
    now = utcnow()
    # First the digest (one indexed look-up), then the immutable version itself, from the
    # cache when possible; only the tags pointing at it are read fresh every time.
    digest: str | None
    agent_id: str | None = None
    tag_name, tag_sequence, kind = "", 0, ReferenceKind.DIGEST
    tags: list[str] | None = None
    match parsed:
        case refs.VersionRef(name=agent_id, version=label):
            digest = store.agent_digest_by_label(session, agent_id, label)
            kind = ReferenceKind.LABEL
        case refs.NameDigestRef(name=agent_id, digest=digest):
            pass
        case refs.DigestRef(digest=digest):
            pass
        case refs.TagRef(name=agent_id, tag=tag_name):
            target = store.resolve_tag(session, agent_id, tag_name)
            digest, tag_sequence, tags = target if target else (None, 0, None)
            kind = ReferenceKind.TAG
        case _:
            raise InvalidArgument.for_field(field_path, f"{ref!r} does not name an agent version")
    version = _load_agent_version(session, digest, cache) if digest else None
    if version is None or (agent_id is not None and version.agent_id != agent_id):
        raise NotFound("agent version", ref)
    if tags is None:
        tags = store.tags_pointing_at(session, version.digest)
    version = dataclasses.replace(version, tags=tuple(tags))
    resolution = Resolution(ref, kind, "", now, tag_name, tag_sequence)
    return version, Resolution(
        resolution.requested_ref,
        resolution.kind,
        version.digest,
        resolution.resolve_time,
        resolution.tag,
        resolution.tag_event_sequence,
    )


def _load_agent_version(
    session: Session, digest: str, cache: LruCache[str, AgentVersion] | None
) -> AgentVersion | None:
    cached = cache.get(digest) if cache else None
    if cached is not None:
        return cached
    row = store.agent_version_by_digest(session, digest)
    if row is None:
        return None
    version = store.agent_version_of(session, row)
    if cache is not None:
        cache.put(digest, dataclasses.replace(version, tags=()))
    return version


def diff_versions(base: AgentVersion, target: AgentVersion) -> list[FieldChange]:
    """What changed from ``base`` to ``target``, by slot (skills and tools matched by name)."""
    changes: list[FieldChange] = []
    if base.definition.description != target.definition.description:
        changes.append(
            FieldChange(
                "description",
                "MODIFIED",
                base.definition.description,
                target.definition.description,
            )
        )
    base_slots = {e.slot: e for e in base.closure}
    target_slots = {e.slot: e for e in target.closure}
    order = [e.slot for e in base.closure] + [
        e.slot for e in target.closure if e.slot not in base_slots
    ]
    for slot in order:
        old, new = base_slots.get(slot), target_slots.get(slot)
        if old is not None and new is not None and old.digest == new.digest:
            continue
        kind = "ADDED" if old is None else "REMOVED" if new is None else "MODIFIED"
        changes.append(
            FieldChange(
                path=slot,
                type=kind,
                base_value=old.render() if old else "",
                target_value=new.render() if new else "",
                base_schema_digest=(old.schema_digest or "") if old else "",
                target_schema_digest=(new.schema_digest or "") if new else "",
            )
        )
    return changes
