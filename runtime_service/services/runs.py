"""Threads, messages and runs: the client side of the ledger."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from agentrt_base.access import Visibility, check_namespace
from agentrt_base.auth import caller_name
from agentrt_base.db import utcnow
from agentrt_core import reasons
from agentrt_core.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ViolationCollector,
)
from agentrt_core.lru import LruCache
from agentrt_core.model import AgentVersion
from agentrt_core.paging import cut_page, page_request
from registry.service_lookup import resolve_agent
from runtime_service import labels as label_rules
from runtime_service import lifecycle
from runtime_service.lifecycle import Actor, ClientAsk, RunStatus, Trigger
from runtime_service.records import (
    Attempt,
    Message,
    Run,
    Thread,
    attempt_of,
    message_of,
    run_of,
    thread_of,
)
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.services.run_filters import RunFilter, check_run_filter
from runtime_service.step_rules import dumps, input_too_large
from runtime_service.store import messages, run_requests, runs, threads, transitions
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
    #: The trace context the call came in (``tracing.call_traceparent``, already valid or
    #: ""): the run records it, and its attempts' spans are its children.
    traceparent: str = ""


def _check_request_id(value: str, problems: ViolationCollector) -> None:
    if len(value) > MAX_REQUEST_ID:
        problems.add("request_id", f"at most {MAX_REQUEST_ID} characters")


def _check_map(name: str, value: dict[str, str], problems: ViolationCollector) -> None:
    if len(value) > MAX_METADATA_ENTRIES:
        problems.add(name, f"at most {MAX_METADATA_ENTRIES} entries")
    if len(dumps(value).encode()) > MAX_TEXT_BYTES:
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
    if len(dumps(spec.goal).encode()) > MAX_GOAL_BYTES:
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
    label_rules.check("labels", spec.labels, problems)
    _check_request_id(spec.request_id, problems)
    problems.raise_if_any("invalid run")


def _namespaces(requested: str, visible: Visibility) -> frozenset[str] | None:
    """The namespaces a list reads: the one asked for (if any) among those the caller may see
    (None: any)."""
    if not requested:
        return visible.namespaces
    wanted = frozenset({check_namespace(requested, "namespace")})
    return wanted if visible.namespaces is None else wanted & visible.namespaces


class RunsService:
    """Use cases of RuntimeService (threads, messages, runs)."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        # Agent versions never change: resolving `agent:prod` reads only the tag.
        self._versions: LruCache[str, AgentVersion] = LruCache(256)

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(
        self, namespace: str, title: str, metadata: dict[str, str], policy: str, request_id: str
    ) -> Thread:
        """``namespace`` as :func:`access.check_namespace` left it (the permission check
        read it first)."""
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
                existing = threads.by_request_id(session, request_id)
                if existing is not None:
                    if existing.namespace != namespace:
                        # Request ids are global: never hand another namespace its thread.
                        raise AlreadyExists(
                            "thread",
                            f"request_id {request_id}",
                            "request_id is taken by a thread of another namespace",
                        )
                    return existing
            return threads.create(
                session,
                namespace=namespace,
                title=title,
                metadata=metadata,
                concurrency_policy=policy or "REJECT",
                request_id=request_id,
                now=utcnow(),
            )

        try:
            return thread_of(await self._rt.write(write))
        except threads.RequestIdTaken:
            # Fix: a concurrent create with the same request_id committed first (the unique
            # index refused ours); the retry finds and returns its thread.
            return thread_of(await self._rt.write(write))

    async def get_thread(self, thread_id: str) -> Thread:
        return thread_of(await self._rt.read(lambda session: threads.get(session, thread_id)))

    async def list_threads(
        self,
        metadata: dict[str, str],
        namespace: str,
        visible: Visibility,
        page_size: int,
        page_token: str,
    ) -> tuple[list[Thread], str]:
        """The threads matching the filters that ``visible`` admits."""
        filters = {"metadata": metadata, "namespace": namespace}
        page = page_request(page_size, page_token, filters, key=(str,))
        namespaces = _namespaces(namespace, visible)

        def read(session: Session) -> tuple[list[ThreadRow], str]:
            after = page.after[0] if page.after is not None else None
            found = threads.page(session, metadata, namespaces, after, page.size + 1)
            return cut_page(found, page.size, filters, lambda r: [r.id])

        rows, token = await self._rt.read(read)
        return [thread_of(r) for r in rows], token

    # -- messages --------------------------------------------------------------------------

    async def append_message(
        self,
        thread_id: str,
        role: str,
        content: str,
        data: dict[str, Any],
        run_id: str,
        request_id: str = "",
    ) -> Message:
        problems = ViolationCollector()
        if role not in ROLES:
            problems.add("role", "required: USER, ASSISTANT, SYSTEM or TOOL")
        if not content and not data:
            problems.add("content", "required: text content or structured data")
        _check_request_id(request_id, problems)
        problems.raise_if_any("invalid message")
        # As for an input (SendInput): well-formed, only too big (the contract's answer).
        too_large = input_too_large(content, data)
        if too_large is not None:
            raise too_large
        # A request id names one AppendMessage within its thread (AIP-155), as for CreateRun.
        request_key = scoped_request_id(thread_id, request_id)

        def write(session: Session) -> MessageRow:
            thread = threads.for_update(session, thread_id)
            # Checked under the thread's lock, so two concurrent retries cannot both miss it.
            # A retry returns the first message as it is, whatever this request carries.
            if request_key:
                earlier = messages.by_request_id(session, request_key)
                if earlier is not None:
                    return earlier
            if run_id and runs.get(session, run_id).thread_id != thread_id:
                # Fix: the contract answers INVALID_ARGUMENT here, not NOT_FOUND.
                raise InvalidArgument.for_field("run_id", "a run of another thread")
            return messages.append(
                session,
                thread,
                request_id=request_key,
                role=role,
                content=content,
                data=data,
                run_id=run_id,
                now=utcnow(),
            )

        return message_of(await self._rt.write(write))

    async def list_messages(
        self, thread_id: str, run_id: str, newest_first: bool, page_size: int, page_token: str
    ) -> tuple[list[Message], str]:
        if not thread_id:
            raise InvalidArgument.for_field("thread_id", "required")
        filters = {"thread_id": thread_id, "run_id": run_id, "newest_first": newest_first}
        page = page_request(page_size, page_token, filters, key=(int,))

        def read(session: Session) -> tuple[list[MessageRow], str]:
            threads.get(session, thread_id)
            rows = messages.page(
                session,
                thread_id,
                run_id=run_id,
                newest_first=newest_first,
                after_seq=page.after[0] if page.after is not None else None,
                limit=page.size + 1,
            )
            return cut_page(rows, page.size, filters, lambda r: [r.seq])

        rows, token = await self._rt.read(read)
        return [message_of(r) for r in rows], token

    # -- runs ------------------------------------------------------------------------------

    async def create_run(self, spec: RunSpec) -> Run:
        check_run_spec(spec, utcnow())
        # Read here, on the call's task: the write runs on another thread, outside its context.
        principal = caller_name()

        def write(session: Session) -> RunRow:
            # Lock order (fix: CreateRun deadlocked with AcquireRun/FinishAttempt on
            # PostgreSQL): every other writer locks a run, then the thread row (appending an
            # event bumps the thread's cursor). So lock the thread's active runs *before* the
            # thread; ALLOW never looks at them and locks none.
            unlocked = threads.get(session, spec.thread_id)
            if (spec.concurrency_policy or unlocked.concurrency_policy) != "ALLOW":
                runs.lock_active(session, spec.thread_id)
            thread = threads.for_update(session, spec.thread_id)
            # A request id names one CreateRun within its thread (AIP-155). Checked under the
            # thread's lock (fix: two concurrent retries with one request_id both missed it
            # and the second insert failed INTERNAL on the unique index).
            request_key = scoped_request_id(spec.thread_id, spec.request_id)
            if request_key:
                existing = runs.by_request_id(session, request_key)
                if existing is not None:
                    return existing
            for parent_field, parent in (
                ("parent_run_id", spec.parent_run_id),
                ("derived_from_run_id", spec.derived_from_run_id),
            ):
                if parent and runs.find(session, parent) is None:
                    error = NotFound("run", parent)
                    error.metadata["field"] = parent_field
                    raise error
            version, resolution = resolve_agent(
                session, spec.agent_ref, field_path="agent_ref", cache=self._versions
            )
            now = utcnow()
            policy = spec.concurrency_policy or thread.concurrency_policy
            blocked_by = self._apply_concurrency_policy(session, thread, policy, now)
            return run_requests.create(
                session,
                run_requests.NewRun(
                    thread_id=thread.id,
                    namespace=thread.namespace,
                    request_id=request_key,
                    agent_ref=spec.agent_ref,
                    version=version,
                    resolution=resolution,
                    goal=spec.goal,
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
                    labels=spec.labels,
                    blocked_by_run_id=blocked_by,
                    creator_principal=principal,
                    traceparent=spec.traceparent,
                ),
                now,
            )

        return run_of(await self._rt.write(write))

    def _apply_concurrency_policy(
        self, session: Session, thread: ThreadRow, policy: str, now: dt.datetime
    ) -> str:
        """Apply the thread's policy to its active runs; return the run the new one waits for."""
        if policy == "ALLOW":
            return ""  # nothing to look at, and nothing to lock
        active = runs.lock_active(session, thread.id)  # already locked by create_run
        if not active:
            return ""
        if policy == "REJECT":
            raise FailedPrecondition(
                f"thread {thread.id} has an active run ({active[-1].id}, {active[-1].status}); "
                "its concurrency policy is REJECT",
                reason=reasons.THREAD_BUSY,
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
                    principal="",
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
        principal: str,
        reason: str,
    ) -> None:
        run_requests.request_stop(
            session,
            run,
            now,
            stop_reason="INTERRUPTED_BY_NEW_RUN" if interrupt else "CANCELLED_BY_USER",
            deadline=now + self._rt.settings.stop_grace,
            actor=actor,
            principal=principal,
            reason=reason,
        )

    async def get_run(self, run_id: str) -> Run:
        return run_of(await self._rt.read(lambda session: runs.get(session, run_id)))

    async def list_runs(
        self, where: RunFilter, visible: Visibility, page_size: int, page_token: str
    ) -> tuple[list[Run], str]:
        """The runs matching ``where`` that ``visible`` admits, newest first."""
        check_run_filter(where)
        start, end = where.created_from, where.created_before
        filters = {
            "thread_id": where.thread_id,
            "statuses": sorted(where.statuses),
            "agent_id": where.agent_id,
            "namespace": where.namespace,
            "agent_digest": where.agent_digest,
            "agent_tag": where.agent_tag,
            "start": start.isoformat() if start is not None else "",
            "end": end.isoformat() if end is not None else "",
        }
        page = page_request(page_size, page_token, filters, key=(str,))
        namespaces = _namespaces(where.namespace, visible)

        def read(session: Session) -> tuple[list[RunRow], str]:
            rows = runs.page(
                session,
                where,
                namespaces=namespaces,
                scopes=visible.scopes,
                after_id=page.after[0] if page.after is not None else None,
                limit=page.size + 1,
            )
            return cut_page(rows, page.size, filters, lambda r: [r.id])

        rows, token = await self._rt.read(read)
        return [run_of(r) for r in rows], token

    async def cancel_run(self, run_id: str, reason: str, actor: str) -> Run:
        """Cancel as the call's principal (``actor``: the caller's display label)."""
        principal = caller_name()

        def write(session: Session) -> RunRow:
            run = runs.run_for_update(session, run_id)
            now = utcnow()
            ask = self._ask(run, Trigger.CANCEL)
            if ask is ClientAsk.UNCHANGED:
                return run
            if ask is ClientAsk.REQUEST:
                self._request_stop(
                    session,
                    run,
                    now,
                    interrupt=False,
                    actor=actor or "client",
                    principal=principal,
                    reason=reason,
                )
                return run
            transitions.apply(
                session, run, Trigger.CANCEL, Actor.CLIENT, now, message=reason, principal=principal
            )
            return run

        return run_of(await self._rt.write(write))

    @staticmethod
    def _ask(run: RunRow, trigger: Trigger) -> ClientAsk:
        return lifecycle.client_ask(
            RunStatus(run.status),
            trigger,
            cancel_requested=run.cancel_requested,
            pause_requested=run.pause_requested,
        )

    async def pause_run(self, run_id: str, reason: str, actor: str) -> Run:
        principal = caller_name()

        def write(session: Session) -> RunRow:
            run = runs.run_for_update(session, run_id)
            now = utcnow()
            ask = self._ask(run, Trigger.PAUSE)
            if ask is ClientAsk.UNCHANGED:
                return run
            if ask is ClientAsk.REQUEST:
                run_requests.request_pause(
                    session,
                    run,
                    now,
                    deadline=now + self._rt.settings.stop_grace,
                    actor=actor or "client",
                    principal=principal,
                    reason=reason,
                )
                return run
            transitions.apply(
                session, run, Trigger.PAUSE, Actor.CLIENT, now, message=reason, principal=principal
            )
            return run

        return run_of(await self._rt.write(write))

    async def resume_run(self, run_id: str, reason: str, actor: str) -> Run:
        principal = caller_name()

        def write(session: Session) -> RunRow:
            run = runs.run_for_update(session, run_id)
            now = utcnow()
            if self._ask(run, Trigger.RESUME) is ClientAsk.WITHDRAW:
                run_requests.withdraw_pause(
                    session, run, now, actor=actor or "client", principal=principal, reason=reason
                )
                return run
            transitions.apply(
                session, run, Trigger.RESUME, Actor.CLIENT, now, message=reason, principal=principal
            )
            return run

        return run_of(await self._rt.write(write))

    async def amend_run(
        self,
        run_id: str,
        amendment: dict[str, Any],
        expected_revision: int,
        actor: str,
        request_id: str = "",
    ) -> Run:
        problems = ViolationCollector()
        _check_request_id(request_id, problems)
        if not (
            amendment.get("added_constraints")
            or amendment.get("added_acceptance_criteria")
            or amendment.get("note")
        ):
            problems.add("amendment", "required: constraints, acceptance criteria or a note")
        if len(dumps(amendment).encode()) > MAX_GOAL_BYTES:
            problems.add("amendment", f"larger than {MAX_GOAL_BYTES} bytes")
        if expected_revision < 0:
            problems.add("expected_input_revision", "must not be negative")
        problems.raise_if_any("invalid amendment")
        principal = caller_name()

        def write(session: Session) -> RunRow:
            run = runs.run_for_update(session, run_id)
            # Fix: AmendRun is idempotent by request_id (contract): a retry returns the run.
            if request_id and run_requests.has_amendment(run, request_id):
                return run
            lifecycle.require_live(RunStatus(run.status), "it cannot be amended; derive a new run")
            if expected_revision and expected_revision != run.input_revision:
                raise Aborted(
                    f"input_revision is {run.input_revision}, expected {expected_revision}",
                    reason=reasons.REVISION_MISMATCH,
                    metadata={"input_revision": str(run.input_revision)},
                )
            run_requests.amend(
                session,
                run,
                amendment,
                actor=actor,
                principal=principal,
                request_id=request_id,
                now=utcnow(),
            )
            return run

        return run_of(await self._rt.write(write))

    async def list_attempts(
        self, run_id: str, page_size: int, page_token: str
    ) -> tuple[list[Attempt], str]:
        filters = {"run_id": run_id}
        page = page_request(page_size, page_token, filters, key=(int,))

        def read(session: Session) -> tuple[list[AttemptRow], str]:
            runs.get(session, run_id)
            after = page.after[0] if page.after is not None else None
            rows = runs.attempts_page(session, run_id, after, page.size + 1)
            return cut_page(rows, page.size, filters, lambda r: [r.number])

        rows, token = await self._rt.read(read)
        return [attempt_of(r) for r in rows], token
