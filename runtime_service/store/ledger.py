"""Tables of what happens inside a run: turns, steps (with the versions they resolved),
inputs, checkpoints, artifacts and content-addressed blobs."""

from __future__ import annotations

import datetime as dt
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from agentrt_base.db import Base
from runtime_service.store.tables import RunRow

_ID = sa.String(40)
_DIGEST = sa.String(71)


def _partial_index(name: str, *columns: str, where: str) -> sa.Index:
    """An index holding only the rows ``where`` selects, on both engines. Its queries repeat
    ``where`` word for word, so each engine can prove the index applies."""
    return sa.Index(name, *columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where))


class TurnRow(Base):
    __tablename__ = "runtime_turns"
    __table_args__ = (sa.UniqueConstraint("run_id", "number"),)

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"))
    attempt_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_attempts.id"), index=True)
    number: Mapped[int]
    status: Mapped[str] = mapped_column(sa.String(16))
    start_time: Mapped[dt.datetime]
    end_time: Mapped[dt.datetime | None]
    request_id: Mapped[str] = mapped_column(sa.String(128))


#: The condition of the model-call index (see StepRow), which its query repeats.
MODEL_CALLS = "type = 'MODEL_CALL'"


class StepRow(Base):
    __tablename__ = "runtime_steps"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "sequence"),
        # BeginStep's repeated-key lookup. Partial: a step without a key costs no page of
        # it; the lookups repeat the `!= ''` term so both engines can prove it applies.
        _partial_index(
            "ix_runtime_steps_run_id_idempotency_key",
            "run_id",
            "idempotency_key",
            where="idempotency_key != ''",
        ),
        # GetProvenance(blob): which steps consumed or produced a blob. Partial, so the many
        # steps without a blob cost nothing; queries repeat the `!= ''` term so both engines
        # can prove the index applies.
        _partial_index("ix_runtime_steps_input_ref", "input_ref", where="input_ref != ''"),
        _partial_index("ix_runtime_steps_output_ref", "output_ref", where="output_ref != ''"),
        # BeginStep(MODEL_CALL)'s look-up of the attempt's latest model call, which a fallback
        # follows: one index probe for max(sequence). Partial: other steps cost no page of it.
        _partial_index(
            "ix_runtime_steps_attempt_id_model_calls",
            "attempt_id",
            "sequence",
            where=MODEL_CALLS,
        ),
    )

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"))
    attempt_id: Mapped[str] = mapped_column(_ID, index=True)
    turn_id: Mapped[str] = mapped_column(_ID)
    sequence: Mapped[int] = mapped_column(sa.BigInteger)
    type: Mapped[str] = mapped_column(sa.String(24))
    operation: Mapped[str] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(24))
    idempotency_key: Mapped[str] = mapped_column(sa.String(200))
    input_ref: Mapped[str] = mapped_column(_DIGEST)
    output_ref: Mapped[str] = mapped_column(_DIGEST)
    summary: Mapped[str] = mapped_column(sa.Text)
    start_time: Mapped[dt.datetime]
    end_time: Mapped[dt.datetime | None]
    error_class: Mapped[str] = mapped_column(sa.String(32))
    error_message: Mapped[str] = mapped_column(sa.Text)
    retryable: Mapped[bool]
    retry_of_step_id: Mapped[str] = mapped_column(_ID)
    side_effect: Mapped[bool]
    input_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    output_tokens: Mapped[int] = mapped_column(sa.BigInteger)
    cost_usd: Mapped[float] = mapped_column(sa.Float)
    input_revision: Mapped[int] = mapped_column(sa.BigInteger)
    consumed_input_ids_json: Mapped[str] = mapped_column(sa.Text)
    tool_name: Mapped[str] = mapped_column(sa.String(64))
    tool_arguments_json: Mapped[str] = mapped_column(sa.Text)
    approval_decision: Mapped[str] = mapped_column(sa.String(16))
    # The approver's display label (ResolveApprovalRequest.approver) and, beside it, the
    # authenticated principal that decided (empty before migration 0012).
    approver: Mapped[str] = mapped_column(sa.String(200))
    approver_principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    approval_comment: Mapped[str] = mapped_column(sa.Text)
    approval_time: Mapped[dt.datetime | None]
    approval_step_id: Mapped[str] = mapped_column(_ID)
    completion_check: Mapped[str] = mapped_column(sa.String(200))
    # The versions resolved for the step (also indexed row by row in runtime_step_usages).
    model_policy_digest: Mapped[str] = mapped_column(_DIGEST)
    candidate_name: Mapped[str] = mapped_column(sa.String(200))
    candidate_reason: Mapped[str] = mapped_column(sa.String(32))
    provider: Mapped[str] = mapped_column(sa.String(200))
    requested_model_id: Mapped[str] = mapped_column(sa.String(200))
    parameters_json: Mapped[str] = mapped_column(sa.Text)
    reported_model_id: Mapped[str] = mapped_column(sa.String(200))
    system_prompt_digest: Mapped[str] = mapped_column(_DIGEST)
    context_digest: Mapped[str] = mapped_column(_DIGEST)
    skills_json: Mapped[str] = mapped_column(sa.Text)
    tools_json: Mapped[str] = mapped_column(sa.Text)
    # The failed model call a fallback follows (empty before migration 0014).
    fallback_from_step_id: Mapped[str] = mapped_column(_ID, server_default="")
    # The trace the step's span is in: its attempt's (the span id is a function of the step
    # id, ``trace_context.span_id_of``). Empty when the attempt was untraced.
    trace_id: Mapped[str] = mapped_column(sa.String(32), server_default="")


