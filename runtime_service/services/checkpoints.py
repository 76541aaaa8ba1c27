"""Checkpoints and artifacts: what a worker saves of a run's state and what it produced."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentrt.runtime.v1 import event_pb2
from agentrt_base.db import utcnow
from agentrt_base.errors import InvalidArgument, NotFound, ViolationCollector
from agentrt_base.ids import new_id
from agentrt_base.paging import cut_page, page_request
from runtime_service import step_events
from runtime_service.blobs import require_blob
from runtime_service.records import BLANK_STEP, new_step
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.services.turns import open_turn
from runtime_service.step_rules import dumps
from runtime_service.store import transitions
from runtime_service.store.fencing import fenced
from runtime_service.store.ledger import ArtifactRow, BlobRow, CheckpointRow, StepRow

_INSERT_STEP = sa.insert(StepRow)


class CheckpointsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def write_checkpoint(
        self,
        attempt_id: str,
        lease_epoch: int,
        state_ref: str,
        after_sequence: int,
        request_id: str,
    ) -> CheckpointRow:
        if after_sequence < 0:
            raise InvalidArgument.for_field("after_sequence", "must not be negative")

        key = scoped_request_id(attempt_id, request_id)

        def write(session: Session) -> CheckpointRow:
            if key:
                earlier = session.scalar(
                    sa.select(CheckpointRow).where(CheckpointRow.request_id == key)
                )
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, attempt_id, lease_epoch)
            require_blob(session, state_ref, "state_ref")
            if after_sequence > run.last_step_sequence:
                raise InvalidArgument.for_field(
                    "after_sequence", f"beyond the run's last step ({run.last_step_sequence})"
                )
            now = utcnow()
            turn = open_turn(session, attempt)
            run.last_step_sequence += 1
            step = new_step(
                {
                    **BLANK_STEP,
                    "id": new_id("stp"),
                    "run_id": run.id,
                    "attempt_id": attempt.id,
                    "turn_id": turn.id if turn else "",
                    "sequence": run.last_step_sequence,
                    "type": "CHECKPOINT",
                    "operation": "checkpoint",
                    "status": "SUCCEEDED",
                    "input_ref": state_ref,
                    "output_ref": state_ref,
                    "start_time": now,
                    "end_time": now,
                    "input_revision": run.input_revision,
                }
            )
            checkpoint = CheckpointRow(
                id=new_id("ckp"),
                run_id=run.id,
                attempt_id=attempt.id,
                step_id=step.id,
                state_ref=state_ref,
                after_sequence=after_sequence,
                create_time=now,
                request_id=key,
            )
            session.add(checkpoint)
            run.latest_checkpoint_id = checkpoint.id
            # A checkpoint is a step of the ledger too, born ended (it resolves nothing).
            session.execute(_INSERT_STEP, step.values())
            transitions.append_run_event(session, run, step_events.started(step), now)
            transitions.append_run_event(session, run, step_events.ended(step), now)
            transitions.append_run_event(
                session,
                run,
                event_pb2.CheckpointWrittenAttributes(
                    checkpoint_id=checkpoint.id,
                    attempt_id=attempt.id,
                    step_id=step.id,
                    state_ref=state_ref,
                    after_sequence=after_sequence,
                ),
                now,
            )
            return checkpoint

        return await self._rt.write(write)

    async def create_artifact(
        self,
        attempt_id: str,
        lease_epoch: int,
        step_id: str,
        name: str,
        blob_digest: str,
        media_type: str,
        labels: dict[str, str],
        request_id: str,
    ) -> ArtifactRow:
        problems = ViolationCollector()
        if not name or len(name) > 512:
            problems.add("name", "required, at most 512 characters")
        if not step_id:
            problems.add("step_id", "required: the step that made the artifact")
        if len(labels) > 64:
            problems.add("labels", "at most 64 entries")
        problems.raise_if_any("invalid artifact")

        key = scoped_request_id(attempt_id, request_id)

        def write(session: Session) -> ArtifactRow:
            if key:
                earlier = session.scalar(
                    sa.select(ArtifactRow).where(ArtifactRow.request_id == key)
                )
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, attempt_id, lease_epoch)
            step = session.get(StepRow, step_id)
            if step is None or step.run_id != run.id:
                raise NotFound("step", step_id)
            if step.attempt_id != attempt.id:
                raise InvalidArgument.for_field("step_id", "a step of another attempt")
            require_blob(session, blob_digest, "blob_digest")
            blob = session.get(BlobRow, blob_digest)
            now = utcnow()
            artifact = ArtifactRow(
                id=new_id("art"),
                run_id=run.id,
                thread_id=run.thread_id,
                attempt_id=attempt.id,
                step_id=step.id,
                name=name,
                blob_digest=blob_digest,
                media_type=media_type or (blob.media_type if blob else ""),
                size=blob.size if blob else 0,
                labels_json=dumps(labels),
                create_time=now,
                request_id=key,
            )
            session.add(artifact)
            transitions.append_run_event(
                session,
                run,
                event_pb2.ArtifactCreatedAttributes(
                    artifact_id=artifact.id,
                    step_id=step.id,
                    name=name,
                    blob_digest=blob_digest,
                    media_type=artifact.media_type,
                ),
                now,
            )
            return artifact

        return await self._rt.write(write)

    async def list_artifacts(
        self, run_id: str, thread_id: str, page_size: int, page_token: str
    ) -> tuple[list[ArtifactRow], str]:
        if bool(run_id) == bool(thread_id):
            raise InvalidArgument.for_field("run_id", "exactly one of run_id and thread_id")
        filters = {"run_id": run_id, "thread_id": thread_id}
        page = page_request(page_size, page_token, filters, key=(str,), default=100)

        def read(session: Session) -> tuple[list[ArtifactRow], str]:
            stmt = sa.select(ArtifactRow)
            stmt = (
                stmt.where(ArtifactRow.run_id == run_id)
                if run_id
                else stmt.where(ArtifactRow.thread_id == thread_id)
            )
            if page.after is not None:
                stmt = stmt.where(ArtifactRow.id > page.after[0])
            rows = session.scalars(stmt.order_by(ArtifactRow.id).limit(page.size + 1)).all()
            return cut_page(rows, page.size, filters, lambda r: [r.id])

        return await self._rt.read(read)
