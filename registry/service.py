"""The registry's use cases: publish, get, list, tag, diff.

Each public method validates what it can before touching the database, then does its reads
and writes in one transaction through :class:`agentrt_base.db.Database` (on the writer for
anything that writes). Nothing with a digest is ever updated or deleted here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt_base.auth import CALLER, TagPolicy, caller_name
from agentrt_base.db import Database, utcnow
from agentrt_core import content_limits, reasons, refs
from agentrt_core.canonical import ComponentKind
from agentrt_core.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ViolationCollector,
)
from agentrt_core.lru import LruCache
from agentrt_core.model import (
    AgentDefinition,
    AgentVersion,
    ClosureEntry,
    Component,
    ComponentDraft,
    FieldChange,
    Provenance,
    ReferenceKind,
    Resolution,
    Tag,
    TagEvent,
    VerifiedProvenance,
)
from agentrt_core.paging import cut_page, page_request
from agentrt_core.publishing import (
    ComponentSource,
    DigestedAgent,
    DigestedComponent,
    check_definition,
    digest_agent,
    digest_component,
)
from agentrt_core.tag_names import tag_spelling
from registry import store
from registry.tag_policy import check_tag_policies

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


@dataclass(frozen=True)
class ComputedDigest:
    digest: str
    canonical: bytes
    closure: tuple[ClosureEntry, ...] = ()
    schema_digest: str | None = None
    #: The digest already bound to the same label (name@version or agent@label), if any.
    existing_digest: str = ""


# -- who publishes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Publisher:
    """Who a publish is recorded as: the authenticated principal, and what its OIDC token
    proved (None unless it authenticated with one)."""

    principal: str
    verified: VerifiedProvenance | None

    @classmethod
    def of_caller(cls) -> Publisher:
        """The caller of the call being served; read on the loop, before the write runs on
        the writer's thread (which does not see the call's context)."""
        caller = CALLER.get()
        verified = (
            VerifiedProvenance(caller.claims)
            if caller is not None and caller.method == "oidc"
            else None
        )
        return cls(caller_name(), verified)

    def verified_json(self) -> str | None:
        return store.dumps(self.verified.to_json()) if self.verified is not None else None


def _verified(text: str | None) -> VerifiedProvenance | None:
    return VerifiedProvenance.from_json(store.loads(text)) if text else None


# -- row -> domain ---------------------------------------------------------------------------


def component_from_row(row: store.ComponentRow) -> Component:
    return Component(
        kind=ComponentKind(row.kind),
        name=row.name,
        version=row.version,
        digest=row.digest,
        description=row.description,
        spec=store.loads(row.spec_json),
        schema_digest=row.schema_digest,
        publish_time=row.publish_time,
        provenance=Provenance.from_json(store.loads(row.provenance_json)),
        anonymous=row.anonymous,
        principal=row.principal,
        verified=_verified(row.verified_provenance_json),
    )


def agent_version_from_row(session: Session, row: store.AgentVersionRow) -> AgentVersion:
    return AgentVersion(
        agent_id=row.agent_id,
        version_label=row.version_label,
        digest=row.digest,
        definition=AgentDefinition.from_json(store.loads(row.definition_json)),
        closure=tuple(ClosureEntry.from_json(e) for e in store.loads(row.closure_json)),
        publish_time=row.publish_time,
        provenance=Provenance.from_json(store.loads(row.provenance_json)),
        tags=tuple(store.tags_pointing_at(session, row.digest)),
        principal=row.principal,
        verified=_verified(row.verified_provenance_json),
    )


def _tag_from_row(row: store.TagRow) -> Tag:
    return Tag(
        row.agent_id,
        row.name,
        row.digest,
        row.update_time,
        row.updated_by_principal,
        row.event_sequence,
        updated_by_label=row.updated_by,
    )


def _tag_event_from_row(row: store.TagEventRow) -> TagEvent:
    return TagEvent(
        sequence=row.sequence,
        agent_id=row.agent_id,
        tag=row.tag,
        type=row.type,
        from_digest=row.from_digest,
        to_digest=row.to_digest,
        actor=row.principal,
        reason=row.reason,
        provenance=Provenance.from_json(store.loads(row.provenance_json)),
        event_time=row.event_time,
        actor_label=row.actor,
    )


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
        component = component_from_row(row)
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


# -- validation helpers ----------------------------------------------------------------------


def check_provenance(provenance: Provenance, problems: ViolationCollector) -> None:
    for key in ("publisher", "source_repo", "commit", "pipeline_url"):
        if len(getattr(provenance, key)) > content_limits.MAX_PROVENANCE_FIELD_CHARS:
            problems.add(f"provenance.{key}", "too long")
    if len(provenance.labels) > content_limits.MAX_PROVENANCE_LABELS:
        problems.add(
            "provenance.labels", f"more than {content_limits.MAX_PROVENANCE_LABELS} labels"
        )
    for key, value in provenance.labels.items():
        if len(key) > 256 or len(value) > content_limits.MAX_PROVENANCE_FIELD_CHARS:
            problems.add(f"provenance.labels[{key[:40]}]", "too long")


def _check_request_id(request_id: str, problems: ViolationCollector) -> None:
    if len(request_id) > 128:
        problems.add("request_id", "at most 128 characters")


def _digest_field(value: str, field_path: str, problems: ViolationCollector) -> None:
    if not refs.is_digest(value):
        problems.add(
            field_path, f"{value!r} is not a digest: expected 'sha256:' and 64 lowercase hex digits"
        )


def parse_lookup_ref(ref: str, field_path: str = "ref") -> refs.Ref:
    """A reference for a look-up: ranges are refused (they only mean something at publish)."""
    if not ref:
        raise InvalidArgument.for_field(field_path, "required")
    try:
        return refs.parse_ref(ref)
    except refs.RefError as exc:
        raise InvalidArgument.for_field(field_path, str(exc)) from exc


# -- agent resolution (also used by the runtime when a run is created) -----------------------


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
    version = agent_version_from_row(session, row)
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


# -- the use cases ---------------------------------------------------------------------------


class RegistryService:
    """The registry's use cases over one database."""

    def __init__(
        self,
        database: Database,
        tag_policies: Callable[[], Sequence[TagPolicy]] = lambda: (),
    ) -> None:
        self._db = database
        #: The tag policies in force (read again on every SetTag: a SIGHUP changes them).
        self._tag_policies = tag_policies
        # Immutable by digest, so caching them is always coherent, across replicas too.
        self._components: LruCache[str, Component] = LruCache(4096)
        self._versions: LruCache[str, AgentVersion] = LruCache(1024)

    # components

    async def publish_component(
        self, draft: ComponentDraft, provenance: Provenance, request_id: str = ""
    ) -> tuple[Component, bool]:
        """Store ``name@version``; identical content again returns the stored one.

        ``request_id`` is accepted for AIP-155 symmetry; publishing is idempotent by content
        already, so a retried request can never create a second version.
        """
        problems = ViolationCollector()
        check_provenance(provenance, problems)
        _check_request_id(request_id, problems)
        problems.raise_if_any()
        digested = digest_component(draft)
        publisher = Publisher.of_caller()
        return await self._write_retrying(
            lambda s: self._store_component(s, digested, provenance, publisher)
        )

    def _store_component(
        self,
        session: Session,
        digested: DigestedComponent,
        provenance: Provenance,
        publisher: Publisher,
    ) -> tuple[Component, bool]:
        draft = digested.draft
        existing = store.component_by_version(session, draft.name, draft.version)
        if existing is not None:
            if existing.digest == digested.digest:
                return component_from_row(existing), False
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
        row = self._component_row(digested, provenance, publisher)
        session.add(row)
        session.flush()
        return component_from_row(row), True

    @staticmethod
    def _component_row(
        digested: DigestedComponent, provenance: Provenance, publisher: Publisher
    ) -> store.ComponentRow:
        draft = digested.draft
        return store.ComponentRow(
            digest=digested.digest,
            kind=draft.kind.value,
            name=draft.name,
            version=draft.version,
            anonymous=not draft.name,
            description=draft.description,
            spec_json=store.dumps(digested.spec),
            schema_digest=digested.schema_digest,
            publish_time=utcnow(),
            provenance_json=store.dumps(provenance.to_json()),
            principal=publisher.principal,
            verified_provenance_json=publisher.verified_json(),
        )

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
            return component_from_row(row)

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

        def read(session: Session) -> Page[Component]:
            c = store.ComponentRow
            stmt = sa.select(c).where(~c.anonymous)
            if kind is not None:
                stmt = stmt.where(c.kind == kind.value)
            if name:
                stmt = stmt.where(c.name == name)
            if page.after is not None:
                after_name, t, after_digest = page.after
                stmt = stmt.where(
                    sa.or_(
                        c.name > after_name,
                        sa.and_(c.name == after_name, c.publish_time < t),
                        sa.and_(c.name == after_name, c.publish_time == t, c.digest < after_digest),
                    )
                )
            stmt = stmt.order_by(c.name, c.publish_time.desc(), c.digest.desc()).limit(
                page.size + 1
            )
            rows, token = cut_page(
                session.scalars(stmt).all(),
                page.size,
                filters,
                lambda r: [r.name, r.publish_time, r.digest],
            )
            return Page([component_from_row(r) for r in rows], token)

        return await self._db.read(read)

    # agent versions

    async def publish_agent_version(
        self, definition: AgentDefinition, provenance: Provenance, request_id: str = ""
    ) -> tuple[AgentVersion, bool]:
        """Resolve, digest and store an agent version; identical content is idempotent."""
        problems = ViolationCollector()
        check_provenance(provenance, problems)
        _check_request_id(request_id, problems)
        problems.raise_if_any()
        check_definition(definition)
        publisher = Publisher.of_caller()
        return await self._write_retrying(
            lambda s: self._store_agent_version(s, definition, provenance, publisher)
        )

    def _store_agent_version(
        self,
        session: Session,
        definition: AgentDefinition,
        provenance: Provenance,
        publisher: Publisher,
    ) -> tuple[AgentVersion, bool]:
        source = StoreSource(session, self._components)
        source.prefetch(definition)
        digested = digest_agent(definition, source)
        existing = store.agent_version_by_label(
            session, definition.agent_id, definition.version_label
        )
        if existing is not None:
            if existing.digest == digested.digest:
                return agent_version_from_row(session, existing), False
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
        if session.get(store.AgentRow, definition.agent_id) is None:
            session.add(
                store.AgentRow(agent_id=definition.agent_id, create_time=now, last_tag_sequence=0)
            )
        if digested.inline_prompt is not None and (
            store.component_by_digest(session, digested.inline_prompt.digest) is None
        ):
            session.add(self._component_row(digested.inline_prompt, provenance, publisher))
        stored_definition = _sorted_definition(definition)
        session.add(
            store.AgentVersionRow(
                digest=digested.digest,
                agent_id=definition.agent_id,
                version_label=definition.version_label,
                description=definition.description,
                definition_json=store.dumps(stored_definition.to_json()),
                closure_json=store.dumps([e.to_json() for e in digested.closure]),
                publish_time=now,
                provenance_json=store.dumps(provenance.to_json()),
                principal=publisher.principal,
                verified_provenance_json=publisher.verified_json(),
            )
        )
        session.flush()
        # Core executemany: one statement for the whole closure.
        session.execute(
            sa.insert(store.ClosureEntryRow),
            [
                {
                    "agent_digest": digested.digest,
                    "slot": e.slot,
                    "kind": e.kind.value,
                    "name": e.name,
                    "version": e.version,
                    "component_digest": e.digest,
                    "schema_digest": e.schema_digest,
                    "requested_ref": e.requested_ref,
                }
                for e in digested.closure
            ],
        )
        version = AgentVersion(
            agent_id=definition.agent_id,
            version_label=definition.version_label,
            digest=digested.digest,
            definition=stored_definition,
            closure=digested.closure,
            publish_time=now,
            provenance=provenance,
            principal=publisher.principal,
            verified=publisher.verified,
        )
        return version, True

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

        def read(session: Session) -> Page[AgentVersion]:
            v = store.AgentVersionRow
            stmt = sa.select(v)
            if agent_id:
                stmt = stmt.where(v.agent_id == agent_id)
            if page.after is not None:
                t = page.after[0]
                stmt = stmt.where(
                    sa.or_(
                        v.publish_time < t, sa.and_(v.publish_time == t, v.digest < page.after[1])
                    )
                )
            stmt = stmt.order_by(v.publish_time.desc(), v.digest.desc()).limit(page.size + 1)
            rows, token = cut_page(
                session.scalars(stmt).all(),
                page.size,
                filters,
                lambda r: [r.publish_time, r.digest],
            )
            return Page([agent_version_from_row(session, r) for r in rows], token)

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

    # tags

    async def set_tag(
        self,
        agent_id: str,
        tag_name: str,
        digest: str,
        *,
        expected_digest: str | None,
        expect_absent: bool,
        actor: str,
        reason: str,
        provenance: Provenance,
    ) -> tuple[Tag, TagEvent | None]:
        """Point ``agent_id:tag_name`` at ``digest`` if the expectation holds; record the move."""
        problems = ViolationCollector()
        self._check_tag_request(agent_id, tag_name, actor, reason, provenance, problems)
        if refs.is_valid_tag(tag_name) and not refs.is_settable_tag(tag_name):
            problems.add(
                "tag",
                f"{tag_name!r}: tags are set in lower case ({tag_spelling(tag_name)!r}), so no"
                " two tags differ only in case and a tag policy covers every spelling",
            )
        _digest_field(digest, "digest", problems)
        if expected_digest is not None:
            _digest_field(expected_digest, "expected_digest", problems)
        problems.raise_if_any()
        principal = caller_name()
        policies = tuple(self._tag_policies())

        def write(session: Session) -> tuple[Tag, TagEvent | None]:
            agent = self._locked_agent(session, agent_id)
            version = store.agent_version_by_digest(session, digest)
            if version is None or version.agent_id != agent_id:
                raise NotFound("agent version", f"{agent_id}@{digest}")
            current = store.tag(session, agent_id, tag_name, for_update=True)
            if current is not None and current.digest == digest:
                return _tag_from_row(current), None
            check_tag_policies(
                policies,
                agent_id,
                tag_name,
                digest,
                _verified(version.verified_provenance_json),
            )
            self._check_expectation(current, expected_digest, expect_absent)
            event = self._append_tag_event(
                session,
                agent,
                tag_name,
                "SET",
                current.digest if current else "",
                digest,
                principal,
                actor,
                reason,
                provenance,
            )
            if current is None:
                current = store.TagRow(agent_id=agent_id, name=tag_name)
                session.add(current)
            current.digest = digest
            current.update_time = event.event_time
            current.updated_by = actor
            current.updated_by_principal = principal
            current.event_sequence = event.sequence
            session.flush()
            return _tag_from_row(current), event

        return await self._write_retrying(write, conflict_is_abort=True)

    async def delete_tag(
        self,
        agent_id: str,
        tag_name: str,
        *,
        expected_digest: str,
        actor: str,
        reason: str,
        provenance: Provenance,
    ) -> TagEvent:
        problems = ViolationCollector()
        self._check_tag_request(agent_id, tag_name, actor, reason, provenance, problems)
        if expected_digest:
            _digest_field(expected_digest, "expected_digest", problems)
        problems.raise_if_any()
        principal = caller_name()

        def write(session: Session) -> TagEvent:
            agent = self._locked_agent(session, agent_id)
            current = store.tag(session, agent_id, tag_name, for_update=True)
            if current is None:
                raise NotFound("tag", f"{agent_id}:{tag_name}")
            if expected_digest:
                self._check_expectation(current, expected_digest, False)
            event = self._append_tag_event(
                session,
                agent,
                tag_name,
                "DELETE",
                current.digest,
                "",
                principal,
                actor,
                reason,
                provenance,
            )
            session.delete(current)
            session.flush()
            return event

        return await self._write_retrying(write, conflict_is_abort=True)

    async def list_tags(self, agent_id: str, page_size: int, page_token: str) -> Page[Tag]:
        filters = {"agent_id": agent_id}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(str, str),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )

        def read(session: Session) -> Page[Tag]:
            t = store.TagRow
            stmt = sa.select(t)
            if agent_id:
                stmt = stmt.where(t.agent_id == agent_id)
            if page.after is not None:
                stmt = stmt.where(
                    sa.or_(
                        t.agent_id > page.after[0],
                        sa.and_(t.agent_id == page.after[0], t.name > page.after[1]),
                    )
                )
            rows, token = cut_page(
                session.scalars(stmt.order_by(t.agent_id, t.name).limit(page.size + 1)).all(),
                page.size,
                filters,
                lambda r: [r.agent_id, r.name],
            )
            return Page([_tag_from_row(r) for r in rows], token)

        return await self._db.read(read)

    async def list_tag_history(
        self, agent_id: str, tag_name: str, page_size: int, page_token: str
    ) -> Page[TagEvent]:
        if not agent_id:
            raise InvalidArgument.for_field("agent_id", "required")
        filters = {"agent_id": agent_id, "tag": tag_name}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(int,),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )

        def read(session: Session) -> Page[TagEvent]:
            if session.get(store.AgentRow, agent_id) is None:
                raise NotFound("agent", agent_id)
            e = store.TagEventRow
            stmt = sa.select(e).where(e.agent_id == agent_id)
            if tag_name:
                stmt = stmt.where(e.tag == tag_name)
            if page.after is not None:
                stmt = stmt.where(e.sequence < page.after[0])
            rows, token = cut_page(
                session.scalars(stmt.order_by(e.sequence.desc()).limit(page.size + 1)).all(),
                page.size,
                filters,
                lambda r: [r.sequence],
            )
            return Page([_tag_event_from_row(r) for r in rows], token)

        return await self._db.read(read)

    # helpers

    @staticmethod
    def _check_tag_request(
        agent_id: str,
        tag_name: str,
        actor: str,
        reason: str,
        provenance: Provenance,
        problems: ViolationCollector,
    ) -> None:
        if not refs.is_valid_name(agent_id):
            problems.add(
                "agent_id", f"{agent_id!r} is not a valid agent id" if agent_id else "required"
            )
        if not refs.is_valid_tag(tag_name):
            problems.add(
                "tag",
                # Says what can be set (lower case: refs.is_settable_tag); a tag with capitals
                # is valid (DeleteTag takes one an older server stored) and never gets here.
                f"{tag_name!r} is not a valid tag: 1-128 of a-z 0-9 . _ -, not starting with"
                " '.' or '-', not 64 hex digits"
                if tag_name
                else "required",
            )
        if len(actor) > content_limits.MAX_ACTOR_CHARS:
            problems.add("actor", f"at most {content_limits.MAX_ACTOR_CHARS} characters")
        if len(reason) > content_limits.MAX_REASON_CHARS:
            problems.add("reason", f"at most {content_limits.MAX_REASON_CHARS} characters")
        check_provenance(provenance, problems)

    @staticmethod
    def _locked_agent(session: Session, agent_id: str) -> store.AgentRow:
        agent = store.lock_agent(session, agent_id)
        if agent is None:
            raise NotFound("agent", agent_id)
        return agent

    @staticmethod
    def _check_expectation(
        current: store.TagRow | None, expected_digest: str | None, expect_absent: bool
    ) -> None:
        current_digest = current.digest if current else ""
        if expect_absent and current is not None:
            raise FailedPrecondition(
                f"tag exists (points at {current_digest}) but was expected to be absent",
                reason=reasons.TAG_EXPECTATION_FAILED,
                metadata={"current_digest": current_digest},
            )
        if expected_digest is not None and current_digest != expected_digest:
            raise FailedPrecondition(
                f"tag points at {current_digest or 'nothing'}, expected {expected_digest}",
                reason=reasons.TAG_EXPECTATION_FAILED,
                metadata={"current_digest": current_digest},
            )

    @staticmethod
    def _append_tag_event(
        session: Session,
        agent: store.AgentRow,
        tag_name: str,
        kind: str,
        from_digest: str,
        to_digest: str,
        principal: str,
        actor: str,
        reason: str,
        provenance: Provenance,
    ) -> TagEvent:
        agent.last_tag_sequence += 1
        row = store.TagEventRow(
            agent_id=agent.agent_id,
            sequence=agent.last_tag_sequence,
            tag=tag_name,
            type=kind,
            from_digest=from_digest,
            to_digest=to_digest,
            principal=principal,
            actor=actor,
            reason=reason,
            provenance_json=store.dumps(provenance.to_json()),
            event_time=utcnow(),
        )
        session.add(row)
        return _tag_event_from_row(row)

    async def _write_retrying(
        self, fn: Callable[[Session], T], *, conflict_is_abort: bool = False
    ) -> T:
        """Run a write; on a unique-key race (two replicas inserting the same key at once on
        PostgreSQL) run it again, when it will see the winner's row. Tag moves instead
        answer ABORTED, so the caller re-reads before deciding again.

        A publish inserts up to three keys others may insert too (the agent row, an inline
        prompt, the version), and each lost race is to a committed row the next run sees, so
        it can lose at most that many times in a row; a fourth loss is a bug (INTERNAL)."""
        for _ in range(_PUBLISH_RACES):
            try:
                result: T = await self._db.write(fn)
                return result
            except sa.exc.IntegrityError as exc:
                if conflict_is_abort:
                    raise Aborted("a concurrent change won the race; re-read and retry") from exc
        retried: T = await self._db.write(fn)
        return retried


#: How many unique-key races one write may lose before its last try (see _write_retrying).
_PUBLISH_RACES = 3


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
