"""Publishing rules, pure: validate a draft, resolve a definition's references, digest both.

The server runs these against the database and ``agentrt digest FILE`` runs them against the
components a file declares, so the two compute the same digest by construction. Every
problem is collected as a field violation before anything is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema

from agentrt_core import canonical, content_limits, jcs, refs, semver, specs
from agentrt_core.canonical import CanonicalError, ComponentKind
from agentrt_core.errors import InvalidArgument, NotFound, ViolationCollector
from agentrt_core.model import AgentDefinition, ClosureEntry, Component, ComponentDraft


@dataclass(frozen=True)
class DigestedComponent:
    """A validated draft with its normalised spec, canonical bytes and digests."""

    draft: ComponentDraft
    spec: dict[str, Any]
    canonical: bytes
    digest: str
    schema_digest: str | None


@dataclass(frozen=True)
class DigestedAgent:
    """A resolved definition: its closure, canonical bytes, digest, and the anonymous prompt
    component to store when the system prompt was given inline."""

    definition: AgentDefinition
    closure: tuple[ClosureEntry, ...]
    canonical: bytes
    digest: str
    inline_prompt: DigestedComponent | None


class ComponentSource(Protocol):
    """Where references resolve: the database, or the components a file declares."""

    def by_version(self, name: str, version: str) -> Component | None: ...

    def by_digest(self, digest: str) -> Component | None: ...

    def versions(self, name: str) -> Sequence[Component]: ...


# -- components ------------------------------------------------------------------------------


def digest_component(
    draft: ComponentDraft, *, field_prefix: str = "component"
) -> DigestedComponent:
    """Validate a draft and compute its digests.

    Raises:
        InvalidArgument: with one violation per problem, fields prefixed by ``field_prefix``.
    """
    problems = ViolationCollector()
    if not refs.is_valid_name(draft.name):
        problems.add(f"{field_prefix}.name", _name_rule(draft.name))
    if not refs.is_valid_version(draft.version):
        problems.add(
            f"{field_prefix}.version",
            f"{draft.version!r} is not a version: use semver (2.1.0) or a positive integer (1)",
        )
    if len(draft.description) > content_limits.MAX_DESCRIPTION_CHARS:
        problems.add(
            f"{field_prefix}.description",
            f"longer than the limit of {content_limits.MAX_DESCRIPTION_CHARS} characters",
        )
    spec_prefix = f"{field_prefix}.spec.{_SPEC_CASE[draft.kind]}"
    spec = _normalise_spec(draft.kind, draft.spec, spec_prefix, problems)
    problems.raise_if_any("invalid component")
    return _finish_component(draft, spec, spec_prefix)


def _finish_component(
    draft: ComponentDraft, spec: dict[str, Any], spec_prefix: str
) -> DigestedComponent:
    document = canonical.component_document(
        draft.kind, draft.name, draft.version, draft.description, spec
    )
    data = jcs.canonical_bytes(document)
    if len(data) > content_limits.MAX_COMPONENT_BYTES:
        raise InvalidArgument.for_field(
            spec_prefix,
            f"the component is {len(data)} bytes in canonical form, over the limit of "
            f"{content_limits.MAX_COMPONENT_BYTES}",
        )
    schema = None
    if draft.kind is ComponentKind.TOOL:
        schema = jcs.schema_digest(spec["input_schema"])
    return DigestedComponent(draft, spec, data, jcs.digest_bytes(data), schema)


_SPEC_CASE = {
    ComponentKind.PROMPT: "prompt",
    ComponentKind.SKILL: "skill",
    ComponentKind.TOOL: "tool",
    ComponentKind.MODEL_POLICY: "model_policy",
    ComponentKind.PERMISSION_POLICY: "permission_policy",
    ComponentKind.COMPLETION_POLICY: "completion_policy",
}

_MODEL_CALL_ERRORS = frozenset(
    {
        "PROVIDER_TIMEOUT",
        "RATE_LIMITED",
        "PROVIDER_ERROR",
        "CONTEXT_LENGTH_EXCEEDED",
        "CONTENT_FILTERED",
        "INVALID_OUTPUT",
    }
)


def _name_rule(name: str) -> str:
    return (
        f"{name!r} is not a valid name: 1-64 of a-z 0-9 _ -, starting with a letter"
        if name
        else "required"
    )


def _normalise_spec(
    kind: ComponentKind, spec: dict[str, Any], prefix: str, problems: ViolationCollector
) -> dict[str, Any]:
    try:
        normalised = specs.normalise_spec(kind, spec)
    except CanonicalError as exc:
        problems.add(_join(prefix, exc.field.removeprefix("spec")), exc.reason)
        return {}
    checks: dict[ComponentKind, Callable[[dict[str, Any], str, ViolationCollector], None]] = {
        ComponentKind.PROMPT: _check_prompt,
        ComponentKind.SKILL: _check_skill,
        ComponentKind.TOOL: _check_tool,
        ComponentKind.MODEL_POLICY: _check_model_policy,
        ComponentKind.PERMISSION_POLICY: _check_permission_policy,
        ComponentKind.COMPLETION_POLICY: _check_completion_policy,
    }
    checks[kind](normalised, prefix, problems)
    return normalised


def _join(prefix: str, rest: str) -> str:
    if not rest:
        return prefix
    return prefix + (rest if rest.startswith("[") or rest.startswith(".") else "." + rest)


def _require(spec: dict[str, Any], key: str, prefix: str, problems: ViolationCollector) -> None:
    if not spec.get(key):
        problems.add(f"{prefix}.{key}", "required")


def _check_prompt(spec: dict[str, Any], prefix: str, problems: ViolationCollector) -> None:
    _require(spec, "text", prefix, problems)


def _check_skill(spec: dict[str, Any], prefix: str, problems: ViolationCollector) -> None:
    _require(spec, "description", prefix, problems)
    _require(spec, "instructions", prefix, problems)
    files = spec.get("files", [])
    if len(files) > content_limits.MAX_SKILL_FILES:
        problems.add(f"{prefix}.files", f"more than {content_limits.MAX_SKILL_FILES} files")
    for i, item in enumerate(files):
        path = item.get("path", "")
        where = f"{prefix}.files[{i}]"
        if not path or path.startswith("/") or "\\" in path or ".." in path.split("/"):
            problems.add(f"{where}.path", f"{path!r}: a relative path with '/', without '..'")
        if len(item.get("content", "").encode()) > content_limits.MAX_SKILL_FILE_BYTES:
            problems.add(
                f"{where}.content", f"over the limit of {content_limits.MAX_SKILL_FILE_BYTES} bytes"
            )


def _check_schema(schema: Any, where: str, problems: ViolationCollector) -> None:
    if not isinstance(schema, dict):
        problems.add(where, "must be a JSON Schema object")
        return
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        location = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        problems.add(where + location, f"not a valid JSON Schema (draft 2020-12): {exc.message}")


def _check_tool(spec: dict[str, Any], prefix: str, problems: ViolationCollector) -> None:
    _require(spec, "description", prefix, problems)
    if "input_schema" not in spec:
        problems.add(f"{prefix}.input_schema", "required")
    else:
        _check_schema(spec["input_schema"], f"{prefix}.input_schema", problems)
    if "output_schema" in spec:
        _check_schema(spec["output_schema"], f"{prefix}.output_schema", problems)


def _check_model_policy(spec: dict[str, Any], prefix: str, problems: ViolationCollector) -> None:
    candidates = spec.get("candidates", [])
    if not candidates:
        problems.add(f"{prefix}.candidates", "at least one candidate is required")
    seen: set[str] = set()
    for i, candidate in enumerate(candidates):
        where = f"{prefix}.candidates[{i}]"
        for key in ("name", "provider", "model_id"):
            _require(candidate, key, where, problems)
        name = candidate.get("name", "")
        if name in seen:
            problems.add(f"{where}.name", f"duplicate candidate name {name!r}")
        seen.add(name)
        if candidate.get("max_context_tokens", 0) < 0:
            problems.add(f"{where}.max_context_tokens", "must not be negative")
        for error_class in candidate.get("fallback_on", []):
            if error_class not in _MODEL_CALL_ERRORS:
                problems.add(
                    f"{where}.fallback_on",
                    f"{error_class} is not an error a model call can end with "
                    f"(one of {', '.join(sorted(_MODEL_CALL_ERRORS))})",
                )


def _check_permission_policy(
    spec: dict[str, Any], prefix: str, problems: ViolationCollector
) -> None:
    if spec.get("default_decision") not in specs.DECISIONS:
        problems.add(f"{prefix}.default_decision", "required: ALLOW, REQUIRE_APPROVAL or DENY")
    for i, rule in enumerate(spec.get("rules", [])):
        if not refs.is_valid_name(rule.get("tool", "")):
            problems.add(f"{prefix}.rules[{i}].tool", _name_rule(rule.get("tool", "")))
        if rule.get("decision") not in specs.DECISIONS:
            problems.add(
                f"{prefix}.rules[{i}].decision", "required: ALLOW, REQUIRE_APPROVAL or DENY"
            )


def _check_completion_policy(
    spec: dict[str, Any], prefix: str, problems: ViolationCollector
) -> None:
    for i, check in enumerate(spec.get("checks", [])):
        where = f"{prefix}.checks[{i}]"
        if not check.get("name"):
            problems.add(f"{where}.name", "required")
        # Each condition names exactly what it looks for, and nothing it would ignore.
        condition = check.get("condition", "")
        needs = _CONDITION_NEEDS.get(condition, "")
        for key in ("artifact_kind", "tool"):
            if key == needs and not check.get(key):
                problems.add(f"{where}.{key}", f"required for condition {condition}")
            elif key != needs and check.get(key):
                problems.add(
                    f"{where}.{key}",
                    f"only for condition {_NEEDED_BY[key]}"
                    + (f", not {condition}" if condition else ", not a worker-attested check"),
                )
        if needs == "tool" and check.get("tool") and not refs.is_valid_name(check["tool"]):
            problems.add(f"{where}.tool", _name_rule(check["tool"]))


#: What each completion condition names (see CompletionCheck), and the other way round.
_CONDITION_NEEDS = {
    "ARTIFACT_EXISTS": "artifact_kind",
    "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS": "tool",
}
_NEEDED_BY = {needs: condition for condition, needs in _CONDITION_NEEDS.items()}


# -- agents ----------------------------------------------------------------------------------

_KIND_OF_SLOT = {
    "system_prompt": ComponentKind.PROMPT,
    "model_policy": ComponentKind.MODEL_POLICY,
    "skills": ComponentKind.SKILL,
    "tools": ComponentKind.TOOL,
    "permission_policy": ComponentKind.PERMISSION_POLICY,
    "completion_policy": ComponentKind.COMPLETION_POLICY,
}


def check_definition(definition: AgentDefinition, *, prefix: str = "definition") -> None:
    """Validate the parts of a definition that need no look-up (grammar, sizes, required).

    Raises:
        InvalidArgument: with a violation per problem.
    """
    problems = ViolationCollector()
    if not refs.is_valid_name(definition.agent_id):
        problems.add(f"{prefix}.agent_id", _name_rule(definition.agent_id))
    if not refs.is_valid_label(definition.version_label):
        problems.add(
            f"{prefix}.version_label",
            f"{definition.version_label!r} is not a valid label: 1-64 of A-Z a-z 0-9 . _ -, "
            "not starting with '.', '-' or 'sha256'"
            if definition.version_label
            else "required",
        )
    if len(definition.description) > content_limits.MAX_DESCRIPTION_CHARS:
        problems.add(f"{prefix}.description", "too long")
    if definition.system_prompt_text is None and definition.system_prompt_ref is None:
        problems.add(f"{prefix}.system_prompt", "required: inline text or a reference")
    elif definition.system_prompt_text is not None and not definition.system_prompt_text:
        problems.add(f"{prefix}.system_prompt.text", "must not be empty")
    if not definition.model_policy:
        problems.add(f"{prefix}.model_policy", "required")
    if definition.tools and not definition.permission_policy:
        problems.add(f"{prefix}.permission_policy", "required when the agent has tools")
    if len(definition.skills) > content_limits.MAX_AGENT_SKILLS:
        problems.add(f"{prefix}.skills", f"more than {content_limits.MAX_AGENT_SKILLS}")
    if len(definition.tools) > content_limits.MAX_AGENT_TOOLS:
        problems.add(f"{prefix}.tools", f"more than {content_limits.MAX_AGENT_TOOLS}")
    for _family, field_path, ref in _references(definition, prefix):
        if len(ref) > content_limits.MAX_REF_CHARS:
            problems.add(field_path, "reference too long")
            continue
        try:
            parsed = refs.parse_ref(ref, allow_range=True)
        except refs.RefError as exc:
            problems.add(field_path, str(exc))
            continue
        if isinstance(parsed, refs.TagRef):
            problems.add(field_path, "components have no tags: pin a version, a range or a digest")
    for list_name in ("skills", "tools"):
        names: dict[str, int] = {}
        for i, ref in enumerate(getattr(definition, list_name)):
            name = ref.partition("@")[0]
            if name in names and not ref.startswith("sha256:"):
                problems.add(
                    f"{prefix}.{list_name}[{i}]",
                    f"{name!r} is already referenced at {list_name}[{names[name]}]",
                )
            names.setdefault(name, i)
    problems.raise_if_any("invalid agent definition")


def _references(definition: AgentDefinition, prefix: str) -> list[tuple[str, str, str]]:
    """(slot family, field path, reference) for every reference the definition makes."""
    found: list[tuple[str, str, str]] = []
    if definition.system_prompt_ref is not None:
        found.append(("system_prompt", f"{prefix}.system_prompt.ref", definition.system_prompt_ref))
    if definition.model_policy:
        found.append(("model_policy", f"{prefix}.model_policy", definition.model_policy))
    found += [("skills", f"{prefix}.skills[{i}]", r) for i, r in enumerate(definition.skills)]
    found += [("tools", f"{prefix}.tools[{i}]", r) for i, r in enumerate(definition.tools)]
    if definition.permission_policy:
        found.append(
            ("permission_policy", f"{prefix}.permission_policy", definition.permission_policy)
        )
    if definition.completion_policy:
        found.append(
            ("completion_policy", f"{prefix}.completion_policy", definition.completion_policy)
        )
    return found


def resolve_reference(source: ComponentSource, ref_text: str) -> Component | None:
    """The component a (publish-time) reference names, or None."""
    ref = refs.parse_ref(ref_text, allow_range=True)
    match ref:
        case refs.VersionRef(name=name, version=version):
            return source.by_version(name, version)
        case refs.NameDigestRef(name=name, digest=digest):
            found = source.by_digest(digest)
            return found if found is not None and found.name == name else None
        case refs.DigestRef(digest=digest):
            return source.by_digest(digest)
        case refs.RangeRef(name=name, range=range_text):
            candidates = {c.version: c for c in source.versions(name)}
            best = semver.max_satisfying(range_text, candidates)
            return candidates[best] if best is not None else None
    return None


def digest_agent(
    definition: AgentDefinition, source: ComponentSource, *, prefix: str = "definition"
) -> DigestedAgent:
    """Validate, resolve every reference against ``source`` and digest a definition.

    Raises:
        InvalidArgument: malformed definition, or a reference of the wrong kind.
        NotFound: a reference resolves to nothing (the first such, naming its field).
    """
    check_definition(definition, prefix=prefix)
    entries: list[ClosureEntry] = []
    problems = ViolationCollector()
    missing: list[tuple[str, str]] = []
    inline: DigestedComponent | None = None
    if definition.system_prompt_text is not None:
        inline = digest_inline_prompt(definition.system_prompt_text, prefix=prefix)
        entries.append(
            ClosureEntry("system_prompt", ComponentKind.PROMPT, "", "", inline.digest, "")
        )
    for family, field_path, ref_text in _references(definition, prefix):
        component = resolve_reference(source, ref_text)
        if component is None:
            missing.append((field_path, ref_text))
            continue
        expected = _KIND_OF_SLOT[family]
        if component.kind is not expected:
            problems.add(
                field_path,
                f"{ref_text!r} is a {component.kind.value} component, expected {expected.value}",
            )
            continue
        slot = f"{family}[{component.name}]" if family in ("skills", "tools") else family
        entries.append(
            ClosureEntry(
                slot=slot,
                kind=component.kind,
                name=component.name,
                version=component.version,
                digest=component.digest,
                requested_ref=ref_text,
                schema_digest=component.schema_digest,
            )
        )
    problems.raise_if_any("invalid agent definition")
    if missing:
        field_path, ref_text = missing[0]
        others = (
            f" (and {len(missing) - 1} more: {', '.join(r for _, r in missing[1:])})"
            if len(missing) > 1
            else ""
        )
        error = NotFound(
            "component",
            ref_text,
            f"{field_path}: no published component matches {ref_text!r}{others}",
        )
        error.metadata["field"] = field_path
        raise error
    closure = tuple(sorted(entries, key=_slot_order))
    document = canonical.agent_document(
        definition.agent_id,
        definition.version_label,
        definition.description,
        to_agent_closure(closure),
    )
    data = jcs.canonical_bytes(document)
    return DigestedAgent(definition, closure, data, jcs.digest_bytes(data), inline)


def digest_inline_prompt(text: str, *, prefix: str = "definition") -> DigestedComponent:
    """The anonymous PROMPT component an inline system prompt is stored as."""
    draft = ComponentDraft(ComponentKind.PROMPT, "", "", "", {"text": text})
    problems = ViolationCollector()
    spec = _normalise_spec(ComponentKind.PROMPT, draft.spec, f"{prefix}.system_prompt", problems)
    problems.raise_if_any("invalid agent definition")
    return _finish_component(draft, spec, f"{prefix}.system_prompt.text")


_SLOT_RANK = {name: i for i, name in enumerate(_KIND_OF_SLOT)}


def _slot_order(entry: ClosureEntry) -> tuple[int, str]:
    return (_SLOT_RANK[entry.slot.partition("[")[0]], entry.slot)


def to_agent_closure(closure: Sequence[ClosureEntry]) -> canonical.AgentClosure:
    """The canonical module's view of a closure."""

    def entry(e: ClosureEntry) -> canonical.ResolvedEntry:
        return canonical.ResolvedEntry(e.kind, e.name, e.version or None, e.digest, e.schema_digest)

    by_family: dict[str, list[canonical.ResolvedEntry]] = {}
    for e in closure:
        by_family.setdefault(e.slot.partition("[")[0], []).append(entry(e))
    single = {k: v[0] for k, v in by_family.items() if k not in ("skills", "tools")}
    return canonical.AgentClosure(
        system_prompt=single["system_prompt"],
        model_policy=single["model_policy"],
        skills=tuple(by_family.get("skills", ())),
        tools=tuple(by_family.get("tools", ())),
        permission_policy=single.get("permission_policy"),
        completion_policy=single.get("completion_policy"),
    )