#: The conditions of the usage indexes (see StepUsageRow), which their queries repeat.
USAGE_HAS_DIGEST = "digest != ''"
USAGE_HAS_SCHEMA = "schema_digest != ''"
USAGE_IS_MODEL = "kind IN ('model_requested', 'model_reported')"


class StepUsageRow(Base):
    """One version a step used (skill, tool, model policy, prompt, model id): the index that
    answers "which steps used repo-debug@2.1.0 / this tool schema / model x" without
    scanning every step's JSON."""

    __tablename__ = "runtime_step_usages"
    # Each index holds only the rows its FindUsages query can ask for (a model call writes
    # three rows per step, and every index entry is work on the step path); the queries
    # repeat each index's condition word for word, so both engines can prove it applies.
    __table_args__ = (
        _partial_index(
            "ix_runtime_step_usages_digest_time", "digest", "start_time", where=USAGE_HAS_DIGEST
        ),
        _partial_index(
            "ix_runtime_step_usages_schema_digest_time",
            "schema_digest",
            "start_time",
            where=USAGE_HAS_SCHEMA,
        ),
        # FindUsages(model_id), newest first: one ordered range per (kind, model id), so the
        # first page of a model used by every step reads a page, not every use.
        _partial_index(
            "ix_runtime_step_usages_kind_name_time",
            "kind",
            "name",
            "start_time",
            where=USAGE_IS_MODEL,
        ),
    )

    step_id: Mapped[str] = mapped_column(_ID, primary_key=True)
    # `skill`, `tool`, `model_policy`, `system_prompt`, `model_requested`, `model_reported`.
    kind: Mapped[str] = mapped_column(sa.String(24), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    version: Mapped[str] = mapped_column(sa.String(128))
    digest: Mapped[str] = mapped_column(_DIGEST)
    schema_digest: Mapped[str] = mapped_column(_DIGEST)
    run_id: Mapped[str] = mapped_column(_ID)
    start_time: Mapped[dt.datetime]


class InputRow(Base):
    __tablename__ = "runtime_inputs"
    __table_args__ = (sa.Index("ix_runtime_inputs_run_id_status", "run_id", "status"),)

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"))
    kind: Mapped[str] = mapped_column(sa.String(16))
    content: Mapped[str] = mapped_column(sa.Text)
    data_json: Mapped[str] = mapped_column(sa.Text)
    # The sender's display label (SendInputRequest.sender) and, beside it, the authenticated
    # principal that sent it (empty before migration 0012).
    sender: Mapped[str] = mapped_column(sa.String(200))
    sender_principal: Mapped[str] = mapped_column(sa.String(200), server_default="")
    create_time: Mapped[dt.datetime]
    status: Mapped[str] = mapped_column(sa.String(16))
    delivered_step_id: Mapped[str] = mapped_column(_ID)
    delivered_turn_id: Mapped[str] = mapped_column(_ID)
    deliver_time: Mapped[dt.datetime | None]
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)


