"""Threads, messages and runs: the client side of the ledger."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import enum_pb2, event_pb2
from agentrt_base.db import utcnow
from agentrt_base.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ViolationCollector,
)
from agentrt_base.ids import new_id
from agentrt_base.lru import LruCache
from agentrt_base.paging import cut_page, page_request
from registry.model import AgentVersion
from registry.service import resolve_agent
from runtime_service import __version__, events, notify
from runtime_service.lifecycle import TERMINAL, Actor, RunStatus, Trigger
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.store import transitions
from runtime_service.store.runs import run_for_update
from runtime_service.store.tables import AttemptRow, MessageRow, RunRow, ThreadRow

#: Documented limits (docs/lifecycle.md, "Limits").
MAX_GOAL_BYTES = 64 * 1024
MAX_TEXT_BYTES = 256 * 1024
MAX_METADATA_ENTRIES = 64
MAX_REQUEST_ID = 128
MAX_ATTEMPTS_LIMIT = 100
POLICIES = ("REJECT", "ENQUEUE", "INTERRUPT", "ALLOW")
CEILINGS = ("FULL", "APPROVE_SIDE_EFFECTS", "READ_ONLY")
ROLES = ("USER", "ASSISTANT", "SYSTEM", "TOOL")
ACTIVE = tuple(s.value for s in RunStatus if s not in TERMINAL)


@dataclass(frozen=True)
class RunSpec:
    """What a client asks for in CreateRun (validated by :func:`check_run_spec`)."""

    thread_id: str
    agent_ref: str
    goal: dict[str, Any]
    max_steps: int = 0
    max_model_tokens: int = 0
    max_cost_usd: float = 0.0
    deadline_time: dt.datetime | None = None
    priority: int = 0
    max_attempts: int = 0
    parent_run_id: str = ""
    derived_from_run_id: str = ""
    permission_ceiling: str = ""
    concurrency_policy: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    request_id: str = ""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _check_request_id(value: str, problems: ViolationCollector) -> None:
    if len(value) > MAX_REQUEST_ID:
        problems.add("request_id", f"at most {MAX_REQUEST_ID} characters")


def _check_map(name: str, value: dict[str, str], problems: ViolationCollector) -> None:
    if len(value) > MAX_METADATA_ENTRIES:
        problems.add(name, f"at most {MAX_METADATA_ENTRIES} entries")
    if len(_dumps(value).encode()) > MAX_TEXT_BYTES:
        problems.add(name, f"larger than {MAX_TEXT_BYTES} bytes")


def check_run_spec(spec: RunSpec, now: dt.datetime) -> None:
    """Every field violation of a CreateRun at once.

    Raises:
        InvalidArgument: naming each bad field.
    """
    problems = ViolationCollector()
    if not spec.thread_id:
        problems.add("thread_id", "required")
    if not spec.agent_ref:
        problems.add("agent_ref", "required: a label (name@label), a digest or a tag (name:tag)")
    if not str(spec.goal.get("objective", "")).strip():
        problems.add("goal.objective", "required")
    if len(_dumps(spec.goal).encode()) > MAX_GOAL_BYTES:
        problems.add("goal", f"larger than the limit of {MAX_GOAL_BYTES} bytes")
    for name in ("max_steps", "max_model_tokens"):
        if getattr(spec, name) < 0:
            problems.add(f"budget.{name}", "must not be negative (0 means no limit)")
    if spec.max_cost_usd < 0 or spec.max_cost_usd != spec.max_cost_usd:
        problems.add("budget.max_cost_usd", "must be a non-negative number (0 means no limit)")
    if spec.deadline_time is not None and spec.deadline_time <= now:
        problems.add("deadline_time", "is in the past")
    if not -1000 <= spec.priority <= 1000:
        problems.add("priority", "must be between -1000 and 1000")
    if not 0 <= spec.max_attempts <= MAX_ATTEMPTS_LIMIT:
        problems.add("max_attempts", f"must be between 0 (default) and {MAX_ATTEMPTS_LIMIT}")
    if spec.permission_ceiling not in ("", *CEILINGS):
        problems.add("permission_ceiling", "unknown value")
    if spec.concurrency_policy not in ("", *POLICIES):
        problems.add("concurrency_policy", "unknown value")
    _check_map("labels", spec.labels, problems)
    _check_request_id(spec.request_id, problems)
    problems.raise_if_any("invalid run")


def _thread_for_update(session: Session, thread_id: str) -> ThreadRow:
    thread = session.scalar(sa.select(ThreadRow).where(ThreadRow.id == thread_id).with_for_update())
    if thread is None:
        raise NotFound("thread", thread_id)
    return thread


def _lock_active_runs(session: Session, thread_id: str) -> list[RunRow]:
    """The thread's non-terminal runs, oldest first, locked."""
    return list(
        session.scalars(
            sa.select(RunRow)
            .where(RunRow.thread_id == thread_id, RunRow.status.in_(ACTIVE))
            .order_by(RunRow.create_time)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )


def _append_thread_event(
    session: Session, thread: ThreadRow, attributes: object, now: dt.datetime
) -> None:
    chain = events.Chain(thread.id, "", thread.last_event_sequence, thread.last_event_hash)
    events.append(session.connection(), chain, attributes, now)  # type: ignore[arg-type]
    # On PostgreSQL the cursor was bumped by a Core UPDATE (events.append): keep the ORM
    # object from writing it back stale.
    session.expire(thread, ["event_cursor"])
    thread.last_event_sequence, thread.last_event_hash = chain.last_sequence, chain.last_hash
    notify.wake(session, notify.thread_key(thread.id))


class RunsService:
    """Use cases of RuntimeService (threads, messages, runs)."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        # Agent versions never change: resolving `agent:prod` reads only the tag.
        self._versions: LruCache[str, AgentVersion] = LruCache(256)

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(
        self, title: str, metadata: dict[str, str], policy: str, request_id: str
    ) -> ThreadRow:
        problems = ViolationCollector()
        if len(title.encode()) > 4096:
            problems.add("title", "at most 4096 bytes")
        _check_map("metadata", metadata, problems)
        if policy not in ("", *POLICIES):
            problems.add("concurrency_policy", "unknown value")
        _check_request_id(request_id, problems)
        problems.raise_if_any("invalid thread")

        def write(session: Session) -> ThreadRow:
            if request_id:
                existing = session.scalar(
                    sa.select(ThreadRow).where(ThreadRow.request_id == request_id)
                )
                if existing is not None:
                    return existing
            now = utcnow()
            thread = ThreadRow(
                id=new_id("thr"),
                title=title,
                metadata_json=_dumps(metadata),
                concurrency_policy=policy or "REJECT",
                create_time=now,
                request_id=request_id or None,
                last_event_sequence=0,
                last_event_hash="",
                event_cursor=0,
            )
            session.add(thread)
            session.flush()
            _append_thread_event(
                session,
                thread,
                event_pb2.ThreadCreatedAttributes(
                    title=title,
                    concurrency_policy=enum_pb2.ConcurrencyPolicy.Value(
                        f"CONCURRENCY_POLICY_{thread.concurrency_policy}"
                    ),
                ),
                now,
            )
            session.flush()
            session.refresh(thread)
            return thread

        try:
            return await self._rt.write(write)
        except sa.exc.IntegrityError:
            if not request_id:
                raise
            # Fix: a concurrent create with the same request_id committed first (the unique
            # index refused ours); the retry finds and returns its thread.
            return await self._rt.write(write)

    async def get_thread(self, thread_id: str) -> ThreadRow:
        def read(session: Session) -> ThreadRow:
            thread = session.get(ThreadRow, thread_id)
            if thread is None:
                raise NotFound("thread", thread_id)
            return thread

        return await self._rt.read(read)

    async def list_threads(
        self, metadata: dict[str, str], page_size: int, page_token: str
    ) -> tuple[list[ThreadRow], str]:
        filters = {"metadata": metadata}
        page = page_request(page_size, page_token, filters, key=(str,), default=50)

        def read(session: Session) -> tuple[list[ThreadRow], str]:
            stmt = sa.select(ThreadRow).order_by(ThreadRow.id.desc())
            if page.after is not None:
                stmt = stmt.where(ThreadRow.id < page.after[0])
            found: list[ThreadRow] = []
            # Metadata is matched in Python: threads are few per page and the filter is
            # an exact match on a handful of keys.
            for thread in session.scalars(stmt).yield_per(200):
                meta = json.loads(thread.metadata_json)
                if all(meta.get(k) == v for k, v in metadata.items()):
                    found.append(thread)
                    if len(found) > page.size:
                        break
            return cut_page(found, page.size, filters, lambda r: [r.id])

        return await self._rt.read(read)

    # -- messages --------------------------------------------------------------------------

    async def append_message(
        self,
        thread_id: str,
        role: str,
        content: str,
        data: dict[str, Any],
        run_id: str,
        request_id: str = "",
    ) -> MessageRow:
        problems = ViolationCollector()
        if role not in ROLES:
            problems.add("role", "required: USER, ASSISTANT, SYSTEM or TOOL")
        if len(content.encode()) + len(_dumps(data).encode()) > MAX_TEXT_BYTES:
            problems.add("content", f"content and data together exceed {MAX_TEXT_BYTES} bytes")
        if not content and not data:
            problems.add("content", "required: text content or structured data")
        _check_request_id(request_id, problems)
        problems.raise_if_any("invalid message")
        # A request id names one AppendMessage within its thread (AIP-155), as for CreateRun.
        request_key = scoped_request_id(thread_id, request_id)

        def write(session: Session) -> MessageRow:
            thread = _thread_for_update(session, thread_id)
            # Checked under the thread's lock, so two concurrent retries cannot both miss it.
            # A retry returns the first message as it is, whatever this request carries.
            if request_key:
                earlier = session.scalar(
                    sa.select(MessageRow).where(MessageRow.request_id == request_key)
                )
                if earlier is not None:
                    return earlier
            if run_id:
                run = session.get(RunRow, run_id)
                if run is None:
                    raise NotFound("run", run_id)
                if run.thread_id != thread_id:
                    # Fix: the contract answers INVALID_ARGUMENT here, not NOT_FOUND.
                    raise InvalidArgument.for_field("run_id", "a run of another thread")
            now = utcnow()
            last = session.scalar(
                sa.select(sa.func.max(MessageRow.seq)).where(MessageRow.thread_id == thread_id)
            )
            message = MessageRow(
                id=new_id("msg"),
                thread_id=thread_id,
                request_id=request_key,
                seq=(last or 0) + 1,
                role=role,
                content=content,
                data_json=_dumps(data),
                run_id=run_id,
                create_time=now,
            )
            session.add(message)
            _append_thread_event(
                session,
                thread,
                event_pb2.ThreadMessageAppendedAttributes(
                    message_id=message.id,
                    role=enum_pb2.MessageRole.Value(f"MESSAGE_ROLE_{role}"),
                    run_id=run_id,
                ),
                now,
            )
            return message

        return await self._rt.write(write)

    async def list_messages(
        self, thread_id: str, run_id: str, newest_first: bool, page_size: int, page_token: str
    ) -> tuple[list[MessageRow], str]:
        if not thread_id:
            raise InvalidArgument.for_field("thread_id", "required")
        filters = {"thread_id": thread_id, "run_id": run_id, "newest_first": newest_first}
        page = page_request(page_size, page_token, filters, key=(int,), default=50)

        def read(session: Session) -> tuple[list[MessageRow], str]:
            if session.get(ThreadRow, thread_id) is None:
                raise NotFound("thread", thread_id)
            m = MessageRow
            stmt = sa.select(m).where(m.thread_id == thread_id)
            if run_id:
                stmt = stmt.where(m.run_id == run_id)
            if page.after is not None:
                stmt = stmt.where(m.seq < page.after[0] if newest_first else m.seq > page.after[0])
            stmt = stmt.order_by(m.seq.desc() if newest_first else m.seq).limit(page.size + 1)
            return cut_page(session.scalars(stmt).all(), page.size, filters, lambda r: [r.seq])

        return await self._rt.read(read)

    # -- runs ------------------------------------------------------------------------------

    async def create_run(self, spec: RunSpec) -> RunRow:
        check_run_spec(spec, utcnow())

        def write(session: Session) -> RunRow:
            # Lock order (fix: CreateRun deadlocked with AcquireRun/FinishAttempt on
            # PostgreSQL): every other writer locks a run, then the thread row (appending an
            # event bumps the thread's cursor). So lock the thread's active runs *before* the
            # thread; ALLOW never looks at them and locks none.
            unlocked = session.get(ThreadRow, spec.thread_id)
            if unlocked is None:
                raise NotFound("thread", spec.thread_id)
            if (spec.concurrency_policy or unlocked.concurrency_policy) != "ALLOW":
                _lock_active_runs(session, spec.thread_id)
            thread = _thread_for_update(session, spec.thread_id)
            # A request id names one CreateRun within its thread (AIP-155). Checked under the
            # thread's lock (fix: two concurrent retries with one request_id both missed it
            # and the second insert failed INTERNAL on the unique index).
            request_key = scoped_request_id(spec.thread_id, spec.request_id)
            if request_key:
                existing = session.scalar(sa.select(RunRow).where(RunRow.request_id == request_key))
                if existing is not None:
                    return existing
            for parent_field, parent in (
                ("parent_run_id", spec.parent_run_id),
                ("derived_from_run_id", spec.derived_from_run_id),
            ):
                if parent and session.get(RunRow, parent) is None:
                    error = NotFound("run", parent)
                    error.metadata["field"] = parent_field
                    raise error
            version, resolution = resolve_agent(
                session, spec.agent_ref, field_path="agent_ref", cache=self._versions
            )
            now = utcnow()
            policy = spec.concurrency_policy or thread.concurrency_policy
            blocked_by = self._apply_concurrency_policy(session, thread, policy, now)
            run = RunRow(
                id=new_id("run"),
                thread_id=thread.id,
                request_id=request_key,
                agent_requested_ref=spec.agent_ref,
                agent_digest=version.digest,
                agent_id=version.agent_id,
                agent_version_label=version.version_label,
                agent_resolved_via_tag=resolution.tag,
                agent_tag_event_sequence=resolution.tag_event_sequence,
                agent_resolve_time=resolution.resolve_time,
                goal_json=_dumps(spec.goal),
                amendments_json="[]",
                input_revision=1,
                max_steps=spec.max_steps,
                max_model_tokens=spec.max_model_tokens,
                max_cost_usd=spec.max_cost_usd,
                deadline_time=spec.deadline_time,
                priority=spec.priority,
                max_attempts=spec.max_attempts or self._rt.settings.default_max_attempts,
                parent_run_id=spec.parent_run_id,
                derived_from_run_id=spec.derived_from_run_id,
                permission_ceiling=spec.permission_ceiling or "FULL",
                concurrency_policy=policy,
                labels_json=_dumps(spec.labels),
                runtime_version=__version__,
                status=RunStatus.QUEUED.value,
                terminal_reason="",
                terminal_message="",
                cancel_requested=False,
                pause_requested=False,
                stop_reason="",
                stop_deadline_time=None,
                blocked_by_run_id=blocked_by,
                next_attempt_reason="INITIAL",
                latest_checkpoint_id="",
                input_tokens=0,
                output_tokens=0,
                cost_usd=0.0,
                step_count=0,
                last_step_sequence=0,
                turn_count=0,
                attempt_count=0,
                current_attempt_id="",
                lease_epoch=0,
                result_summary="",
                output_ref="",
                create_time=now,
                start_time=None,
                end_time=None,
                update_time=now,
                last_event_sequence=0,
                last_event_hash="",
            )
            session.add(run)
            session.flush()
            from runtime_service import proto_map  # the event carries the run's own view

            transitions.append_run_event(
                session,
                run,
                event_pb2.RunCreatedAttributes(
                    agent=proto_map.binding(run),
                    goal=proto_map.goal(run),
                    budget=proto_map.budget(run),
                    deadline_time=proto_map.timestamp(run.deadline_time),
                    priority=run.priority,
                    max_attempts=run.max_attempts,
                    permission_ceiling=enum_pb2.PermissionCeiling.Value(
                        f"PERMISSION_CEILING_{run.permission_ceiling}"
                    ),
                    concurrency_policy=enum_pb2.ConcurrencyPolicy.Value(
                        f"CONCURRENCY_POLICY_{policy}"
                    ),
                    parent_run_id=run.parent_run_id,
                    derived_from_run_id=run.derived_from_run_id,
                    runtime_version=run.runtime_version,
                ),
                now,
            )
            if not blocked_by:
                notify.wake(session, notify.WORK)
            return run

        return await self._rt.write(write)

    def _apply_concurrency_policy(
        self, session: Session, thread: ThreadRow, policy: str, now: dt.datetime
    ) -> str:
        """Apply the thread's policy to its active runs; return the run the new one waits for."""
        if policy == "ALLOW":
            return ""  # nothing to look at, and nothing to lock
        active = _lock_active_runs(session, thread.id)  # already locked by create_run
        if not active:
            return ""
        if policy == "REJECT":
            raise FailedPrecondition(
                f"thread {thread.id} has an active run ({active[-1].id}, {active[-1].status}); "
                "its concurrency policy is REJECT",
                reason="THREAD_BUSY",
                metadata={"active_run_id": active[-1].id},
            )
        if policy == "ENQUEUE":
            return active[-1].id
        # INTERRUPT: end what can end now; ask running ones to stop and wait for the last.
        waiting_for = ""
        for run in active:
            if run.status == RunStatus.RUNNING.value:
                self._request_stop(
                    session,
                    run,
                    now,
                    interrupt=True,
                    actor="runtime",
                    reason="interrupted by a new run in the thread",
                )
                waiting_for = run.id
            else:
                transitions.apply(
                    session,
                    run,
                    Trigger.INTERRUPT,
                    Actor.RUNTIME,
                    now,
                    message="interrupted by a new run in the thread",
                )
        return waiting_for

    def _request_stop(
        self,
        session: Session,
        run: RunRow,
        now: dt.datetime,
        *,
        interrupt: bool,
        actor: str,
        reason: str,
    ) -> None:
        run.cancel_requested = True
        run.pause_requested = False  # a cancel overrides a pause not yet acknowledged
        run.stop_reason = "INTERRUPTED_BY_NEW_RUN" if interrupt else "CANCELLED_BY_USER"
        run.stop_deadline_time = now + self._rt.settings.stop_grace
        run.update_time = now
        transitions.append_run_event(
            session, run, event_pb2.RunCancelRequestedAttributes(actor=actor, reason=reason), now
        )

    async def get_run(self, run_id: str) -> RunRow:
        def read(session: Session) -> RunRow:
            run = session.get(RunRow, run_id)
            if run is None:
                raise NotFound("run", run_id)
            return run

        return await self._rt.read(read)

    async def list_runs(
        self, thread_id: str, statuses: list[str], agent_id: str, page_size: int, page_token: str
    ) -> tuple[list[RunRow], str]:
        filters = {"thread_id": thread_id, "statuses": sorted(statuses), "agent_id": agent_id}
        page = page_request(page_size, page_token, filters, key=(str,), default=50)

        def read(session: Session) -> tuple[list[RunRow], str]:
            stmt = sa.select(RunRow)
            if thread_id:
                stmt = stmt.where(RunRow.thread_id == thread_id)
            if statuses:
                stmt = stmt.where(RunRow.status.in_(statuses))
            if agent_id:
                stmt = stmt.where(RunRow.agent_id == agent_id)
            if page.after is not None:
                stmt = stmt.where(RunRow.id < page.after[0])
            rows = session.scalars(stmt.order_by(RunRow.id.desc()).limit(page.size + 1)).all()
            return cut_page(rows, page.size, filters, lambda r: [r.id])

        return await self._rt.read(read)

    async def cancel_run(self, run_id: str, reason: str, actor: str) -> RunRow:
        def write(session: Session) -> RunRow:
            run = run_for_update(session, run_id)
            now = utcnow()
            status = RunStatus(run.status)
            if status is RunStatus.CANCELLED:
                return run  # fix: cancelling a CANCELLED run returns it unchanged (contract)
            if status is RunStatus.RUNNING:
                if not run.cancel_requested:
                    self._request_stop(
                        session, run, now, interrupt=False, actor=actor or "client", reason=reason
                    )
                return run
            transitions.apply(session, run, Trigger.CANCEL, Actor.CLIENT, now, message=reason)
            return run

        return await self._rt.write(write)

    async def pause_run(self, run_id: str, reason: str, actor: str) -> RunRow:
        def write(session: Session) -> RunRow:
            run = run_for_update(session, run_id)
            now = utcnow()
            status = RunStatus(run.status)
            if status is RunStatus.PAUSED or (status is RunStatus.RUNNING and run.pause_requested):
                return run  # already paused, or pausing: asking again changes nothing
            if status is RunStatus.RUNNING:
                if run.cancel_requested:
                    raise FailedPrecondition(
                        "run is RUNNING with a cancel pending: it cannot be paused",
                        reason="ILLEGAL_TRANSITION",
                        metadata={"current_status": run.status},
                    )
                run.pause_requested = True
                run.stop_deadline_time = now + self._rt.settings.stop_grace
                run.update_time = now
                transitions.append_run_event(
                    session,
                    run,
                    event_pb2.RunPauseRequestedAttributes(actor=actor or "client", reason=reason),
                    now,
                )
                return run
            transitions.apply(session, run, Trigger.PAUSE, Actor.CLIENT, now, message=reason)
            return run

        return await self._rt.write(write)

    async def resume_run(self, run_id: str, reason: str, actor: str) -> RunRow:
        def write(session: Session) -> RunRow:
            run = run_for_update(session, run_id)
            now = utcnow()
            if run.status == RunStatus.RUNNING.value and run.pause_requested:
                # Not yet paused: withdrawing the request is the resume.
                run.pause_requested = False
                run.stop_deadline_time = None
                run.update_time = now
                transitions.append_run_event(
                    session,
                    run,
                    event_pb2.RunResumeRequestedAttributes(actor=actor or "client", reason=reason),
                    now,
                )
                return run
            transitions.apply(session, run, Trigger.RESUME, Actor.CLIENT, now, message=reason)
            return run

        return await self._rt.write(write)

    async def amend_run(
        self,
        run_id: str,
        amendment: dict[str, Any],
        expected_revision: int,
        actor: str,
        request_id: str = "",
    ) -> RunRow:
        problems = ViolationCollector()
        _check_request_id(request_id, problems)
        if not (
            amendment.get("added_constraints")
            or amendment.get("added_acceptance_criteria")
            or amendment.get("note")
        ):
            problems.add("amendment", "required: constraints, acceptance criteria or a note")
        if len(_dumps(amendment).encode()) > MAX_GOAL_BYTES:
            problems.add("amendment", f"larger than {MAX_GOAL_BYTES} bytes")
        if expected_revision < 0:
            problems.add("expected_input_revision", "must not be negative")
        problems.raise_if_any("invalid amendment")

        def write(session: Session) -> RunRow:
            run = run_for_update(session, run_id)
            # Fix: AmendRun is idempotent by request_id (contract). The key is kept in the
            # amendment's stored record (the proto mapping ignores it): a retry returns the run.
            if request_id and any(
                a.get("request_id") == request_id for a in json.loads(run.amendments_json)
            ):
                return run
            if RunStatus(run.status).terminal:
                raise FailedPrecondition(
                    f"run is {run.status} (it has ended): it cannot be amended; derive a new run",
                    reason="RUN_ENDED",
                    metadata={"current_status": run.status},
                )
            if expected_revision and expected_revision != run.input_revision:
                raise Aborted(
                    f"input_revision is {run.input_revision}, expected {expected_revision}",
                    reason="REVISION_MISMATCH",
                    metadata={"input_revision": str(run.input_revision)},
                )
            now = utcnow()
            run.input_revision += 1
            record = {
                **amendment,
                "input_revision": run.input_revision,
                "actor": actor,
                "create_time": events.format_time(now),
            }
            if request_id:
                record["request_id"] = request_id
            run.amendments_json = _dumps([*json.loads(run.amendments_json), record])
            run.update_time = now
            from runtime_service import proto_map

            transitions.append_run_event(
                session,
                run,
                event_pb2.RunAmendedAttributes(amendment=proto_map.amendment(record)),
                now,
            )
            return run

        return await self._rt.write(write)

    async def list_attempts(
        self, run_id: str, page_size: int, page_token: str
    ) -> tuple[list[AttemptRow], str]:
        filters = {"run_id": run_id}
        page = page_request(page_size, page_token, filters, key=(int,), default=50)

        def read(session: Session) -> tuple[list[AttemptRow], str]:
            if session.get(RunRow, run_id) is None:
                raise NotFound("run", run_id)
            stmt = sa.select(AttemptRow).where(AttemptRow.run_id == run_id)
            if page.after is not None:
                stmt = stmt.where(AttemptRow.number > page.after[0])
            rows = session.scalars(stmt.order_by(AttemptRow.number).limit(page.size + 1)).all()
            return cut_page(rows, page.size, filters, lambda r: [r.number])

        return await self._rt.read(read)
