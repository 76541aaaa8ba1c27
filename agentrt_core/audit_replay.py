"""A run's events replayed into the rows they say the read APIs serve (``audit_rows``
compares these with what is served).

One method per event type (:class:`_Replay`, :data:`_HANDLERS`): what each event commits a
row to, read in chain order, as the runtime wrote it (tokens and cost summed in event order,
as the step writer sums them; a run or attempt not ended serves the sum so far). Pure: no
database, no protobuf, no server (the offline verifier runs it on a file).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrt_core.usage_rows import reported_usage_rows, usage_rows

#: The row kinds, in the order rows are compared and reported.
KINDS = ("run", "attempt", "step", "checkpoint", "artifact", "input", "usage")
#: The usage kinds a step can have several rows of (one per skill, one per tool): their
#: rows are told apart by name. Every other kind is at most one row per step, its name (a
#: model id) a compared field.
NAMED_USAGE_KINDS = ("skill", "tool")


def usage_id(row: Mapping[str, Any]) -> str:
    """The id a usage index row is reported by: ``STEP_ID/KIND`` (``stp_1/model_requested``),
    and ``STEP_ID/KIND/NAME`` for a skill or a tool (``stp_1/skill/repo-debug``), the table's
    key less what the kind makes unique."""
    step_id, kind = str(row.get("step_id") or ""), str(row.get("kind") or "")
    if kind in NAMED_USAGE_KINDS:
        return f"{step_id}/{kind}/{row.get('name') or ''}"
    return f"{step_id}/{kind}"


class EventLike(Protocol):
    """What the comparison reads of an event (``audit_chain.Link`` has it)."""

    @property
    def event_type(self) -> str: ...

    @property
    def event_time(self) -> str: ...

    @property
    def attributes(self) -> Any: ...


@dataclass
class Derived:
    record_format: int = 0
    rows: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )


def _int64(value: int) -> str | None:
    return str(value) if value else None


class _Usage:
    """Tokens and cost summed in event order, as the step writer sums them."""

    def __init__(self) -> None:
        self.input_tokens, self.output_tokens, self.cost_usd = 0, 0, 0.0

    def add(self, usage: Mapping[str, Any]) -> None:
        self.input_tokens += int(usage.get("input_tokens", 0))
        self.output_tokens += int(usage.get("output_tokens", 0))
        self.cost_usd += float(usage.get("cost_usd", 0.0))

    def served(self) -> dict[str, Any]:
        return {
            "input_tokens": _int64(self.input_tokens),
            "output_tokens": _int64(self.output_tokens),
            "cost_usd": self.cost_usd,
        }


def derive(events: Iterable[EventLike], run_id: str, thread_id: str) -> Derived:
    """Replay the run's events into the rows they say the read APIs serve."""
    replay = _Replay(run_id, thread_id)
    for event in events:
        attributes = event.attributes if isinstance(event.attributes, dict) else {}
        handler = _HANDLERS.get(event.event_type)
        if handler is not None:
            handler(replay, attributes, event.event_time)
    return replay.finish()


#: What each row kind takes from ``run.created`` and ``attempt.started``, ``step.started``,
#: ``step.ended``, ``checkpoint.written``, ``artifact.created``, ``input.received``: the
#: attributes named as the served field is.
_RUN_CREATED_FIELDS = (
    "agent",
    "goal",
    "budget",
    "deadline_time",
    "priority",
    "max_attempts",
    "permission_ceiling",
    "concurrency_policy",
    "parent_run_id",
    "derived_from_run_id",
    "runtime_version",
    "creator_principal",
    "labels",
)
_ATTEMPT_STARTED_FIELDS = (
    "number",
    "reason",
    "worker_id",
    "lease_epoch",
    "resume_from_checkpoint_id",
    "worker_principal",
)
_STEP_STARTED_FIELDS = (
    "attempt_id",
    "turn_id",
    "type",
    "operation",
    "status",
    "idempotency_key",
    "input_ref",
    "retry_of_step_id",
    "tool_name",
    "versions",
    "input_revision",
    "approval_step_id",
    "completion_check",
)
_STEP_ENDED_FIELDS = (
    "status",
    "output_ref",
    "error_class",
    "error_message",
    "side_effect",
    "usage",
    "summary",
    "retryable",
)
_CHECKPOINT_FIELDS = ("attempt_id", "step_id", "state_ref")
_ARTIFACT_FIELDS = ("step_id", "name", "blob_digest", "media_type", "attempt_id", "size", "labels")
_INPUT_FIELDS = ("kind", "sender", "sender_principal")


