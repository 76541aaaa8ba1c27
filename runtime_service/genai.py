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
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, NamedTuple

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
class Series:
    """One GenAI metric with one set of attributes: what a :class:`Measurement` adds a value
    to. Made once per attribute set and shared (:func:`_series`), so a step's measurements
    cost a cache lookup, not the dictionaries and label lists they are described by."""

    metric: str
    attributes: Mapping[str, str]
    #: Its Prometheus equivalent's label values, in :data:`METRIC_ATTRIBUTES`' order (empty
    #: for an attribute this set lacks).
    labels: tuple[str, ...]


class Measurement(NamedTuple):
    """One value for a GenAI metric (:data:`TOKEN_USAGE`, :data:`OPERATION_DURATION`,
    :data:`AGENT_DURATION`, :data:`TOOL_DURATION`) with its attributes, as its
    :class:`Series`. A tuple: the server makes up to three for every step it ends, on the
    event loop, and a frozen dataclass costs several times a tuple to make."""

    series: Series
    value: float

    @property
    def metric(self) -> str:
        return self.series.metric

    @property
    def attributes(self) -> Mapping[str, str]:
        return self.series.attributes


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

#: Attribute sets whose :class:`Series` are kept (the sets are bounded anyway: agents,
#: providers, models, tools and error types, never ids).
_SERIES_KEPT: Final = 4096


def _series(metric: str, attributes: dict[str, str]) -> Series:
    return Series(
        metric,
        MappingProxyType(attributes),
        tuple(attributes.get(key, "") for key in METRIC_ATTRIBUTES[metric]),
    )


@functools.lru_cache(maxsize=_SERIES_KEPT)
def _model_series(
    provider: str, requested: str, reported: str, error: str
) -> tuple[Series, Series, Series]:
    """A model call's series: its duration's, its input and its output tokens'."""
    base = _model_call(provider, requested, reported)
    return (
        _series(OPERATION_DURATION, {**base, "error.type": error} if error else base),
        _series(TOKEN_USAGE, {**base, "gen_ai.token.type": "input"}),
        _series(TOKEN_USAGE, {**base, "gen_ai.token.type": "output"}),
    )


@functools.lru_cache(maxsize=_SERIES_KEPT)
def _tool_series(tool: str, agent_id: str, error: str) -> Series:
    # The metric's attributes are the tool's and the agent's, not the operation's.
    attributes = {
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
        "gen_ai.agent.name": agent_id,
    }
    if error:
        attributes["error.type"] = error
    return _series(TOOL_DURATION, attributes)


@functools.lru_cache(maxsize=_SERIES_KEPT)
def _agent_series(agent_id: str, error: str) -> Series:
    # The metric's attributes are the agent's name and the error: no operation, no provider.
    attributes = {"gen_ai.agent.name": agent_id}
    if error:
        attributes["error.type"] = error
    return _series(AGENT_DURATION, attributes)


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
    return _model_call(step.provider, step.requested_model_id, step.reported_model_id)


def _model_call(provider: str, requested: str, reported: str) -> dict[str, str]:
    attributes = {
        "gen_ai.operation.name": CHAT,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": requested,
    }
    if reported:
        attributes["gen_ai.response.model"] = reported
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
    if step.type == "MODEL_CALL":
        duration, input_tokens, output_tokens = _model_series(
            step.provider,
            step.requested_model_id,
            step.reported_model_id,
            _error(step.status, step.error_class),
        )
        out = [Measurement(duration, _seconds(step.start_time, step.end_time))]
        if step.input_tokens:
            out.append(Measurement(input_tokens, step.input_tokens))
        if step.output_tokens:
            out.append(Measurement(output_tokens, step.output_tokens))
        return out
    if step.type == "TOOL_CALL":
        series = _tool_series(step.tool_name, agent_id, _error(step.status, step.error_class))
        return [Measurement(series, _seconds(step.start_time, step.end_time))]
    return []


def attempt_measurements(trace: AttemptTrace, attempt: Attempt) -> list[Measurement]:
    """What an ended attempt adds to the GenAI metrics."""
    series = _agent_series(trace.agent_id, _attempt_error(attempt))
    return [Measurement(series, _seconds(attempt.start_time, attempt.end_time))]


def primary_provider(model_policy: Mapping[str, Any]) -> str:
    """The provider of a model policy's first candidate ("" without one)."""
    candidates = model_policy.get("candidates") or []
    return str(candidates[0].get("provider", "")) if candidates else ""


def _seconds(start: dt.datetime, end: dt.datetime | None) -> float:
    return max((end - start).total_seconds(), 0.0) if end is not None else 0.0


def _list(text: str) -> list[dict[str, Any]]:
    value = json.loads(text) if text else []
    return value if isinstance(value, list) else []
