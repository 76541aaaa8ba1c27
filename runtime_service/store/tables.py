"""Runtime tables: threads, messages, runs, attempts, events (one schema, both engines).

Hot-path writes (run transitions, event appends, lease changes) use Core statements against
these tables; the ORM classes define the schema and serve reads.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from agentrt_base.db import Base

_ID = sa.String(40)
_DIGEST = sa.String(71)


_NAMESPACE = sa.String(63)


class ThreadRow(Base):
    __tablename__ = "runtime_threads"
    __table_args__ = (sa.Index("ix_runtime_threads_namespace_id", "namespace", "id"),)

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    # Access control (agentrt_base.access): set at creation, never changed.
    namespace: Mapped[str] = mapped_column(_NAMESPACE, server_default="default")
    title: Mapped[str] = mapped_column(sa.Text)
    metadata_json: Mapped[str] = mapped_column(sa.Text)
    concurrency_policy: Mapped[str] = mapped_column(sa.String(16))
    create_time: Mapped[dt.datetime]
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)
    # The thread's own event chain (thread.created, thread.message_appended …).
    last_event_sequence: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    last_event_hash: Mapped[str] = mapped_column(_DIGEST, default="")
    # Counts every event of the thread and of all its runs: the WatchThread cursor. Taking it
    # under the thread row's lock gives a commit order that a cursor can never skip over.
    event_cursor: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class MessageRow(Base):
    __tablename__ = "runtime_messages"
    __table_args__ = (sa.Index("ix_runtime_messages_thread_id_seq", "thread_id", "seq"),)

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    thread_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_threads.id"))
    # scoped_request_id(thread_id, request_id): AppendMessage is idempotent per thread.
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)
    # Per-thread position, so paging is exact even when ids from two replicas interleave.
    seq: Mapped[int] = mapped_column(sa.BigInteger)
    role: Mapped[str] = mapped_column(sa.String(16))
    content: Mapped[str] = mapped_column(sa.Text)
    data_json: Mapped[str] = mapped_column(sa.Text)
    run_id: Mapped[str] = mapped_column(_ID)
    create_time: Mapped[dt.datetime]


class RunRow(Base):
    __tablename__ = "runtime_runs"
    __table_args__ = (
        # The acquisition scan: eligible queued runs, highest priority, then oldest.
        sa.Index("ix_runtime_runs_queue", "status", "blocked_by_run_id", "priority", "create_time"),
        sa.Index("ix_runtime_runs_thread_id_create_time", "thread_id", "create_time"),
        sa.Index("ix_runtime_runs_deadline_time", "deadline_time"),
        sa.Index("ix_runtime_runs_namespace_id", "namespace", "id"),
        # ListRuns by status or by agent, newest (highest id) first (migration 0017).
        sa.Index("ix_runtime_runs_status_id", "status", "id"),
        sa.Index("ix_runtime_runs_agent_id_id", "agent_id", "id"),
        # By the definition and by the tag followed (migration 0018).
        sa.Index("ix_runtime_runs_agent_digest_id", "agent_digest", "id"),
        sa.Index("ix_runtime_runs_agent_resolved_via_tag_id", "agent_resolved_via_tag", "id"),
    )

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    thread_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_threads.id"))
    # The thread's, copied: every permission check on a run reads it from the run's row.
    namespace: Mapped[str] = mapped_column(_NAMESPACE, server_default="default")
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)
    # The binding: resolved once, at creation, never changed.
    agent_requested_ref: Mapped[str] = mapped_column(sa.String(200))
    agent_digest: Mapped[str] = mapped_column(_DIGEST, index=True)
    agent_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    agent_version_label: Mapped[str] = mapped_column(sa.String(128))
    agent_resolved_via_tag: Mapped[str] = mapped_column(sa.String(128))
    agent_tag_event_sequence: Mapped[int] = mapped_column(sa.BigInteger)
    # agentrt_core.model.ReferenceKind of agent_requested_ref: LABEL, DIGEST or TAG (migration 0013
    # derived it for older runs from the reference's grammar, as the registry reads it).
    agent_reference_kind: Mapped[str] = mapped_column(sa.String(16), server_default="")
    agent_resolve_time: Mapped[dt.datetime]
    goal_json: Mapped[str] = mapped_column(sa.Text)
    amendments_json: Mapped[str] = mapped_column(sa.Text)
    input_revision: Mapped[int] = mapped_column(sa.BigInteger)
    max_steps: Mapped[int] = mapped_column(sa.BigInteger)
    max_model_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    max_cost_usd: Mapped[float] = mapped_column(sa.Float)
    deadline_time: Mapped[dt.datetime | None]
    priority: Mapped[int]
    max_attempts: Mapped[int]
    parent_run_id: Mapped[str] = mapped_column(_ID)
    derived_from_run_id: Mapped[str] = mapped_column(_ID)
    permission_ceiling: Mapped[str] = mapped_column(sa.String(32))
    concurrency_policy: Mapped[str] = mapped_column(sa.String(16))
    labels_json: Mapped[str] = mapped_column(sa.Text)
    runtime_version: Mapped[str] = mapped_column(sa.String(32))
    status: Mapped[str] = mapped_column(sa.String(24))
    terminal_reason: Mapped[str] = mapped_column(sa.String(40))
    terminal_message: Mapped[str] = mapped_column(sa.Text)
    cancel_requested: Mapped[bool]
    pause_requested: Mapped[bool]
    # Why a running run was asked to stop (CANCELLED_BY_USER, INTERRUPTED_BY_NEW_RUN), until
    # the worker acknowledges or the grace period ends.
    stop_reason: Mapped[str] = mapped_column(sa.String(40))
    # When a cancel or pause of a running attempt stops waiting for the worker.
    stop_deadline_time: Mapped[dt.datetime | None]
    # ENQUEUE: not eligible for acquisition until this run of the thread has ended ("" = free).
    blocked_by_run_id: Mapped[str] = mapped_column(_ID)
    # Why the next attempt will exist (INITIAL, WORKER_LOST, RETRY_AFTER_ERROR …).
    next_attempt_reason: Mapped[str] = mapped_column(sa.String(32))
    latest_checkpoint_id: Mapped[str] = mapped_column(_ID)
    input_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    output_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    cost_usd: Mapped[float] = mapped_column(sa.Float)
    # Steps counted against max_steps (model calls, tool calls, completion checks).
    step_count: Mapped[int] = mapped_column(sa.BigInteger)
    # Every step's per-run sequence, gap-free across attempts.
    last_step_sequence: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    turn_count: Mapped[int] = mapped_column(default=0)
    attempt_count: Mapped[int]
    current_attempt_id: Mapped[str] = mapped_column(_ID)
    # The fence: bumped on every acquisition and every forced end, so a write carrying an
    # older (attempt, epoch) is refused by a guarded update.
    lease_epoch: Mapped[int] = mapped_column(sa.BigInteger)
    result_summary: Mapped[str] = mapped_column(sa.Text)
    output_ref: Mapped[str] = mapped_column(_DIGEST)
    create_time: Mapped[dt.datetime]
    start_time: Mapped[dt.datetime | None]
    end_time: Mapped[dt.datetime | None]
    update_time: Mapped[dt.datetime]
    last_event_sequence: Mapped[int] = mapped_column(sa.BigInteger)
    last_event_hash: Mapped[str] = mapped_column(_DIGEST)
    # The authenticated principal that created the run (``agentrt_base.auth.caller_name``);
    # empty for runs created before principals were recorded (migration 0012).
    creator_principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    # The W3C traceparent of the span that created the run (``agentrt_core.trace_context``):
    # its attempts' spans are its children. Empty when neither the caller nor the server
    # traced (and for runs created before traces were recorded, migration 0016).
    traceparent: Mapped[str] = mapped_column(sa.String(55), server_default="")


class AttemptRow(Base):
    __tablename__ = "runtime_attempts"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "number"),
        sa.Index("ix_runtime_attempts_status_lease_expire_time", "status", "lease_expire_time"),
    )

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"))
    number: Mapped[int]
    reason: Mapped[str] = mapped_column(sa.String(32))
    # The label the worker gave itself (AcquireRunRequest.worker_id): not an identity.
    worker_id: Mapped[str] = mapped_column(sa.String(200))
    lease_epoch: Mapped[int] = mapped_column(sa.BigInteger)
    resume_from_checkpoint_id: Mapped[str] = mapped_column(_ID)
    status: Mapped[str] = mapped_column(sa.String(24))
    start_time: Mapped[dt.datetime]
    end_time: Mapped[dt.datetime | None]
    lease_expire_time: Mapped[dt.datetime]
    # The lease length asked for at acquisition; every heartbeat renews by the same.
    lease_ttl_ms: Mapped[int] = mapped_column(sa.BigInteger)
    error_class: Mapped[str] = mapped_column(sa.String(32))
    error_message: Mapped[str] = mapped_column(sa.Text)
    retryable: Mapped[bool]
    input_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    output_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    cost_usd: Mapped[float] = mapped_column(sa.Float)
    # Its steps FAILED in a row (``step_rules.failed_in_a_row``): BeginStep ends the attempt
    # at ``step_rules.MAX_FAILED_STEPS_IN_A_ROW``.
    failed_in_a_row: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    result_summary: Mapped[str] = mapped_column(sa.Text)
    output_ref: Mapped[str] = mapped_column(_DIGEST)
    # The SHA-256 of the attempt's secret lease token (``runtime_service.fence``), never the
    # token: its worker presents it with every fenced write. Empty for attempts started
    # before tokens existed (migration 0009).
    lease_token_hash: Mapped[str] = mapped_column(sa.String(71), server_default="")
    # The authenticated principal that acquired the run: the worker's identity, and that of
    # every step the attempt records (the step writer process records no principal of its
    # own). Empty for attempts started before principals were recorded (migration 0012).
    worker_principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    # The W3C traceparent of the attempt's invoke_agent span, as AcquireRun handed it to the
    # worker (``agentrt_core.trace_context.attempt_context``); empty when untraced.
    traceparent: Mapped[str] = mapped_column(sa.String(55), server_default="")


class EventRow(Base):
    """One durable fact. A chain is (thread_id, run_id): a run's events, or (run_id "") the
    thread's own events; ``sequence`` is gap-free within the chain and ``hash`` links to the
    previous event's hash.

    A run's events are read through the chain's unique index, so queries for them name the
    run's thread too (no second index on run_id: each is a page more per event written)."""

    __tablename__ = "runtime_events"
    __table_args__ = (
        sa.UniqueConstraint("thread_id", "run_id", "sequence"),
        sa.UniqueConstraint("thread_id", "thread_cursor"),
    )

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    thread_id: Mapped[str] = mapped_column(_ID)
    run_id: Mapped[str] = mapped_column(_ID)
    sequence: Mapped[int] = mapped_column(sa.BigInteger)
    thread_cursor: Mapped[int] = mapped_column(sa.BigInteger)
    event_type: Mapped[str] = mapped_column(sa.String(40))
    event_time: Mapped[dt.datetime]
    attributes_json: Mapped[str] = mapped_column(sa.Text)
    prev_hash: Mapped[str] = mapped_column(_DIGEST)
    hash: Mapped[str] = mapped_column(_DIGEST)


class SavedViewRow(Base):
    """A runs list's filters a principal saved under a name (SaveView): console state, not
    ledger. One per (principal, name); a principal lists its own, by name."""

    __tablename__ = "runtime_saved_views"

    principal: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    #: The RunsQuery in the proto3 JSON mapping (proto field names).
    query_json: Mapped[str] = mapped_column(sa.Text)
    create_time: Mapped[dt.datetime]
    update_time: Mapped[dt.datetime]
