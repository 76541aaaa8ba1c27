"""The ledger in the OpenTelemetry GenAI conventions: what span an attempt and a step are,
with which attributes, and what they add to the GenAI metrics.

One mapping, used by the spans (``runtime_service.ledger_telemetry``), by the OTLP metrics and by
their Prometheus equivalents (``runtime_service.run_metrics``), so a span, an OTLP point and
a Prometheus sample of one step say the same. Pure: records in, plain values out.

The conventions followed are those of ``open-telemetry/semantic-conventions-genai`` at the
commit :data:`CONVENTIONS` names (the repository has no tagged release yet; everything in it
is Development status); the YAML of its attribute registry, spans and metrics is vendored in
``third_party/otel-semconv-genai`` and tests check every emitted ``gen_ai.*`` attribute's
name and type, each span's required attributes and each metric's instrument, unit and
attributes against it (``tests/genai_registry.py``). How this mapping reads them:

* an attempt is the conventions' *client* ``invoke_agent {gen_ai.agent.name}`` span (kind
  CLIENT): the server hands the run to a worker, a remote agent service in the conventions'
  words, which is the type that carries ``gen_ai.agent.id`` and ``gen_ai.agent.version``
  (the internal type has neither). Its ``gen_ai.provider.name`` (required for that type) is
  the provider of the model policy's primary candidate, the one an attempt starts with;
* skills are attributes of a model call's span (``agentrt.skills``), not spans: a skill is
  resolved into the prompt of a model call and does not run on its own, so it has no
  duration of its own to show;
* steps the conventions have no operation for (an approval request, a completion check, a
  checkpoint) are INTERNAL spans named for the step type, with ``agentrt.*`` attributes only;
* ``gen_ai.tool.call.id`` is not set: the ledger keys a tool call by its step, not by the
  id the model gave it (``agentrt.step.id`` names it).

Everything agentrt adds is under ``agentrt.``: the agent's digest, run, attempt and step ids,
the candidate chosen and why, the skills and the tool's pinned versions and schema digest.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentrt_base.metrics import (
    GENAI_AGENT_DURATION,
    GENAI_OPERATION_DURATION,
    GENAI_TOKEN_USAGE,
    GENAI_TOOL_DURATION,
    Spec,
)
from runtime_service.observations import AttemptTrace
from runtime_service.records import Attempt, Step

#: The GenAI conventions this mapping follows (third_party/otel-semconv-genai/README.md).
CONVENTIONS: Final = "open-telemetry/semantic-conventions-genai@004902b8cb70 (untagged)"

CHAT: Final = "chat"
EXECUTE_TOOL: Final = "execute_tool"
INVOKE_AGENT: Final = "invoke_agent"

#: A step did what it was for only when it SUCCEEDED: a failed, denied or cancelled one
#: ends with an ``error.type`` (its error class, else its status).
_SUCCEEDED: Final = frozenset({"SUCCEEDED"})
#: An attempt failed only when it FAILED or was LOST: one that stopped to wait for an
#: approval, paused or was cancelled ended as it was asked to.
_ATTEMPT_FAILED: Final = frozenset({"FAILED", "LOST"})


@dataclass(frozen=True, slots=True)
class LedgerSpan:
    """One span from the ledger, before it is a span: its name, whether it is an INTERNAL
    (else CLIENT) span, its times, attributes and ``error.type`` ("" when it succeeded)."""

    name: str
    internal: bool
    start: dt.datetime
    end: dt.datetime
    attributes: Mapping[str, Any]
    error: str


@dataclass(frozen=True, slots=True)
class Measurement:
    """One value for a GenAI metric: which (:data:`TOKEN_USAGE`, :data:`OPERATION_DURATION`,
    :data:`AGENT_DURATION`, :data:`TOOL_DURATION`), the value, its attributes."""

    metric: str
    value: float
    attributes: Mapping[str, str]


#: The GenAI metrics (the names the conventions give them).
TOKEN_USAGE: Final = "gen_ai.client.token.usage"
OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
AGENT_DURATION: Final = "gen_ai.invoke_agent.duration"
TOOL_DURATION: Final = "gen_ai.execute_tool.duration"

#: The attributes each GenAI metric's points may carry (its Prometheus equivalent has a
#: label for each, dots made underscores; a point without one has it empty).
METRIC_ATTRIBUTES: Final[dict[str, tuple[str, ...]]] = {
    TOKEN_USAGE: (
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.token.type",
    ),
    OPERATION_DURATION: (
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "error.type",
    ),
    AGENT_DURATION: ("gen_ai.agent.name", "error.type"),
    TOOL_DURATION: ("gen_ai.tool.name", "gen_ai.tool.type", "gen_ai.agent.name", "error.type"),
}


def prometheus_label(attribute: str) -> str:
    """The Prometheus label of an OTel attribute (the OTel-to-Prometheus translation)."""
    return attribute.replace(".", "_")


#: Each GenAI metric's Prometheus equivalent (``agentrt_base.metrics``), by its OTel name.
PROMETHEUS: Final[dict[str, Spec]] = {
    TOKEN_USAGE: GENAI_TOKEN_USAGE,
    OPERATION_DURATION: GENAI_OPERATION_DURATION,
    AGENT_DURATION: GENAI_AGENT_DURATION,
    TOOL_DURATION: GENAI_TOOL_DURATION,
}
for _name, _spec in PROMETHEUS.items():
    # One list of a GenAI metric's attributes: its Prometheus family's labels are theirs.
    if _spec.labels != tuple(map(prometheus_label, METRIC_ATTRIBUTES[_name])):
        raise RuntimeError(f"{_spec.name}'s labels are not {_name}'s attributes")


def _common(trace: AttemptTrace) -> dict[str, Any]:
    return {
        "gen_ai.conversation.id": trace.thread_id,
        "agentrt.agent.digest": trace.agent_digest,
        "agentrt.run.id": trace.run_id,
        "agentrt.attempt.id": trace.attempt_id,
        "agentrt.attempt.number": trace.number,
    }


def _error(status: str, error_class: str) -> str:
    if status in _SUCCEEDED:
        return ""
    return error_class or status


def _attempt_error(attempt: Attempt) -> str:
    return attempt.error_class or attempt.status if attempt.status in _ATTEMPT_FAILED else ""


def attempt_span(trace: AttemptTrace, attempt: Attempt, provider: str) -> LedgerSpan:
    """The ``invoke_agent`` span of an ended attempt; ``provider``: the model policy's
    primary candidate's."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": INVOKE_AGENT,
        "gen_ai.agent.id": trace.agent_id,
        "gen_ai.agent.name": trace.agent_id,
        "gen_ai.agent.version": trace.agent_version,
        **_common(trace),
        "agentrt.namespace": trace.namespace,
        "agentrt.attempt.reason": attempt.reason,
        "agentrt.attempt.status": attempt.status,
        "agentrt.worker.id": attempt.worker_id,
        "gen_ai.usage.input_tokens": attempt.input_tokens,
        "gen_ai.usage.output_tokens": attempt.output_tokens,
    }
    if provider:
        attributes["gen_ai.provider.name"] = provider
    return LedgerSpan(
        f"{INVOKE_AGENT} {trace.agent_id}",
        False,
        attempt.start_time,
        attempt.end_time or attempt.start_time,
        attributes,
        _attempt_error(attempt),
    )


