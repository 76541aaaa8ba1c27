"""Audit use cases: provenance, event chain verification and bundle export (the reverse
look-ups, ``FindUsages``, are ``services/usages.py``).

Everything here only reads: each call is one read transaction (``Runtime.read``), never the
writer, so auditing cannot slow the SQLite writer down or change anything; and each call reads
one snapshot (``store.audit_reads.snapshot``), so a run's head and its events always agree. The
queries are in ``store/audit_reads.py`` and ``store/audit_blobs.py``; what the answers look
like on the wire (messages, the bundle's bytes) is the servicer's (``servicers/audit.py``,
``servicers/audit_export.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.orm import Session

from agentrt_base.access import Visibility
from agentrt_core import refs
from agentrt_core.audit_bundle import Link
from agentrt_core.audit_chain import ChainReport, verify_chain
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.lru import LruCache
from agentrt_core.model import AgentVersion
from registry import store as registry_store
from runtime_service.records import (
    Artifact,
    Attempt,
    BundledAgent,
    BundledComponent,
    Checkpoint,
    Input,
    Run,
    Step,
    Thread,
    step_of,
)
from runtime_service.services.context import Runtime
from runtime_service.store import audit_blobs, audit_reads, blobs, step_reads
from runtime_service.store.ledger import StepRow

DEFAULT_MAX_STEPS = 1000
MAX_MAX_STEPS = 10_000
#: A blob shared by many runs (a common input) could name thousands of steps; the response
#: has no paging, so it is capped (docs/audit.md says so).
MAX_BLOB_REFERENCES = 1000
MAX_BLOB_RECORDS = 50

TargetKind = Literal["run_id", "step_id", "artifact_id", "blob_digest"]


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TagAtTime:
    tag: str
    event_sequence: int
    since_time: dt.datetime


@dataclass
class ProvenanceRecord:
    """The chain behind one run (and, when asked, one step or artifact of it)."""

    run: Run
    thread: Thread
    agent_version: AgentVersion | None
    tags_at_run_creation: list[TagAtTime]
    attempts: list[Attempt]
    #: The run's steps, the first ``max_steps`` of them.
    steps: Sequence[Step]
    steps_truncated: bool
    artifact: Artifact | None = None
    step: Step | None = None
    attempt: Attempt | None = None


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
class BundleContents:
    """Everything an audit bundle holds, read in one snapshot: the run, what happened in it,
    its event chain, and the agent version it was bound to with that version's components."""

    installation_id: str
    #: When the snapshot was read (the bundle's ``export_time``).
    export_time: dt.datetime
    run: Run
    thread: Thread
    attempts: list[Attempt]
    steps: list[Step]
    artifacts: list[Artifact]
    checkpoints: list[Checkpoint]
    inputs: list[Input]
    events: list[Link]
    agent: BundledAgent
    tags_at_run_creation: list[TagAtTime]
    #: The components the agent version pins, in its closure's slot order.
    components: list[BundledComponent]


@dataclass(frozen=True)
class RunVerification:
    """What ``VerifyRun`` read in one snapshot: the chain's verdict, and every row the read
    APIs serve for the run with the events to compare them with (the comparison,
    ``audit_rows.compare``, runs on the rows as served: the servicer maps them)."""

    chain: ChainReport
    run: Run
    attempts: list[Attempt]
    steps: list[Step]
    artifacts: list[Artifact]
    checkpoints: list[Checkpoint]
    inputs: list[Input]
    events: list[Link]
    #: The usage index rows of the run's steps (``FindUsages``' and ``GetProvenance``'s
    #: index), as their columns.
    usages: list[dict[str, Any]] = field(default_factory=list)


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


# -- the service -----------------------------------------------------------------------------


