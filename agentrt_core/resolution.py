"""Version resolution for a step, pure: which model candidate, which permission decision,
whether tool arguments fit the pinned schema.

Everything is decided against the run's bound definition (a :class:`BoundDefinition` built
from the agent version's closure), never against whatever is newest in the registry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jsonschema

from agentrt_core import reasons
from agentrt_core.completion import Check, checks_of
from agentrt_core.errors import FailedPrecondition
from agentrt_core.lru import LruCache
from agentrt_core.proto_json import json_numbers

#: Strictness order: the stricter of two decisions wins.
_STRICTNESS = {"ALLOW": 0, "REQUIRE_APPROVAL": 1, "DENY": 2}


@dataclass(frozen=True)
class Pinned:
    """One component of the bound definition: what the closure pinned and its content."""

    name: str
    version: str
    digest: str
    spec: dict[str, Any]
    schema_digest: str = ""


@dataclass(frozen=True)
class BoundDefinition:
    digest: str
    agent_id: str
    version_label: str
    system_prompt: Pinned
    model_policy: Pinned
    skills: dict[str, Pinned] = field(default_factory=dict)
    tools: dict[str, Pinned] = field(default_factory=dict)
    permission_policy: Pinned | None = None
    completion_policy: Pinned | None = None

    @cached_property
    def completion(self) -> tuple[Check, ...]:
        """The completion policy's checks (none without a policy)."""
        return checks_of(self.completion_policy.spec if self.completion_policy else None)

    @property
    def completion_checks(self) -> list[str]:
        """The names of every check the completion policy requires."""
        return [c.name for c in self.completion]

    @property
    def runtime_checks(self) -> list[str]:
        """The names of the checks the runtime evaluates itself (no worker attests them)."""
        return [c.name for c in self.completion if c.by_runtime]


@dataclass(frozen=True)
class ModelChoice:
    candidate: dict[str, Any]
    #: PRIMARY, FALLBACK_AFTER_ERROR or CONTEXT_LENGTH_ROUTE.
    reason: str


def choose_model(
    policy: dict[str, Any],
    *,
    estimated_input_tokens: int,
    previous_error_class: str,
    previous_candidate: str,
) -> ModelChoice:
    """Pick the candidate a model call must use. ``previous_error_class`` and
    ``previous_candidate`` are those of the failed MODEL_CALL step the call follows, as the
    ledger recorded them (``step_decide._model_call``), or empty.

    * No previous failure: the first candidate whose context limit admits the estimate —
      the primary, or a later one routed to by context length.
    * After a failure whose class the failed candidate lists in ``fallback_on``: the next
      eligible candidate after it. A class it does not list means "retry the same one".

    Raises:
        FailedPrecondition: no candidate is left (reason ``NO_MODEL_CANDIDATE``).
    """
    candidates: list[dict[str, Any]] = policy.get("candidates", [])

    def fits(c: dict[str, Any]) -> bool:
        limit = int(c.get("max_context_tokens", 0))
        return limit == 0 or estimated_input_tokens <= limit

    if previous_error_class:
        names = [c.get("name") for c in candidates]
        failed = names.index(previous_candidate) if previous_candidate in names else 0
        failed_candidate = candidates[failed] if candidates else {}
        if previous_error_class in failed_candidate.get("fallback_on", []):
            for candidate in candidates[failed + 1 :]:
                if fits(candidate):
                    return ModelChoice(candidate, "FALLBACK_AFTER_ERROR")
            raise FailedPrecondition(
                f"the model policy has no candidate after {failed_candidate.get('name')!r} "
                f"for {previous_error_class}",
                reason=reasons.NO_MODEL_CANDIDATE,
                metadata={"previous_candidate": str(failed_candidate.get("name", ""))},
            )
        if fits(failed_candidate):
            reason = "PRIMARY" if failed == 0 else "FALLBACK_AFTER_ERROR"
            return ModelChoice(failed_candidate, reason)
    for index, candidate in enumerate(candidates):
        if fits(candidate):
            return ModelChoice(candidate, "PRIMARY" if index == 0 else "CONTEXT_LENGTH_ROUTE")
    raise FailedPrecondition(
        f"no model candidate admits {estimated_input_tokens} input tokens",
        reason=reasons.NO_MODEL_CANDIDATE,
        metadata={"estimated_input_tokens": str(estimated_input_tokens)},
    )


def skills_for_call(definition: BoundDefinition, requested: Sequence[str]) -> tuple[str, ...]:
    """The skills a model call is handed (their contents in BeginStep's answer, their pinned
    versions recorded in the step's ``StepVersions.skills``), sorted by name.

    The definition declares the skills its agent may load; a spec that names none gets all
    of them, one that names some gets exactly those (each must be in the definition:
    ``step_decide`` refuses any other with NOT_IN_DEFINITION before asking). So the record
    never depends on whether a worker bothered to list what it loads: a worker that lists
    nothing is handed, and recorded with, every skill it could load.
    """
    if not requested:
        return tuple(sorted(definition.skills))
    return tuple(sorted(set(requested)))


