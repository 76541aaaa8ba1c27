"""Audit use cases: provenance, usages, event chain verification and bundle export.

Everything here only reads: each call is one read transaction (``Runtime.read``), never the
writer, so auditing cannot slow the SQLite writer down or change anything; and each call reads
one snapshot (:func:`_snapshot`), so a run's head and its events always agree. The reverse
look-ups are answered from indexes (``runtime_step_usages``, ``runtime_runs.agent_digest``)
with keyset pagination, never by scanning steps' JSON; ``docs/audit.md`` lists which index
serves which query.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import sqlalchemy as sa
from google.protobuf import json_format
from sqlalchemy.orm import Session

from agentrt_base.errors import InvalidArgument, NotFound
from agentrt_base.installation import Installation
from agentrt_base.lru import LruCache
from agentrt_base.paging import PageRequest, next_page_token, page_request
from registry import refs
from registry import service as registry_service
from registry import store as registry_store
from registry.canonical import digest_bytes
from registry.model import AgentVersion, Component
from runtime_service import audit_bundle, proto_map
from runtime_service.audit_bundle import ChainReport, Format, Link
from runtime_service.events import StoredEvent, format_time
from runtime_service.records import Step, new_step, step_of
from runtime_service.services.context import Runtime
from runtime_service.store.ledger import (
    USAGE_HAS_DIGEST,
    USAGE_HAS_SCHEMA,
    USAGE_IS_MODEL,
    ArtifactRow,
    BlobRow,
    CheckpointRow,
    StepRow,
    StepUsageRow,
)
from runtime_service.store.tables import AttemptRow, EventRow, RunRow, ThreadRow

DEFAULT_MAX_STEPS = 1000
MAX_MAX_STEPS = 10_000
#: A blob shared by many runs (a common input) could name thousands of steps; the response
#: has no paging, so it is capped (docs/audit.md says so).
MAX_BLOB_REFERENCES = 1000
MAX_BLOB_RECORDS = 50
BUNDLE_CHUNK = 1024 * 1024

_U = cast(sa.Table, StepUsageRow.__table__)
_S = cast(sa.Table, StepRow.__table__)
_R = cast(sa.Table, RunRow.__table__)
_E = cast(sa.Table, EventRow.__table__)

TargetKind = Literal["run_id", "step_id", "artifact_id", "blob_digest"]
QueryKind = Literal["component_ref", "tool_schema_digest", "agent_digest", "model_id"]
ModelMatch = Literal["ANY", "REQUESTED", "REPORTED"]


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TagAtTime:
    tag: str
    event_sequence: int
    since_time: dt.datetime


@dataclass
class ProvenanceRecord:
    """The chain behind one run (and, when asked, one step or artifact of it)."""

    run: RunRow
    thread: ThreadRow
    agent_version: AgentVersion | None
    tags_at_run_creation: list[TagAtTime]
    attempts: list[AttemptRow]
    #: The run's steps (read with Core rather than the ORM: a 200-step run is the common
    #: case, and identity-map work doubled its cost).
    steps: Sequence[Step]
    steps_truncated: bool
    artifact: ArtifactRow | None = None
    step: Step | None = None
    attempt: AttemptRow | None = None


@dataclass(frozen=True)
class BlobReference:
    digest: str
    #: STEP_INPUT, STEP_OUTPUT, CHECKPOINT or ARTIFACT (BlobRole without its prefix).
    role: str
    run_id: str
    step_id: str
    artifact_id: str = ""
    checkpoint_id: str = ""


@dataclass
class Provenance:
    records: list[ProvenanceRecord]
    blob_references: list[BlobReference] = field(default_factory=list)


@dataclass(frozen=True)
class Usage:
    run_id: str
    thread_id: str
    step_id: str
    step_sequence: int
    step_type: str
    attempt_id: str
    agent_digest: str
    matched: str
    time: dt.datetime
    #: The keyset position: (time, step or run id, usage name); unique per record.
    key: tuple[dt.datetime, str, str]


@dataclass(frozen=True)
class UsageQuery:
    kind: QueryKind
    value: str
    model_match: ModelMatch = "ANY"
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None


@dataclass(frozen=True)
class ExportedBundle:
    run_id: str
    format: Format
    media_type: str
    data: bytes
    digest: str
    installation_id: str
    export_time: dt.datetime


# -- pure helpers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TagEvent:
    sequence: int
    tag: str
    type: str
    to_digest: str
    event_time: dt.datetime


def tags_at(events: Iterable[TagEvent], digest: str) -> list[TagAtTime]:
    """The tags pointing at ``digest`` after replaying ``events`` (one agent's tag history,
    cut off at the moment of interest), each with the event that set it there."""
    latest: dict[str, TagEvent] = {}
    for event in sorted(events, key=lambda e: e.sequence):
        latest[event.tag] = event
    return sorted(
        (
            TagAtTime(tag, e.sequence, e.event_time)
            for tag, e in latest.items()
            if e.type == "SET" and e.to_digest == digest
        ),
        key=lambda t: t.tag,
    )


def _merge(pages: Sequence[Sequence[Usage]], size: int) -> tuple[list[Usage], bool]:
    """Merge per-source pages (each newest first, each ``size + 1`` long unless exhausted)
    into one page; records with the same key (one step matched twice) become one."""
    merged: dict[tuple[dt.datetime, str, str], Usage] = {}
    for page in pages:
        for usage in page:
            earlier = merged.get(usage.key)
            merged[usage.key] = usage if earlier is None else _combine(earlier, usage)
    ordered = sorted(merged.values(), key=lambda u: u.key, reverse=True)
    return ordered[:size], len(ordered) > size


def _combine(a: Usage, b: Usage) -> Usage:
    # A step whose requested and reported model are the same id matches a model query twice.
    if a.matched.endswith("(requested)") and b.matched.endswith("(reported)"):
        return dataclasses.replace(
            a, matched=a.matched.replace("(requested)", "(requested, reported)")
        )
    return a


# -- the service -----------------------------------------------------------------------------


class AuditService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        # Agent versions never change (tags are read fresh, outside this cache).
        self._versions: LruCache[str, AgentVersion] = LruCache(256)

    # -- provenance ------------------------------------------------------------------------

    async def provenance(self, kind: TargetKind, value: str, max_steps: int) -> Provenance:
        if not value:
            raise InvalidArgument.for_field("target", "required: a run, step, artifact or blob")
        if max_steps < 0:
            raise InvalidArgument.for_field("max_steps", "must not be negative")
        if kind == "blob_digest" and not refs.is_digest(value):
            raise InvalidArgument.for_field(
                "blob_digest", f"{value!r} is not a digest: expected 'sha256:' and 64 hex digits"
            )
        limit = min(max_steps or DEFAULT_MAX_STEPS, MAX_MAX_STEPS)

        def read(session: Session) -> Provenance:
            _snapshot(session)
            if kind == "run_id":
                if session.get(RunRow, value) is None:
                    raise NotFound("run", value)
                return Provenance([self._record(session, value, limit)])
            if kind == "step_id":
                step = session.get(StepRow, value)
                if step is None:
                    raise NotFound("step", value)
                return Provenance([self._record(session, step.run_id, limit, step=step)])
            if kind == "artifact_id":
                artifact = session.get(ArtifactRow, value)
                if artifact is None:
                    raise NotFound("artifact", value)
                step = session.get(StepRow, artifact.step_id)
                return Provenance(
                    [self._record(session, artifact.run_id, limit, step=step, artifact=artifact)]
                )
            return self._blob(session, value, limit)

        return await self._rt.read(read)

    def _record(
        self,
        session: Session,
        run_id: str,
        max_steps: int,
        *,
        step: StepRow | None = None,
        artifact: ArtifactRow | None = None,
    ) -> ProvenanceRecord:
        run = session.get(RunRow, run_id)
        if run is None:  # a step or artifact whose run is gone: the ledger never deletes runs
            raise NotFound("run", run_id)
        thread = session.get(ThreadRow, run.thread_id)
        assert thread is not None  # runs reference their thread by foreign key
        attempts = list(
            session.scalars(
                sa.select(AttemptRow).where(AttemptRow.run_id == run.id).order_by(AttemptRow.number)
            )
        )
        steps = [
            new_step(dict(row._mapping))
            for row in session.execute(
                sa.select(_S)
                .where(_S.c.run_id == run.id)
                .order_by(_S.c.sequence)
                .limit(max_steps + 1)
            )
        ]
        attempt_id = step.attempt_id if step is not None else ""
        return ProvenanceRecord(
            run=run,
            thread=thread,
            agent_version=self._agent_version(session, run.agent_digest),
            tags_at_run_creation=self._tags_at_creation(session, run),
            attempts=attempts,
            steps=steps[:max_steps],
            steps_truncated=len(steps) > max_steps,
            artifact=artifact,
            step=step_of(step) if step is not None else None,
            attempt=next((a for a in attempts if a.id == attempt_id), None),
        )

    def _agent_version(self, session: Session, digest: str) -> AgentVersion | None:
        version = self._versions.get(digest)
        if version is None:
            row = registry_store.agent_version_by_digest(session, digest)
            if row is None:
                return None
            version = registry_service.agent_version_from_row(session, row)
            self._versions.put(digest, version)
        # AgentVersion.tags means "now"; the tags at the run's creation are reported apart.
        return dataclasses.replace(
            version, tags=tuple(registry_store.tags_pointing_at(session, digest))
        )

    @staticmethod
    def _tags_at_creation(session: Session, run: RunRow) -> list[TagAtTime]:
        """Replay the agent's tag history up to the run's resolution.

        An event is "before" the run if its sequence is at most the one the run's tag
        resolution read (exact: that event was committed and visible), or if it was written
        no later than the resolution (by the clock, for moves of the agent's other tags).
        """
        t = registry_store.TagEventRow
        rows = session.execute(
            sa.select(t.sequence, t.tag, t.type, t.to_digest, t.event_time).where(
                t.agent_id == run.agent_id,
                sa.or_(
                    t.sequence <= run.agent_tag_event_sequence,
                    t.event_time <= run.agent_resolve_time,
                ),
            )
        ).all()
        return tags_at((TagEvent(*r) for r in rows), run.agent_digest)

    def _blob(self, session: Session, digest: str, max_steps: int) -> Provenance:
        found: list[BlobReference] = []
        for column, role in (
            (StepRow.input_ref, "STEP_INPUT"),
            (StepRow.output_ref, "STEP_OUTPUT"),
        ):
            rows = session.execute(
                sa.select(StepRow.id, StepRow.run_id)
                # `!= ""` matches the partial indexes' predicate word for word, which is
                # what lets SQLite (and PostgreSQL with a generic plan) use them.
                .where(column == digest, column != "")
                .order_by(StepRow.run_id, StepRow.sequence)
                .limit(MAX_BLOB_REFERENCES)
            ).all()
            found += [BlobReference(digest, role, r.run_id, r.id) for r in rows]
        checkpoints = session.scalars(
            sa.select(CheckpointRow)
            .where(CheckpointRow.state_ref == digest)
            .order_by(CheckpointRow.id)
            .limit(MAX_BLOB_REFERENCES)
        )
        found += [
            BlobReference(digest, "CHECKPOINT", c.run_id, c.step_id, checkpoint_id=c.id)
            for c in checkpoints
        ]
        artifacts = list(
            session.scalars(
                sa.select(ArtifactRow)
                .where(ArtifactRow.blob_digest == digest)
                .order_by(ArtifactRow.id)
                .limit(MAX_BLOB_REFERENCES)
            )
        )
        found += [
            BlobReference(digest, "ARTIFACT", a.run_id, a.step_id, artifact_id=a.id)
            for a in artifacts
        ]
        if not found and session.get(BlobRow, digest) is None:
            raise NotFound("blob", digest)
        found = found[:MAX_BLOB_REFERENCES]
        records: list[ProvenanceRecord] = []
        for run_id in dict.fromkeys(r.run_id for r in found):
            if len(records) == MAX_BLOB_RECORDS:
                break
            artifact = next((a for a in artifacts if a.run_id == run_id), None)
            # The step to feature: the one that made the artifact, else the one that output
            # the blob, else the first that touched it.
            mine = [r for r in found if r.run_id == run_id]
            step_id = (
                artifact.step_id
                if artifact is not None
                else next((r.step_id for r in mine if r.role == "STEP_OUTPUT"), mine[0].step_id)
            )
            step = session.get(StepRow, step_id) if step_id else None
            records.append(self._record(session, run_id, max_steps, step=step, artifact=artifact))
        return Provenance(records, found)

    # -- usages ----------------------------------------------------------------------------

    async def find_usages(
        self, query: UsageQuery, page_size: int, page_token: str
    ) -> tuple[list[Usage], str]:
        field_name = query.kind
        if not query.value:
            raise InvalidArgument.for_field(
                "query", "required: a component, schema, agent or model"
            )
        if query.kind in ("tool_schema_digest", "agent_digest") and not refs.is_digest(query.value):
            raise InvalidArgument.for_field(
                field_name,
                f"{query.value!r} is not a digest: expected 'sha256:' and 64 lowercase hex digits",
            )
        if query.kind == "model_id" and len(query.value) > 200:
            raise InvalidArgument.for_field("model_id", "at most 200 characters")
        if query.start_time and query.end_time and query.start_time >= query.end_time:
            raise InvalidArgument.for_field("end_time", "must be after start_time")
        component_ref: refs.Ref | None = None
        if query.kind == "component_ref":
            try:
                component_ref = refs.parse_ref(query.value)
            except refs.RefError as exc:
                raise InvalidArgument.for_field("component_ref", str(exc)) from exc
            if isinstance(component_ref, refs.TagRef):
                raise InvalidArgument.for_field(
                    "component_ref", "components have no tags: give name@version or a digest"
                )
        filters = {
            "kind": query.kind,
            "value": query.value,
            "match": query.model_match,
            "start": query.start_time,
            "end": query.end_time,
        }
        page = page_request(
            page_size, page_token, filters, key=(dt.datetime, str, str), default=100, maximum=1000
        )

        def read(session: Session) -> tuple[list[Usage], bool]:
            _snapshot(session)
            if component_ref is not None:
                return self._component_usages(session, query, component_ref, page)
            if query.kind == "tool_schema_digest":
                return _merge(
                    [
                        _step_usages(
                            session,
                            [_U.c.schema_digest == query.value, sa.text(USAGE_HAS_SCHEMA)],
                            query,
                            page,
                            lambda r: f"{r.name}@{r.version} schema {r.schema_digest}",
                        )
                    ],
                    page.size,
                )
            if query.kind == "agent_digest":
                return _merge([_run_usages(session, query.value, query, page, "")], page.size)
            kinds = {
                "REQUESTED": ["model_requested"],
                "REPORTED": ["model_reported"],
                "ANY": ["model_requested", "model_reported"],
            }[query.model_match]
            # One ordered index range per kind, merged here: an IN over both kinds would lose
            # the index order and sort every use of a popular model.
            return _merge(
                [
                    _step_usages(
                        session,
                        [_U.c.kind == kind, _U.c.name == query.value, sa.text(USAGE_IS_MODEL)],
                        query,
                        page,
                        lambda r: f"model {r.name} ({r.kind.removeprefix('model_')})",
                    )
                    for kind in kinds
                ],
                page.size,
            )

        usages, more = await self._rt.read(read)
        token = next_page_token(list(usages[-1].key), filters) if more and usages else ""
        return usages, token

    def _component_usages(
        self, session: Session, query: UsageQuery, ref: refs.Ref, page: PageRequest
    ) -> tuple[list[Usage], bool]:
        component = _component(session, ref, query.value)
        shown = (
            f"{component.ref} {component.digest}"
            if not component.anonymous
            else (f"(inline system prompt) {component.digest}")
        )
        if component.kind.value in ("PERMISSION_POLICY", "COMPLETION_POLICY"):
            # Steps do not record these policies' digests: the runs that used one are the
            # runs bound to an agent version that pins it (run-level records, step_id "").
            entries = registry_store.ClosureEntryRow
            agents = session.execute(
                sa.select(
                    entries.agent_digest,
                    registry_store.AgentVersionRow.agent_id,
                    registry_store.AgentVersionRow.version_label,
                )
                .join(
                    registry_store.AgentVersionRow,
                    registry_store.AgentVersionRow.digest == entries.agent_digest,
                )
                .where(entries.component_digest == component.digest)
            ).all()
            return _merge(
                [
                    _run_usages(session, a[0], query, page, f"{shown} (in {a[1]}@{a[2]})")
                    for a in agents
                ],
                page.size,
            )
        return _merge(
            [
                _step_usages(
                    session,
                    [_U.c.digest == component.digest, sa.text(USAGE_HAS_DIGEST)],
                    query,
                    page,
                    lambda r: shown,
                )
            ],
            page.size,
        )

    # -- chain -----------------------------------------------------------------------------

    async def verify_run(self, run_id: str) -> ChainReport:
        if not run_id:
            raise InvalidArgument.for_field("run_id", "required")

        def read(session: Session) -> ChainReport:
            _snapshot(session)
            run = session.get(RunRow, run_id)
            if run is None:
                raise NotFound("run", run_id)
            rows = session.execute(
                sa.select(_E)
                .where(_E.c.thread_id == run.thread_id, _E.c.run_id == run.id)
                .order_by(_E.c.sequence)
                .execution_options(yield_per=2000)
            )
            return audit_bundle.verify_chain(
                (_link(r) for r in rows),
                head=(run.last_event_sequence, run.last_event_hash),
                chain=(run.thread_id, run.id),
            )

        return await self._rt.read(read)

    # -- export ----------------------------------------------------------------------------

    async def export_bundle(self, run_id: str, fmt: Format) -> ExportedBundle:
        if not run_id:
            raise InvalidArgument.for_field("run_id", "required")

        def read(session: Session) -> ExportedBundle:
            _snapshot(session)
            run = session.get(RunRow, run_id)
            if run is None:
                raise NotFound("run", run_id)
            thread = session.get(ThreadRow, run.thread_id)
            assert thread is not None  # runs reference their thread by foreign key
            attempts = session.scalars(
                sa.select(AttemptRow).where(AttemptRow.run_id == run.id).order_by(AttemptRow.number)
            )
            steps = list(
                session.scalars(
                    sa.select(StepRow).where(StepRow.run_id == run.id).order_by(StepRow.sequence)
                )
            )
            artifacts = session.scalars(
                sa.select(ArtifactRow).where(ArtifactRow.run_id == run.id).order_by(ArtifactRow.id)
            )
            checkpoints = session.scalars(
                sa.select(CheckpointRow)
                .where(CheckpointRow.run_id == run.id)
                .order_by(CheckpointRow.id)
            )
            events = [
                _link(r)
                for r in session.execute(
                    sa.select(_E)
                    .where(_E.c.thread_id == run.thread_id, _E.c.run_id == run.id)
                    .order_by(_E.c.sequence)
                )
            ]
            installation = session.scalar(sa.select(Installation.installation_id)) or ""
            now = dt.datetime.now(dt.UTC)
            document = audit_bundle.build_document(
                installation_id=installation,
                export_time=format_time(now),
                run=_json(proto_map.run(run)),
                thread=_json(proto_map.thread(thread)),
                attempts=[_json(proto_map.attempt(a)) for a in attempts],
                steps=[_json(proto_map.step(step_of(s))) for s in steps],
                artifacts=[_json(proto_map.artifact(a)) for a in artifacts],
                checkpoints=[_json(proto_map.checkpoint(c)) for c in checkpoints],
                events=events,
                chain_head=(run.last_event_sequence, run.last_event_hash),
                agent=_agent_json(session, run, self._tags_at_creation(session, run)),
                components=_components_json(session, run.agent_digest),
            )
            # Encoded here, on the reader thread, so a large bundle never blocks the loop.
            data = audit_bundle.encode(document, fmt)
            return ExportedBundle(
                run.id,
                fmt,
                audit_bundle.media_type(fmt),
                data,
                digest_bytes(data),
                installation,
                now,
            )

        return await self._rt.read(read)


# -- queries ---------------------------------------------------------------------------------


def _snapshot(session: Session) -> None:
    """Make the whole read transaction one snapshot.

    SQLite's read transaction already is one (WAL). PostgreSQL's default READ COMMITTED gives
    every statement its own: VerifyRun or ExportBundle of a live run would read the run's head,
    then events appended after it, and report a break that is not there. REPEATABLE READ for a
    read-only transaction costs nothing and can never fail to serialise.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def _component(session: Session, ref: refs.Ref, text: str) -> Component:
    match ref:
        case refs.VersionRef(name=name, version=version):
            row = registry_store.component_by_version(session, name, version)
        case refs.NameDigestRef(name=name, digest=digest):
            row = registry_store.component_by_digest(session, digest)
            row = row if row is not None and row.name == name else None
        case refs.DigestRef(digest=digest):
            row = registry_store.component_by_digest(session, digest)
            if row is None:
                _refuse_other_digest(session, digest)
        case _:
            row = None
    if row is None:
        raise NotFound("component", text, f"no published component matches {text!r}")
    return registry_service.component_from_row(row)


def _refuse_other_digest(session: Session, digest: str) -> None:
    """A bare digest that is not a component's may still be one the caller can query: say
    which, rather than only "not found"."""
    if registry_store.agent_version_by_digest(session, digest) is not None:
        raise NotFound(
            "component",
            digest,
            f"{digest} is an agent version's digest, not a component's: query agent_digest "
            "(agentrt audit usages --agent) instead",
        )
    schema = sa.select(registry_store.ComponentRow.digest).where(
        registry_store.ComponentRow.schema_digest == digest
    )
    if session.execute(schema.limit(1)).first() is not None:
        raise NotFound(
            "component",
            digest,
            f"{digest} is a tool input schema digest, not a component's: query "
            "tool_schema_digest (agentrt audit usages --schema) instead",
        )


def _time_filters(column: sa.ColumnElement[Any], query: UsageQuery) -> list[sa.ColumnElement[bool]]:
    found: list[sa.ColumnElement[bool]] = []
    if query.start_time is not None:
        found.append(column >= query.start_time)
    if query.end_time is not None:
        found.append(column < query.end_time)
    return found


def _after(
    time: sa.ColumnElement[Any],
    ident: sa.ColumnElement[Any],
    name: sa.ColumnElement[Any] | None,
    key: list[Any],
) -> list[sa.ColumnElement[bool]]:
    """Rows strictly after ``key`` in newest-first order. The leading ``time <= t`` is
    redundant but bounds the index range scan (an OR alone would not)."""
    t, i, n = key
    tail: sa.ColumnElement[bool] = ident < i
    if name is not None:
        tail = sa.or_(ident < i, sa.and_(ident == i, name < n))
    return [time <= t, sa.or_(time < t, sa.and_(time == t, tail))]


def _step_usages(
    session: Session,
    where: list[sa.ColumnElement[bool] | sa.TextClause],
    query: UsageQuery,
    page: PageRequest,
    matched: Callable[[Any], str],
) -> list[Usage]:
    stmt = (
        sa.select(
            _U.c.step_id,
            _U.c.kind,
            _U.c.name,
            _U.c.version,
            _U.c.schema_digest,
            _U.c.start_time,
            _U.c.run_id,
            _S.c.sequence,
            _S.c.type,
            _S.c.attempt_id,
            _R.c.thread_id,
            _R.c.agent_digest,
        )
        .join(_S, _S.c.id == _U.c.step_id)
        .join(_R, _R.c.id == _U.c.run_id)
        .where(*where, *_time_filters(_U.c.start_time, query))
        .order_by(_U.c.start_time.desc(), _U.c.step_id.desc(), _U.c.name.desc())
        .limit(page.size + 1)
    )
    if page.after is not None:
        stmt = stmt.where(*_after(_U.c.start_time, _U.c.step_id, _U.c.name, page.after))
    return [
        Usage(
            run_id=r.run_id,
            thread_id=r.thread_id,
            step_id=r.step_id,
            step_sequence=r.sequence,
            step_type=r.type,
            attempt_id=r.attempt_id,
            agent_digest=r.agent_digest,
            matched=matched(r),
            time=r.start_time,
            key=(r.start_time, r.step_id, r.name),
        )
        for r in session.execute(stmt)
    ]


def _run_usages(
    session: Session, agent_digest: str, query: UsageQuery, page: PageRequest, matched: str
) -> list[Usage]:
    stmt = (
        sa.select(
            _R.c.id,
            _R.c.thread_id,
            _R.c.agent_digest,
            _R.c.agent_id,
            _R.c.agent_version_label,
            _R.c.create_time,
        )
        .where(_R.c.agent_digest == agent_digest, *_time_filters(_R.c.create_time, query))
        .order_by(_R.c.create_time.desc(), _R.c.id.desc())
        .limit(page.size + 1)
    )
    if page.after is not None:
        stmt = stmt.where(*_after(_R.c.create_time, _R.c.id, None, page.after))
    return [
        Usage(
            run_id=r.id,
            thread_id=r.thread_id,
            step_id="",
            step_sequence=0,
            step_type="",
            attempt_id="",
            agent_digest=r.agent_digest,
            matched=matched or f"{r.agent_id}@{r.agent_version_label} {r.agent_digest}",
            time=r.create_time,
            key=(r.create_time, r.id, ""),
        )
        for r in session.execute(stmt)
    ]


def _link(row: Any) -> Link:
    try:
        attributes = json.loads(row.attributes_json)
    except ValueError:
        return Link(
            row.id,
            row.thread_id,
            row.run_id,
            row.sequence,
            row.event_type,
            format_time(row.event_time),
            None,
            row.prev_hash,
            row.hash,
            problem=f"event {row.id} ({row.event_type}): its attributes are not valid JSON",
        )
    return Link.from_stored(
        StoredEvent(
            row.id,
            row.thread_id,
            row.run_id,
            row.sequence,
            row.thread_cursor,
            row.event_type,
            row.event_time,
            attributes,
            row.prev_hash,
            row.hash,
        )
    )


def _json(message: Any) -> dict[str, Any]:
    value: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return value


def _agent_json(session: Session, run: RunRow, tags: list[TagAtTime]) -> dict[str, Any]:
    row = registry_store.agent_version_by_digest(session, run.agent_digest)
    if row is None:
        raise NotFound("agent version", run.agent_digest)
    return {
        "agent_id": row.agent_id,
        "version_label": row.version_label,
        "digest": row.digest,
        "description": row.description,
        "definition": registry_store.loads(row.definition_json),
        "closure": registry_store.loads(row.closure_json),
        "publish_time": format_time(row.publish_time),
        "provenance": registry_store.loads(row.provenance_json),
        "tags_at_run_creation": [
            {
                "tag": t.tag,
                "event_sequence": t.event_sequence,
                "since_time": format_time(t.since_time),
            }
            for t in tags
        ],
    }


def _components_json(session: Session, agent_digest: str) -> list[dict[str, Any]]:
    c = registry_store.ComponentRow
    entries = registry_store.ClosureEntryRow
    rows = session.scalars(
        sa.select(c)
        .join(entries, entries.component_digest == c.digest)
        .where(entries.agent_digest == agent_digest)
        .order_by(entries.slot)
    )
    return [
        {
            "kind": r.kind,
            "name": r.name,
            "version": r.version,
            "description": r.description,
            "spec": registry_store.loads(r.spec_json),
            "digest": r.digest,
            "schema_digest": r.schema_digest,
        }
        for r in rows
    ]
