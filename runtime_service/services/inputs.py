"""SendInput: steers and follow-ups sent to a run, kept until a turn or a step takes them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from agentrt_base.auth import caller_name
from agentrt_base.db import utcnow
from agentrt_core.errors import ViolationCollector
from runtime_service import lifecycle
from runtime_service.lifecycle import RunStatus
from runtime_service.records import Input, input_of
from runtime_service.services.context import Runtime, scoped_request_id
from runtime_service.step_rules import dumps, input_too_large
from runtime_service.store import inputs
from runtime_service.store.ledger import InputRow
from runtime_service.store.runs import run_for_update


class InputsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def send_input(
        self,
        run_id: str,
        kind: str,
        content: str,
        data: dict[str, Any],
        sender: str,
        request_id: str,
    ) -> Input:
        problems = ViolationCollector()
        if kind not in ("STEER", "FOLLOW_UP"):
            problems.add("kind", "required: STEER or FOLLOW_UP")
        if not content and not data:
            problems.add("content", "required: text content or structured data")
        if len(request_id) > 128:
            problems.add("request_id", "at most 128 characters")
        problems.raise_if_any("invalid input")
        # Fix: the contract answers an input over the server limit RESOURCE_EXHAUSTED, not
        # INVALID_ARGUMENT (it is well-formed, just too big: put it in a blob).
        data_json = dumps(data)
        too_large = input_too_large(content, data)
        if too_large is not None:
            raise too_large
        key = scoped_request_id(run_id, request_id)
        principal = caller_name()

        def write(session: Session) -> InputRow:
            if key:
                earlier = inputs.by_request(session, key)
                if earlier is not None:
                    return earlier
            run = run_for_update(session, run_id)
            lifecycle.require_live(RunStatus(run.status), "it takes no more input")
            return inputs.receive(
                session, run, kind, content, data_json, sender, principal, key, utcnow()
            )

        return input_of(await self._rt.write(write))