def step_span(trace: AttemptTrace, step: Step) -> LedgerSpan:
    """The span of an ended step: ``chat {model}`` for a model call, ``execute_tool
    {tool}`` for a tool call, an INTERNAL span named for its type otherwise."""
    attributes = _common(trace)
    attributes["agentrt.step.id"] = step.id
    attributes["agentrt.step.sequence"] = step.sequence
    if step.operation:
        attributes["agentrt.step.operation"] = step.operation
    end = step.end_time or step.start_time
    error = _error(step.status, step.error_class)
    if step.type == "MODEL_CALL":
        attributes.update(_model_attributes(step))
        attributes["gen_ai.usage.input_tokens"] = step.input_tokens
        attributes["gen_ai.usage.output_tokens"] = step.output_tokens
        attributes["agentrt.model.candidate"] = step.candidate_name
        attributes["agentrt.model.candidate_reason"] = step.candidate_reason
        if step.fallback_from_step_id:
            attributes["agentrt.model.fallback_from_step_id"] = step.fallback_from_step_id
        if step.skills_json not in ("", "[]"):
            attributes["agentrt.skills"] = [
                f"{s['name']}@{s['version']}" for s in _list(step.skills_json)
            ]
        if step.cost_usd:
            attributes["agentrt.usage.cost_usd"] = float(step.cost_usd)
        model = step.requested_model_id or step.candidate_name
        return LedgerSpan(f"{CHAT} {model}", False, step.start_time, end, attributes, error)
    if step.type == "TOOL_CALL":
        attributes.update(_tool_attributes(step))
        for tool in _list(step.tools_json):
            if tool.get("name") == step.tool_name:
                attributes["agentrt.tool.version"] = str(tool.get("version", ""))
                attributes["agentrt.tool.digest"] = str(tool.get("digest", ""))
                attributes["agentrt.tool.schema_digest"] = str(tool.get("schema_digest", ""))
                if tool.get("decision"):
                    attributes["agentrt.tool.decision"] = str(tool["decision"])
        return LedgerSpan(
            f"{EXECUTE_TOOL} {step.tool_name}", True, step.start_time, end, attributes, error
        )
    subject = step.tool_name or step.completion_check
    if step.tool_name:
        attributes["agentrt.tool.name"] = step.tool_name
    if step.completion_check:
        attributes["agentrt.completion_check"] = step.completion_check
    name = step.type.lower() + (f" {subject}" if subject else "")
    return LedgerSpan(name, True, step.start_time, end, attributes, error)