def _pick(attributes: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {key: attributes.get(key) for key in keys}


class _Replay:
    """The rows as the events so far say they are served: one method per event type (in
    :data:`_HANDLERS`), each given the event's attributes and time."""

    def __init__(self, run_id: str, thread_id: str) -> None:
        self.run_id, self.thread_id = run_id, thread_id
        self.out = Derived()
        rows = self.out.rows
        self.runs, self.attempts, self.steps = rows["run"], rows["attempt"], rows["step"]
        self.inputs = rows["input"]
        # Until run.created is seen (a chain without it has its run reported as not recorded).
        self.run: dict[str, Any] = {"amendments": []}
        self.run_usage = _Usage()
        self.attempt_usage: dict[str, _Usage] = {}
        self.step_attempt: dict[str, str] = {}

    # -- the run ---------------------------------------------------------------------------

    def run_created(self, a: Mapping[str, Any], time: str) -> None:
        self.out.record_format = int(a.get("record_format", 0))
        self.run = _pick(a, _RUN_CREATED_FIELDS)
        self.run.update(
            id=self.run_id,
            thread_id=self.thread_id,
            amendments=[],
            input_revision="1",
            status="RUN_STATUS_QUEUED",
            create_time=time,
            attempt_count=0,
        )
        self.runs[self.run_id] = self.run

    def run_status_changed(self, a: Mapping[str, Any], time: str) -> None:
        status = a.get("status", "")
        self.run["status"] = status
        if status == "RUN_STATUS_RUNNING":
            self.run.setdefault("start_time", time)
        else:
            self.run["cancel_requested"] = self.run["pause_requested"] = False

    def run_ended(self, a: Mapping[str, Any], time: str) -> None:
        self.run_status_changed(a, time)
        self.run.update(
            terminal_reason=a.get("terminal_reason"),
            terminal_message=a.get("terminal_message"),
            usage=a.get("usage"),
            output_ref=a.get("output_ref"),
            result_summary=a.get("result_summary"),
            end_time=time,
        )
        for item in self.inputs.values():
            if item["status"] == "INPUT_STATUS_PENDING":
                item["status"] = "INPUT_STATUS_DISCARDED"

    def run_amended(self, a: Mapping[str, Any], time: str) -> None:
        self.run["amendments"].append(a.get("amendment", {}))
        self.run["input_revision"] = str(1 + len(self.run["amendments"]))

    def run_cancel_requested(self, a: Mapping[str, Any], time: str) -> None:
        self.run["cancel_requested"], self.run["pause_requested"] = True, False

    def run_pause_requested(self, a: Mapping[str, Any], time: str) -> None:
        self.run["pause_requested"] = True

    def run_resume_requested(self, a: Mapping[str, Any], time: str) -> None:
        self.run["pause_requested"] = False

    # -- attempts and steps ----------------------------------------------------------------

    def attempt_started(self, a: Mapping[str, Any], time: str) -> None:
        attempt_id = str(a.get("attempt_id", ""))
        self.attempts[attempt_id] = {
            **_pick(a, _ATTEMPT_STARTED_FIELDS),
            "run_id": self.run_id,
            "status": "ATTEMPT_STATUS_ACTIVE",
            "start_time": time,
        }
        self.attempt_usage[attempt_id] = _Usage()
        self.run["attempt_count"] = self.run.get("attempt_count", 0) + 1
        self.run["current_attempt_id"] = attempt_id

    def attempt_ended(self, a: Mapping[str, Any], time: str) -> None:
        attempt_id = str(a.get("attempt_id", ""))
        self.attempts.setdefault(attempt_id, {}).update(
            status=a.get("status"),
            error=a.get("error"),
            usage=a.get("usage"),
            result_summary=a.get("result_summary"),
            output_ref=a.get("output_ref"),
            end_time=time,
        )
        self.run["current_attempt_id"] = ""

    def step_started(self, a: Mapping[str, Any], time: str) -> None:
        step_id = str(a.get("step_id", ""))
        self.step_attempt[step_id] = str(a.get("attempt_id", ""))
        self.steps[step_id] = {
            **_pick(a, _STEP_STARTED_FIELDS),
            "run_id": self.run_id,
            "sequence": a.get("step_sequence"),
            "tool_arguments": a.get("tool_arguments_digest"),
            "consumed_input_ids": [],
            "start_time": time,
        }
        sequence = int(a.get("step_sequence", 0) or 0)
        if sequence > int(self.run.get("step_count") or 0):
            self.run["step_count"] = str(sequence)

    def step_ended(self, a: Mapping[str, Any], time: str) -> None:
        step_id = str(a.get("step_id", ""))
        step = self.steps.setdefault(step_id, {})
        step.update(_pick(a, _STEP_ENDED_FIELDS))
        step["end_time"] = time
        reported = a.get("reported_model_id")
        if reported:
            versions = dict(step.get("versions") or {})
            versions["model"] = {**(versions.get("model") or {}), "reported_model_id": reported}
            step["versions"] = versions
        usage = a.get("usage") or {}
        self.run_usage.add(usage)
        owner = self.attempt_usage.get(self.step_attempt.get(step_id, ""))
        if owner is not None:
            owner.add(usage)

    def approval_resolved(self, a: Mapping[str, Any], time: str) -> None:
        step = self.steps.setdefault(str(a.get("step_id", "")), {})
        decision = a.get("decision", "")
        step["status"] = (
            "STEP_STATUS_SUCCEEDED"
            if decision == "APPROVAL_DECISION_APPROVE"
            else "STEP_STATUS_DENIED"
        )
        step["end_time"] = time
        step["approval"] = {
            "decision": decision,
            "approver": a.get("approver"),
            "comment": a.get("comment"),
            "resolve_time": time,
            "approver_principal": a.get("approver_principal"),
        }

    # -- what steps leave behind, and inputs -----------------------------------------------

    def checkpoint_written(self, a: Mapping[str, Any], time: str) -> None:
        checkpoint_id = str(a.get("checkpoint_id", ""))
        self.out.rows["checkpoint"][checkpoint_id] = {
            **_pick(a, _CHECKPOINT_FIELDS),
            "after_sequence": a.get("after_sequence"),
            "run_id": self.run_id,
            "create_time": time,
        }
        self.run["latest_checkpoint_id"] = checkpoint_id

    def artifact_created(self, a: Mapping[str, Any], time: str) -> None:
        self.out.rows["artifact"][str(a.get("artifact_id", ""))] = {
            **_pick(a, _ARTIFACT_FIELDS),
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "create_time": time,
        }

    def input_received(self, a: Mapping[str, Any], time: str) -> None:
        self.inputs[str(a.get("input_id", ""))] = {
            **_pick(a, _INPUT_FIELDS),
            "content": a.get("content_digest"),
            "data": a.get("data_digest"),
            "run_id": self.run_id,
            "status": "INPUT_STATUS_PENDING",
            "create_time": time,
        }

    def input_consumed(self, a: Mapping[str, Any], time: str) -> None:
        input_id, step_id = str(a.get("input_id", "")), str(a.get("step_id", ""))
        self.inputs.setdefault(input_id, {}).update(
            status="INPUT_STATUS_DELIVERED",
            delivered_step_id=step_id,
            delivered_turn_id=a.get("turn_id"),
            deliver_time=time,
        )
        if step_id:
            self.steps.setdefault(step_id, {}).setdefault("consumed_input_ids", []).append(input_id)

    # -- after the last event --------------------------------------------------------------

    def finish(self) -> Derived:
        """The live totals (a run or attempt that has not ended serves the sum of its steps'
        usage) and the usage index rows each step's committed versions give."""
        run = self.run
        if run and "end_time" not in run:
            run["usage"] = self.run_usage.served()
        for attempt_id, attempt in self.attempts.items():
            if "end_time" not in attempt and attempt_id in self.attempt_usage:
                attempt["usage"] = self.attempt_usage[attempt_id].served()
        for step_id, step in self.steps.items():
            uses = _committed_versions(step_id, self.run_id, step)
            for row in usage_rows(uses) + reported_usage_rows(uses):
                self.out.rows["usage"][usage_id(row)] = row
        return self.out


#: The replay step for each event type that feeds a served row (others feed none).
_HANDLERS: dict[str, Callable[[_Replay, Mapping[str, Any], str], None]] = {
    "run.created": _Replay.run_created,
    "run.status_changed": _Replay.run_status_changed,
    "run.ended": _Replay.run_ended,
    "run.amended": _Replay.run_amended,
    "run.cancel_requested": _Replay.run_cancel_requested,
    "run.pause_requested": _Replay.run_pause_requested,
    "run.resume_requested": _Replay.run_resume_requested,
    "attempt.started": _Replay.attempt_started,
    "attempt.ended": _Replay.attempt_ended,
    "step.started": _Replay.step_started,
    "step.ended": _Replay.step_ended,
    "approval.resolved": _Replay.approval_resolved,
    "checkpoint.written": _Replay.checkpoint_written,
    "artifact.created": _Replay.artifact_created,
    "input.received": _Replay.input_received,
    "input.consumed": _Replay.input_consumed,
}


@dataclass(frozen=True)
class _CommittedVersions:
    """A step's versions as its events committed to them, in the form the step path builds
    its usage rows from (``agentrt_core.usage_rows.UsedVersions``: a step's columns, which
    ``proto_map.step_versions_without_context`` maps to the served ``versions``; this is
    that mapping read backwards)."""

    id: str
    run_id: str
    start_time: Any
    model_policy_digest: str
    requested_model_id: str
    reported_model_id: str
    system_prompt_digest: str
    skills_json: str
    tools_json: str


def _committed_versions(step_id: str, run_id: str, step: Mapping[str, Any]) -> _CommittedVersions:
    versions = step.get("versions") or {}
    model = versions.get("model") or {}
    skills = [
        {key: skill.get(key, "") for key in ("name", "version", "digest")}
        for skill in versions.get("skills") or []
    ]
    tools = [
        {key: tool.get(key, "") for key in ("name", "version", "digest", "schema_digest")}
        for tool in versions.get("tools") or []
    ]
    return _CommittedVersions(
        id=step_id,
        run_id=run_id,
        start_time=step.get("start_time"),
        model_policy_digest=model.get("policy_digest", ""),
        requested_model_id=model.get("requested_model_id", ""),
        reported_model_id=model.get("reported_model_id", ""),
        system_prompt_digest=versions.get("system_prompt_digest", ""),
        skills_json=json.dumps(skills),
        tools_json=json.dumps(tools),
    )