class AuditService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        # Agent versions never change (tags are read fresh, outside this cache).
        self._versions: LruCache[str, AgentVersion] = LruCache(256)

    # -- provenance ------------------------------------------------------------------------

    async def provenance(
        self, kind: TargetKind, value: str, max_steps: int, visible: Visibility
    ) -> Provenance:
        """What produced and used the target. A blob's references span runs: only those of
        runs ``visible`` admits are told (a run, step or artifact target was checked whole
        before the call)."""
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
            audit_reads.snapshot(session)
            if kind == "run_id":
                if audit_reads.run(session, value) is None:
                    raise NotFound("run", value)
                return Provenance([self._record(session, value, limit)])
            if kind == "step_id":
                step = step_reads.row(session, value)
                if step is None:
                    raise NotFound("step", value)
                return Provenance([self._record(session, step.run_id, limit, step=step)])
            if kind == "artifact_id":
                artifact = audit_reads.artifact(session, value)
                if artifact is None:
                    raise NotFound("artifact", value)
                step = step_reads.row(session, artifact.step_id)
                return Provenance(
                    [self._record(session, artifact.run_id, limit, step=step, artifact=artifact)]
                )
            return self._blob(session, value, limit, visible)

        return await self._rt.read(read)

    def _record(
        self,
        session: Session,
        run_id: str,
        max_steps: int,
        *,
        step: StepRow | None = None,
        artifact: Artifact | None = None,
    ) -> ProvenanceRecord:
        run = audit_reads.run(session, run_id)
        if run is None:  # a step or artifact whose run is gone: the ledger never deletes runs
            raise NotFound("run", run_id)
        attempts = audit_reads.attempts_of_run(session, run.id)
        steps = audit_reads.steps_of_run(session, run.id, limit=max_steps + 1)
        attempt_id = step.attempt_id if step is not None else ""
        return ProvenanceRecord(
            run=run,
            thread=audit_reads.thread_of_run(session, run),
            agent_version=self._agent_version(session, run.agent_digest),
            tags_at_run_creation=_tags_at_creation(session, run),
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
            version = registry_store.agent_version_of(session, row)
            self._versions.put(digest, version)
        # AgentVersion.tags means "now"; the tags at the run's creation are reported apart.
        return dataclasses.replace(
            version, tags=tuple(registry_store.tags_pointing_at(session, digest))
        )

    def _blob(
        self, session: Session, digest: str, max_steps: int, visible: Visibility
    ) -> Provenance:
        found: list[BlobReference] = []
        sides: tuple[tuple[audit_blobs.StepSide, str], ...] = (
            ("input_ref", "STEP_INPUT"),
            ("output_ref", "STEP_OUTPUT"),
        )
        ns = visible.namespaces
        for side, role in sides:
            rows = audit_blobs.steps_with_blob(session, digest, side, MAX_BLOB_REFERENCES, ns)
            found += [BlobReference(digest, role, r.run_id, r.id) for r in rows]
        checkpoints = audit_blobs.checkpoints_with_state(session, digest, MAX_BLOB_REFERENCES, ns)
        found += [
            BlobReference(digest, "CHECKPOINT", c.run_id, c.step_id, checkpoint_id=c.id)
            for c in checkpoints
        ]
        artifacts = audit_blobs.artifacts_with_blob(session, digest, MAX_BLOB_REFERENCES, ns)
        found += [
            BlobReference(digest, "ARTIFACT", a.run_id, a.step_id, artifact_id=a.id)
            for a in artifacts
        ]
        # Content only other namespaces hold (or use) is not found, as for content nobody
        # stores: an empty answer would tell this caller that another tenant has it.
        known = bool(found) or (
            blobs.exists(session, digest) if ns is None else blobs.held_in_any(session, ns, digest)
        )
        if not known:
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
            step = step_reads.row(session, step_id) if step_id else None
            records.append(self._record(session, run_id, max_steps, step=step, artifact=artifact))
        return Provenance(records, found)

    # -- chain -----------------------------------------------------------------------------

    async def verify_run(self, run_id: str) -> RunVerification:
        """The run's chain verified, and its served rows with its events (one snapshot)."""
        if not run_id:
            raise InvalidArgument.for_field("run_id", "required")

        def read(session: Session) -> RunVerification:
            audit_reads.snapshot(session)
            run = audit_reads.run(session, run_id)
            if run is None:
                raise NotFound("run", run_id)
            events = list(audit_reads.chain_links(session, run))
            return RunVerification(
                chain=verify_chain(
                    events,
                    head=(run.last_event_sequence, run.last_event_hash),
                    chain=(run.thread_id, run.id),
                ),
                run=run,
                attempts=audit_reads.attempts_of_run(session, run.id),
                steps=audit_reads.steps_of_run(session, run.id),
                artifacts=audit_reads.artifacts_of_run(session, run.id),
                checkpoints=audit_reads.checkpoints_of_run(session, run.id),
                inputs=audit_reads.inputs_of_run(session, run.id),
                events=events,
                usages=audit_reads.usages_of_run(session, run.id),
            )

        return await self._rt.read(read)

    # -- export ----------------------------------------------------------------------------

    async def bundle_contents(self, run_id: str) -> BundleContents:
        """What the run's audit bundle holds, read in one snapshot (the servicer encodes it:
        ``servicers/audit_export.py``)."""
        if not run_id:
            raise InvalidArgument.for_field("run_id", "required")

        def read(session: Session) -> BundleContents:
            audit_reads.snapshot(session)
            run = audit_reads.run(session, run_id)
            if run is None:
                raise NotFound("run", run_id)
            thread = audit_reads.thread_of_run(session, run)
            attempts = audit_reads.attempts_of_run(session, run.id)
            steps = audit_reads.steps_of_run(session, run.id)
            artifacts = audit_reads.artifacts_of_run(session, run.id)
            checkpoints = audit_reads.checkpoints_of_run(session, run.id)
            inputs = audit_reads.inputs_of_run(session, run.id)
            events = list(audit_reads.chain_links(session, run))
            installation = audit_reads.installation_id(session)
            now = dt.datetime.now(dt.UTC)
            tags = _tags_at_creation(session, run)
            agent = audit_reads.agent_version_as_stored(session, run.agent_digest)
            if agent is None:
                raise NotFound("agent version", run.agent_digest)
            return BundleContents(
                installation_id=installation,
                export_time=now,
                run=run,
                thread=thread,
                attempts=attempts,
                steps=steps,
                artifacts=artifacts,
                checkpoints=checkpoints,
                inputs=inputs,
                events=events,
                agent=agent,
                tags_at_run_creation=tags,
                components=audit_reads.closure_components(session, run.agent_digest),
            )

        return await self._rt.read(read)


# -- helpers ---------------------------------------------------------------------------------


def _tags_at_creation(session: Session, run: Run) -> list[TagAtTime]:
    """The tags pointing at the run's agent version when the run resolved it: its agent's tag
    history replayed up to the run's resolution (``audit_reads.tag_events_before`` says
    which events that is)."""
    rows = audit_reads.tag_events_before(session, run)
    return tags_at((TagEvent(*r) for r in rows), run.agent_digest)