def _model_attributes(step: Step) -> dict[str, str]:
    """What a model call's span and metrics share."""
    attributes = {
        "gen_ai.operation.name": CHAT,
        "gen_ai.provider.name": step.provider,
        "gen_ai.request.model": step.requested_model_id,
    }
    if step.reported_model_id:
        attributes["gen_ai.response.model"] = step.reported_model_id
    return attributes


def _tool_attributes(step: Step) -> dict[str, str]:
    # gen_ai.tool.type: the tool runs in the worker, on the model's request (the
    # conventions' example values are function, extension and datastore).
    return {
        "gen_ai.operation.name": EXECUTE_TOOL,
        "gen_ai.tool.name": step.tool_name,
        "gen_ai.tool.type": "function",
    }


def step_measurements(agent_id: str, step: Step) -> list[Measurement]:
    """What an ended step of agent ``agent_id`` adds to the GenAI metrics (nothing for other
    step types)."""
    seconds = _seconds(step.start_time, step.end_time)
    error = _error(step.status, step.error_class)
    if step.type == "MODEL_CALL":
        base = _model_attributes(step)
        timed = {**base, "error.type": error} if error else base
        out = [Measurement(OPERATION_DURATION, seconds, timed)]
        for kind, tokens in (("input", step.input_tokens), ("output", step.output_tokens)):
            if tokens:
                out.append(Measurement(TOKEN_USAGE, tokens, {**base, "gen_ai.token.type": kind}))
        return out
    if step.type == "TOOL_CALL":
        # The metric's attributes are the tool's and the agent's, not the operation's.
        tool = {
            "gen_ai.tool.name": step.tool_name,
            "gen_ai.tool.type": "function",
            "gen_ai.agent.name": agent_id,
        }
        return [
            Measurement(TOOL_DURATION, seconds, {**tool, "error.type": error} if error else tool)
        ]
    return []


def attempt_measurements(trace: AttemptTrace, attempt: Attempt) -> list[Measurement]:
    """What an ended attempt adds to the GenAI metrics (the metric's attributes are the
    agent's name and the error: no operation, no provider)."""
    attributes = {"gen_ai.agent.name": trace.agent_id}
    error = _attempt_error(attempt)
    if error:
        attributes["error.type"] = error
    return [Measurement(AGENT_DURATION, _seconds(attempt.start_time, attempt.end_time), attributes)]


def primary_provider(model_policy: Mapping[str, Any]) -> str:
    """The provider of a model policy's first candidate ("" without one)."""
    candidates = model_policy.get("candidates") or []
    return str(candidates[0].get("provider", "")) if candidates else ""


def _seconds(start: dt.datetime, end: dt.datetime | None) -> float:
    return max((end - start).total_seconds(), 0.0) if end is not None else 0.0


def _list(text: str) -> list[dict[str, Any]]:
    value = json.loads(text) if text else []
    return value if isinstance(value, list) else []
