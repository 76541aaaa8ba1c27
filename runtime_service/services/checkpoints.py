"""Checkpoints and artifacts: what a worker saves of a run's state and what it produced."""

from __future__ import annotations

from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_core.errors import InvalidArgument, NotFound, ViolationCollector
from agentrt_core.paging import cut_page, page_request
from runtime_service import labels as label_rules
from runtime_service.fence import FenceClaim
from runtime_service.records import Artifact, Checkpoint, artifact_of, checkpoint_of
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.store import (
    artifacts,
    blobs,
    checkpoints,
    runs,
    step_reads,
    threads,
    turns,
)
from runtime_service.store.fencing import fenced
from runtime_service.store.ledger import ArtifactRow, CheckpointRow


class CheckpointsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def write_checkpoint(
        self,
        fence: FenceClaim,
        state_ref: str,
        after_sequence: int,
        request_id: str,
    ) -> Checkpoint:
        if after_sequence < 0:
            raise InvalidArgument.for_field("after_sequence", "must not be negative")

        key = scoped_request_id(fence.attempt_id, request_id)

        def write(session: Session) -> CheckpointRow:
            if key:
                earlier = checkpoints.by_request(session, key)
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, fence)
            blobs.require(session, run.namespace, state_ref, "state_ref")
            if after_sequence > run.last_step_sequence:
                raise InvalidArgument.for_field(
                    "after_sequence", f"beyond the run's last step ({run.last_step_sequence})"
                )
            now = utcnow()
            turn = turns.open_turn(session, attempt)
            return checkpoints.write(
                session, run, attempt, turn, state_ref, after_sequence, key, now
            )

        return checkpoint_of(await self._rt.write(write))

    async def create_artifact(
        self,
        fence: FenceClaim,
        step_id: str,
        name: str,
        blob_digest: str,
        media_type: str,
        labels: dict[str, str],
        request_id: str,
    ) -> Artifact:
        problems = ViolationCollector()
        if not name or len(name) > 512:
            problems.add("name", "required, at most 512 characters")
        if not step_id:
            problems.add("step_id", "required: the step that made the artifact")
        label_rules.check("labels", labels, problems)
        problems.raise_if_any("invalid artifact")

        key = scoped_request_id(fence.attempt_id, request_id)

        def write(session: Session) -> ArtifactRow:
            if key:
                earlier = artifacts.by_request(session, key)
                if earlier is not None:
                    return earlier
            run, attempt = fenced(session, fence)
            step = step_reads.row(session, step_id)
            if step is None or step.run_id != run.id:
                raise NotFound("step", step_id)
            if step.attempt_id != attempt.id:
                raise InvalidArgument.for_field("step_id", "a step of another attempt")
            blobs.require(session, run.namespace, blob_digest, "blob_digest")
            return artifacts.create(
                session,
                run,
                attempt,
                step,
                name,
                blob_digest,
                media_type,
                labels,
                key,
                utcnow(),
            )

        return artifact_of(await self._rt.write(write))

    async def list_artifacts(
        self, run_id: str, thread_id: str, page_size: int, page_token: str
    ) -> tuple[list[Artifact], str]:
        if bool(run_id) == bool(thread_id):
            raise InvalidArgument.for_field("run_id", "exactly one of run_id and thread_id")
        filters = {"run_id": run_id, "thread_id": thread_id}
        page = page_request(page_size, page_token, filters, key=(str,))

        def read(session: Session) -> tuple[list[ArtifactRow], str]:
            # Of a run or thread that does not exist: NOT_FOUND (the contract), not an
            # empty list that reads like "no artifacts yet".
            if run_id:
                runs.get(session, run_id)
            else:
                threads.get(session, thread_id)
            rows = artifacts.page(session, run_id, thread_id, page)
            return cut_page(rows, page.size, filters, lambda r: [r.id])

        rows, token = await self._rt.read(read)
        return [artifact_of(r) for r in rows], token