class CheckpointRow(Base):
    __tablename__ = "runtime_checkpoints"

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"), index=True)
    attempt_id: Mapped[str] = mapped_column(_ID)
    step_id: Mapped[str] = mapped_column(_ID)
    state_ref: Mapped[str] = mapped_column(_DIGEST, index=True)
    after_sequence: Mapped[int] = mapped_column(sa.BigInteger)
    create_time: Mapped[dt.datetime]
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)


class ArtifactRow(Base):
    __tablename__ = "runtime_artifacts"
    __table_args__ = (
        sa.Index("ix_runtime_artifacts_run_id", "run_id"),
        sa.Index("ix_runtime_artifacts_thread_id", "thread_id"),
    )

    id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, sa.ForeignKey("runtime_runs.id"))
    thread_id: Mapped[str] = mapped_column(_ID)
    attempt_id: Mapped[str] = mapped_column(_ID)
    step_id: Mapped[str] = mapped_column(_ID)
    name: Mapped[str] = mapped_column(sa.String(512))
    blob_digest: Mapped[str] = mapped_column(_DIGEST, index=True)
    media_type: Mapped[str] = mapped_column(sa.String(200))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    labels_json: Mapped[str] = mapped_column(sa.Text)
    create_time: Mapped[dt.datetime]
    request_id: Mapped[str | None] = mapped_column(sa.String(128), unique=True)


class BlobRow(Base):
    """A blob's metadata; its bytes live behind :class:`runtime_service.store.blobs.BlobStore`."""

    __tablename__ = "runtime_blobs"

    digest: Mapped[str] = mapped_column(_DIGEST, primary_key=True)
    size: Mapped[int] = mapped_column(sa.BigInteger)
    media_type: Mapped[str] = mapped_column(sa.String(200))
    create_time: Mapped[dt.datetime]


class BlobNamespaceRow(Base):
    """A namespace a blob was uploaded to: GetBlob finds a blob only in these, and its size
    counts against each one's quota (the bytes themselves are stored once)."""

    __tablename__ = "runtime_blob_namespaces"

    namespace: Mapped[str] = mapped_column(sa.String(63), primary_key=True)
    digest: Mapped[str] = mapped_column(
        _DIGEST, sa.ForeignKey("runtime_blobs.digest"), primary_key=True
    )
    size: Mapped[int] = mapped_column(sa.BigInteger)
    create_time: Mapped[dt.datetime]


class BlobContentRow(Base):
    """Blob bytes, for the embedded default store (chunked so no row is huge)."""

    __tablename__ = "runtime_blob_chunks"

    digest: Mapped[str] = mapped_column(
        _DIGEST, sa.ForeignKey("runtime_blobs.digest"), primary_key=True
    )
    chunk: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)


# FindUsages(agent_digest), newest first: the runs bound to one agent version in creation order,
# read a page at a time (the single-column agent_digest index made every first page sort all of
# that version's runs: 60 ms at 20,000 runs). runtime_runs is declared in tables.py; this index
# sits here with the ledger's other audit indexes (migration 0005).
sa.Index(
    "ix_runtime_runs_agent_digest_create_time",
    cast(sa.Table, RunRow.__table__).c.agent_digest,
    cast(sa.Table, RunRow.__table__).c.create_time,
)
