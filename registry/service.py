"""The registry's use cases: publish, get, list, compute digests, diff (tags are
``service_tags.py``; resolving references, shared with the runtime, ``service_lookup.py``).

Each public method validates what it can before touching the database, then does its reads
and writes in one transaction through :class:`agentrt_base.db.Database` (on the writer for
anything that writes), by the queries of ``registry/store.py``: the rules are here, the SQL
there. Nothing with a digest is ever updated or deleted.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.orm import Session

from agentrt_base.db import Database, utcnow
from agentrt_core import content_limits, reasons, refs
from agentrt_core.canonical import ComponentKind
from agentrt_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ViolationCollector,
)
from agentrt_core.log_entries import Leaf, agent_version_leaf, component_leaf
from agentrt_core.lru import LruCache
from agentrt_core.model import (
    AgentDefinition,
    AgentVersion,
    ClosureEntry,
    Component,
    ComponentDraft,
    FieldChange,
    Provenance,
    Resolution,
)
from agentrt_core.paging import cut_page, page_request
from agentrt_core.publishing import (
    DigestedAgent,
    DigestedComponent,
    check_definition,
    digest_agent,
    digest_component,
)
from registry import log_store, store
from registry.service_common import (
    Page,
    Publisher,
    check_provenance,
    check_request_id,
    write_retrying,
)
from registry.service_lookup import StoreSource, diff_versions, parse_lookup_ref, resolve_agent
from registry.transparency import inclusion_in


@dataclass(frozen=True)
class ComputedDigest:
    digest: str
    canonical: bytes
    closure: tuple[ClosureEntry, ...] = ()
    schema_digest: str | None = None
    #: The digest already bound to the same label (name@version or agent@label), if any.
    existing_digest: str = ""


class RegistryService:
    """The registry's use cases over one database (but its tags': ``TagsService``)."""

    def __init__(self, database: Database) -> None:
        self._db = database
        # Immutable by digest, so caching them is always coherent, across replicas too.
        self._components: LruCache[str, Component] = LruCache(4096)
        self._versions: LruCache[str, AgentVersion] = LruCache(1024)

    # components

    async def publish_component(
        self, draft: ComponentDraft, provenance: Provenance, request_id: str = ""
    ) -> tuple[Component, bool, log_store.Proof]:
        """Store ``name@version``; identical content again returns the stored one.

        ``request_id`` is accepted for AIP-155 symmetry; publishing is idempotent by content
        already, so a retried request can never create a second version.
        """
        problems = ViolationCollector()
        check_provenance(provenance, problems)
        check_request_id(request_id, problems)
        problems.raise_if_any()
        digested = digest_component(draft)
        publisher = Publisher.of_caller()
        return await write_retrying(
            self._db, lambda s: self._store_component(s, digested, provenance, publisher)
        )

    def _store_component(
        self,
        session: Session,
        digested: DigestedComponent,
        provenance: Provenance,
        publisher: Publisher,
    ) -> tuple[Component, bool, log_store.Proof]:
        draft = digested.draft
        existing = store.component_by_version(session, draft.name, draft.version)
        if existing is not None:
            if existing.digest == digested.digest:
                return store.component_of(existing), False, _published(session, existing.digest)
            raise AlreadyExists(
                "component",
                f"{draft.name}@{draft.version}",
                f"{draft.name}@{draft.version} is already published with different content "
                f"({existing.digest}); publish a new version",
                reason=reasons.VERSION_CONFLICT,
                metadata={"existing_digest": existing.digest},
            )
        sibling = store.any_component_named(session, draft.name)
        if sibling is not None:
            if sibling.kind != draft.kind.value:
                raise FailedPrecondition(
                    f"{draft.name!r} is a {sibling.kind} component; a name keeps its kind",
                    reason=reasons.KIND_MISMATCH,
                    metadata={"existing_kind": sibling.kind},
                )
            if refs.is_int_version(sibling.version) != refs.is_int_version(draft.version):
                scheme = "integer" if refs.is_int_version(sibling.version) else "semver"
                raise FailedPrecondition(
                    f"{draft.name!r} uses {scheme} versions; all versions of a name use one scheme",
                    reason=reasons.VERSION_SCHEME_MISMATCH,
                )
        row = store.add_component(
            session, digested, provenance, publisher.principal, publisher.verified, utcnow()
        )
        (proof,) = log_store.append(session, _component_leaf(row))
        return store.component_of(row), True, proof

    async def get_component(self, ref: str) -> Component:
        parsed = parse_lookup_ref(ref)

        def read(session: Session) -> Component:
            row: store.ComponentRow | None
            match parsed:
                case refs.VersionRef(name=name, version=version):
                    if not refs.is_valid_version(version):
                        raise InvalidArgument.for_field(
                            "ref", f"{version!r} is not a component version (semver or integer)"
                        )
                    row = store.component_by_version(session, name, version)
                case refs.NameDigestRef(name=name, digest=digest):
                    row = store.component_by_digest(session, digest)
                    row = row if row is not None and row.name == name else None
                case refs.DigestRef(digest=digest):
                    row = store.component_by_digest(session, digest)
                case _:
                    raise InvalidArgument.for_field("ref", "components have no tags")
            if row is None:
                raise NotFound("component", ref)
            return store.component_of(row)

        return await self._db.read(read)

    async def list_components(
        self, kind: ComponentKind | None, name: str, page_size: int, page_token: str
    ) -> Page[Component]:
        filters = {"kind": kind.value if kind else "", "name": name}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(str, dt.datetime, str),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )
        after = (page.after[0], page.after[1], page.after[2]) if page.after is not None else None

        def read(session: Session) -> Page[Component]:
            rows, token = cut_page(
                store.components_page(
                    session, kind.value if kind else "", name, after, page.size + 1
                ),
                page.size,
                filters,
                lambda r: [r.name, r.publish_time, r.digest],
            )
            return Page([store.component_of(r) for r in rows], token)

        return await self._db.read(read)

    # agent versions

    async def publish_agent_version(
        self, definition: AgentDefinition, provenance: Provenance, request_id: str = ""
    ) -> tuple[AgentVersion, bool, log_store.Proof]:
        """Resolve, digest and store an agent version; identical content is idempotent."""
        problems = ViolationCollector()
        check_provenance(provenance, problems)
        check_request_id(request_id, problems)
        problems.raise_if_any()
        check_definition(definition)
        publisher = Publisher.of_caller()
        return await write_retrying(
            self._db, lambda s: self._store_agent_version(s, definition, provenance, publisher)
        )

    def _store_agent_version(
        self,
        session: Session,
        definition: AgentDefinition,
        provenance: Provenance,
        publisher: Publisher,
    ) -> tuple[AgentVersion, bool, log_store.Proof]:
        source = StoreSource(session, self._components)
        source.prefetch(definition)
        digested = digest_agent(definition, source)
        existing = store.agent_version_by_label(
            session, definition.agent_id, definition.version_label
        )
        if existing is not None:
            if existing.digest == digested.digest:
                version = store.agent_version_of(session, existing)
                return version, False, _published(session, existing.digest)
            label = f"{definition.agent_id}@{definition.version_label}"
            raise AlreadyExists(
                "agent version",
                label,
                f"{label} is already published with different content ({existing.digest}); "
                "publish under a new version label",
                reason=reasons.VERSION_CONFLICT,
                metadata={"existing_digest": existing.digest},
            )
        now = utcnow()
        store.add_agent_if_new(session, definition.agent_id, now)
        leaves: list[Leaf] = []  # appended last, together (log_store.append says why)
        if digested.inline_prompt is not None and (
            store.component_by_digest(session, digested.inline_prompt.digest) is None
        ):
            prompt = store.add_component(
                session,
                digested.inline_prompt,
                provenance,
                publisher.principal,
                publisher.verified,
                now,  # one time for the publish: the prompt's entry is not later than its agent's
            )
            leaves.append(_component_leaf(prompt))
        version = AgentVersion(
            agent_id=definition.agent_id,
            version_label=definition.version_label,
            digest=digested.digest,
            definition=_sorted_definition(definition),
            closure=digested.closure,
            publish_time=now,
            provenance=provenance,
            principal=publisher.principal,
            verified=publisher.verified,
        )
        store.add_agent_version(session, version)
        leaves.append(
            agent_version_leaf(
                digest=version.digest,
                agent_id=version.agent_id,
                version_label=version.version_label,
                principal=version.principal,
                time=version.publish_time,
            )
        )
        return version, True, log_store.append(session, *leaves)[-1]

    async def get_agent_version(self, ref: str) -> tuple[AgentVersion, Resolution]:
        return await self._db.read(lambda s: resolve_agent(s, ref, cache=self._versions))

    async def list_agent_versions(
        self, agent_id: str, page_size: int, page_token: str
    ) -> Page[AgentVersion]:
        filters = {"agent_id": agent_id}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(dt.datetime, str),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )

        after = (page.after[0], page.after[1]) if page.after is not None else None

        def read(session: Session) -> Page[AgentVersion]:
            rows, token = cut_page(
                store.agent_versions_page(session, agent_id, after, page.size + 1),
                page.size,
                filters,
                lambda r: [r.publish_time, r.digest],
            )
            return Page([store.agent_version_of(session, r) for r in rows], token)

        return await self._db.read(read)

    async def compute_agent_digest(self, definition: AgentDefinition) -> ComputedDigest:
        check_definition(definition)

        def read(session: Session) -> ComputedDigest:
            digested: DigestedAgent = digest_agent(
                definition, StoreSource(session, self._components)
            )
            existing = store.agent_version_by_label(
                session, definition.agent_id, definition.version_label
            )
            return ComputedDigest(
                digested.digest,
                digested.canonical,
                closure=digested.closure,
                existing_digest=existing.digest if existing else "",
            )

        return await self._db.read(read)

    async def compute_component_digest(self, draft: ComponentDraft) -> ComputedDigest:
        digested = digest_component(draft)

        def read(session: Session) -> ComputedDigest:
            existing = store.component_by_version(session, draft.name, draft.version)
            return ComputedDigest(
                digested.digest,
                digested.canonical,
                schema_digest=digested.schema_digest,
                existing_digest=existing.digest if existing else "",
            )

        return await self._db.read(read)

    async def diff_agent_versions(
        self, base_ref: str, target_ref: str
    ) -> tuple[str, str, list[FieldChange]]:
        def read(session: Session) -> tuple[str, str, list[FieldChange]]:
            base, _ = resolve_agent(session, base_ref, field_path="base_ref", cache=self._versions)
            target, _ = resolve_agent(
                session, target_ref, field_path="target_ref", cache=self._versions
            )
            return base.digest, target.digest, diff_versions(base, target)

        return await self._db.read(read)


def _component_leaf(row: store.ComponentRow) -> Leaf:
    return component_leaf(
        digest=row.digest,
        kind=row.kind,
        name=row.name,
        version=row.version,
        principal=row.principal,
        time=row.publish_time,
    )


def _published(session: Session, digest: str) -> log_store.Proof:
    """The proof of the entry that published ``digest`` (a publish found it already there)."""
    found = log_store.publish_entry(session, digest)
    if found is None:
        raise RuntimeError(f"{digest} is published but has no entry in the registry log")
    return inclusion_in(session, *found)


def _sorted_definition(definition: AgentDefinition) -> AgentDefinition:
    """Skills and tools are sets: store them sorted, as the digest treats them."""
    return AgentDefinition(
        agent_id=definition.agent_id,
        version_label=definition.version_label,
        description=definition.description,
        system_prompt_text=definition.system_prompt_text,
        system_prompt_ref=definition.system_prompt_ref,
        model_policy=definition.model_policy,
        skills=tuple(sorted(definition.skills)),
        tools=tuple(sorted(definition.tools)),
        permission_policy=definition.permission_policy,
        completion_policy=definition.completion_policy,
    )