def permission(definition: BoundDefinition, tool: str, ceiling: str) -> str:
    """ALLOW, REQUIRE_APPROVAL or DENY for a call to ``tool`` in a run with ``ceiling``.

    The policy's rule for the tool (or its default) meets the run's ceiling: READ_ONLY denies
    tools with side effects, APPROVE_SIDE_EFFECTS makes them need approval; the stricter wins.
    A definition without a permission policy has no tools, so nothing is allowed by default.
    """
    pinned = definition.tools.get(tool)
    if pinned is None:
        return "DENY"
    decision = "DENY"
    if definition.permission_policy is not None:
        spec = definition.permission_policy.spec
        decision = next(
            (r["decision"] for r in spec.get("rules", []) if r.get("tool") == tool),
            spec.get("default_decision", "DENY"),
        )
    if pinned.spec.get("side_effects"):
        if ceiling == "READ_ONLY":
            decision = _stricter(decision, "DENY")
        elif ceiling == "APPROVE_SIDE_EFFECTS":
            decision = _stricter(decision, "REQUIRE_APPROVAL")
    return decision


def _stricter(a: str, b: str) -> str:
    return a if _STRICTNESS[a] >= _STRICTNESS[b] else b


_validators: LruCache[str, jsonschema.protocols.Validator] = LruCache(1024)


@dataclass(frozen=True)
class ArgumentViolation:
    """One place where tool arguments break the pinned schema: its location (object keys
    and array indexes from the arguments' root) and what is wrong there."""

    location: tuple[str | int, ...]
    message: str

    @property
    def json_path(self) -> str:
        """``$.lines[1]``: the location as a JSONPath from the arguments' root."""
        return "$" + _path(self.location)

    def field(self, root: str) -> str:
        """The request field it names (``tool_call.arguments.lines[1]``), for ``BadRequest``."""
        return root + _path(self.location)


def _path(location: tuple[str | int, ...]) -> str:
    # A key that is not a plain identifier is quoted as a JSON string (`["a.b"]`), so the path
    # stays unambiguous whatever the caller named its arguments.
    return "".join(
        f"[{part}]"
        if isinstance(part, int)
        else f".{part}"
        if part.isidentifier()
        else f"[{json.dumps(part, ensure_ascii=False)}]"
        for part in location
    )


def argument_errors(tool: Pinned, arguments: dict[str, Any]) -> list[ArgumentViolation]:
    """Every way ``arguments`` break the tool's pinned input schema (empty when they fit), in
    the order of their locations. Validators are cached by schema digest: a pinned schema
    never changes."""
    schema = tool.spec.get("input_schema", {})
    # Fix: a tool without a schema digest must not share the cache entry "" with every other
    # such tool (one tool's arguments would be checked against another's schema).
    key = tool.schema_digest or dumps(schema)
    validator = _validators.get(key)
    if validator is None:
        validator = jsonschema.Draft202012Validator(schema)
        _validators.put(key, validator)
    found = []
    # Arguments read from a Struct (step_wire) already follow the number rule; this keeps the
    # messages printing 42, not 42.0, for arguments that reach us as plain floats too.
    for error in validator.iter_errors(json_numbers(arguments)):
        # For a combinator (anyOf, oneOf) the most relevant of its sub-errors says more than
        # "is not valid under any of the given schemas".
        error = jsonschema.exceptions.best_match([error]) or error
        found.append(ArgumentViolation(tuple(error.absolute_path), error.message))
    # By location (indexes in numeric order), so the order is the arguments' and not the
    # order of the schema's keywords.
    return sorted(found, key=lambda v: ([(isinstance(p, str), p) for p in v.location], v.message))


def bound_definition(document: dict[str, Any]) -> BoundDefinition:
    """Build the bound definition from the document AcquireRun hands to workers
    (``agentrt_core.publishing.bound_agent_document``): each entry of the agent document, with
    the spec of the component document stored under its digest."""
    agent: dict[str, Any] = document["agent"]
    components: dict[str, dict[str, Any]] = document["components"]

    def pinned(entry: dict[str, Any]) -> Pinned:
        return Pinned(
            entry.get("name", ""),
            entry.get("version", ""),
            entry["digest"],
            components[entry["digest"]]["spec"],
            entry.get("schema_digest", ""),
        )

    def optional(slot: str) -> Pinned | None:
        return pinned(agent[slot]) if slot in agent else None

    return BoundDefinition(
        digest=document["agent_digest"],
        agent_id=agent["agent_id"],
        version_label=agent["version_label"],
        system_prompt=pinned(agent["system_prompt"]),
        model_policy=pinned(agent["model_policy"]),
        skills={e["name"]: pinned(e) for e in agent["skills"]},
        tools={e["name"]: pinned(e) for e in agent["tools"]},
        permission_policy=optional("permission_policy"),
        completion_policy=optional("completion_policy"),
    )


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