BOUND_AGENT_DOCUMENT_TYPE = "agentrt.bound_agent.v1"
"""The ``type`` member of the document a worker is handed (``BoundAgent.definition_json``)."""


def bound_agent_document(
    digest: str,
    agent_id: str,
    version_label: str,
    description: str,
    closure: Sequence[ClosureEntry],
    components: Mapping[str, ComponentDraft],
) -> dict[str, Any]:
    """The bound definition a worker executes, made only of the documents the digests cover.

    ``{"type": "agentrt.bound_agent.v1", "agent_digest", "agent": <the agent document>,
    "components": {<component digest>: <its component document>, ...}}`` (docs/digest.md
    §1.5): a worker recomputes the agent digest from ``agent`` and each component digest from
    its document, with nothing but JCS and SHA-256, and reads each entry's content under its
    digest. ``components`` holds one draft (as stored) per digest of ``closure``.

    Raises:
        CanonicalError: A stored document has no canonical form (it was digested once, so
            only if storage was changed).
    """
    agent = canonical.agent_document(
        agent_id, version_label, description, to_agent_closure(closure)
    )
    documents = {}
    for entry in closure:
        c = components[entry.digest]
        documents[entry.digest] = canonical.component_document(
            c.kind, c.name, c.version, c.description, c.spec
        )
    return {
        "type": BOUND_AGENT_DOCUMENT_TYPE,
        "agent_digest": digest,
        "agent": agent,
        "components": documents,
    }
