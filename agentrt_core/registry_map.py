"""Proto ⇄ domain mapping for the registry (transport only; no rules live here).

Specs become the plain JSON-like dicts :mod:`agentrt_core.canonical` digests: enum values lose
their proto prefix (``ERROR_CLASS_RATE_LIMITED`` → ``RATE_LIMITED``), int64 fields stay
integers (the proto JSON mapping would make them strings), and Struct values become plain
JSON by the number rule of :mod:`agentrt_core.proto_json`. The CLI maps YAML through the same
proto messages, so a file and a gRPC call normalise identically.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt_core.canonical import ComponentKind
from agentrt_core.errors import InvalidArgument
from agentrt_core.model import (
    AgentDefinition,
    AgentVersion,
    ClosureEntry,
    Component,
    ComponentDraft,
    FieldChange,
    Provenance,
    Resolution,
    Tag,
    TagEvent,
    VerifiedProvenance,
)
from agentrt_core.proto_json import (
    enum_value,
    json_to_struct,
    short_name,
    struct_to_json,
    to_timestamp,
)


def kind_from_proto(value: int, field_path: str = "component.kind") -> ComponentKind:
    if value == enum_pb2.COMPONENT_KIND_UNSPECIFIED or value not in enum_pb2.ComponentKind.values():
        raise InvalidArgument.for_field(field_path, "required: a component kind")
    return ComponentKind(short_name(enum_pb2.ComponentKind, "COMPONENT_KIND_", value, field_path))


def kind_to_proto(kind: ComponentKind) -> enum_pb2.ComponentKind.ValueType:
    return enum_value(enum_pb2.ComponentKind, "COMPONENT_KIND_", kind.value)  # type: ignore[no-any-return]


# -- specs ------------------------------------------------------------------------------------

_SPEC_CASES = {
    "prompt": ComponentKind.PROMPT,
    "skill": ComponentKind.SKILL,
    "tool": ComponentKind.TOOL,
    "model_policy": ComponentKind.MODEL_POLICY,
    "permission_policy": ComponentKind.PERMISSION_POLICY,
    "completion_policy": ComponentKind.COMPLETION_POLICY,
}
_CASE_OF_KIND = {kind: case for case, kind in _SPEC_CASES.items()}


def spec_to_json(
    kind: ComponentKind, spec: message_pb2.ComponentSpec, field_path: str
) -> dict[str, Any]:
    case = spec.WhichOneof("spec")
    if case is None:
        raise InvalidArgument.for_field(field_path, f"required: the {_CASE_OF_KIND[kind]} spec")
    if _SPEC_CASES[case] is not kind:
        raise InvalidArgument.for_field(
            f"{field_path}.{case}", f"a {case} spec given for a {kind.value} component"
        )
    if case == "prompt":
        return {"text": spec.prompt.text}
    if case == "skill":
        return {
            "description": spec.skill.description,
            "instructions": spec.skill.instructions,
            "files": [{"path": f.path, "content": f.content} for f in spec.skill.files],
        }
    if case == "tool":
        tool = spec.tool
        data: dict[str, Any] = {"description": tool.description, "side_effects": tool.side_effects}
        if tool.HasField("input_schema"):
            data["input_schema"] = struct_to_json(tool.input_schema)
        if tool.HasField("output_schema"):
            data["output_schema"] = struct_to_json(tool.output_schema)
        return data
    if case == "model_policy":
        return {
            "candidates": [
                {
                    "name": c.name,
                    "provider": c.provider,
                    "model_id": c.model_id,
                    **(
                        {"parameters": struct_to_json(c.parameters)}
                        if c.HasField("parameters")
                        else {}
                    ),
                    "max_context_tokens": c.max_context_tokens,
                    "fallback_on": [
                        short_name(
                            enum_pb2.ErrorClass,
                            "ERROR_CLASS_",
                            v,
                            f"{field_path}.model_policy.candidates[{i}].fallback_on[{j}]",
                        )
                        for j, v in enumerate(c.fallback_on)
                    ],
                }
                for i, c in enumerate(spec.model_policy.candidates)
            ]
        }
    if case == "permission_policy":
        policy = spec.permission_policy
        return {
            "rules": [
                {
                    "tool": r.tool,
                    "decision": short_name(
                        enum_pb2.PermissionDecision,
                        "PERMISSION_DECISION_",
                        r.decision,
                        f"{field_path}.permission_policy.rules[{i}].decision",
                    ),
                }
                for i, r in enumerate(policy.rules)
            ],
            "default_decision": short_name(
                enum_pb2.PermissionDecision,
                "PERMISSION_DECISION_",
                policy.default_decision,
                f"{field_path}.permission_policy.default_decision",
            ),
        }
    return {
        "checks": [
            {
                "name": c.name,
                "description": c.description,
                "condition": short_name(
                    enum_pb2.CompletionCondition,
                    "COMPLETION_CONDITION_",
                    c.condition,
                    f"{field_path}.completion_policy.checks[{i}].condition",
                ),
                "artifact_kind": c.artifact_kind,
                "tool": c.tool,
            }
            for i, c in enumerate(spec.completion_policy.checks)
        ]
    }


def spec_to_proto(kind: ComponentKind, spec: dict[str, Any]) -> message_pb2.ComponentSpec:
    out = message_pb2.ComponentSpec()
    if kind is ComponentKind.PROMPT:
        out.prompt.text = spec.get("text", "")
    elif kind is ComponentKind.SKILL:
        out.skill.description = spec.get("description", "")
        out.skill.instructions = spec.get("instructions", "")
        for f in spec.get("files", []):
            out.skill.files.add(path=f.get("path", ""), content=f.get("content", ""))
    elif kind is ComponentKind.TOOL:
        out.tool.description = spec.get("description", "")
        out.tool.side_effects = spec.get("side_effects", False)
        if "input_schema" in spec:
            out.tool.input_schema.CopyFrom(json_to_struct(spec["input_schema"]))
        if "output_schema" in spec:
            out.tool.output_schema.CopyFrom(json_to_struct(spec["output_schema"]))
    elif kind is ComponentKind.MODEL_POLICY:
        for c in spec.get("candidates", []):
            candidate = out.model_policy.candidates.add(
                name=c.get("name", ""),
                provider=c.get("provider", ""),
                model_id=c.get("model_id", ""),
                max_context_tokens=c.get("max_context_tokens", 0),
                fallback_on=[
                    enum_value(enum_pb2.ErrorClass, "ERROR_CLASS_", e)
                    for e in c.get("fallback_on", [])
                ],
            )
            if "parameters" in c:
                candidate.parameters.CopyFrom(json_to_struct(c["parameters"]))
    elif kind is ComponentKind.PERMISSION_POLICY:
        for r in spec.get("rules", []):
            out.permission_policy.rules.add(
                tool=r["tool"],
                decision=enum_value(
                    enum_pb2.PermissionDecision, "PERMISSION_DECISION_", r["decision"]
                ),
            )
        out.permission_policy.default_decision = enum_value(
            enum_pb2.PermissionDecision,
            "PERMISSION_DECISION_",
            spec.get("default_decision", "UNSPECIFIED"),
        )
    else:
        for c in spec.get("checks", []):
            out.completion_policy.checks.add(
                name=c.get("name", ""),
                description=c.get("description", ""),
                condition=enum_value(
                    enum_pb2.CompletionCondition,
                    "COMPLETION_CONDITION_",
                    c.get("condition", "UNSPECIFIED"),
                ),
                artifact_kind=c.get("artifact_kind", ""),
                tool=c.get("tool", ""),
            )
    return out


# -- messages ---------------------------------------------------------------------------------


def draft_from_proto(
    draft: message_pb2.ComponentDraft, field_path: str = "component"
) -> ComponentDraft:
    kind = kind_from_proto(draft.kind, f"{field_path}.kind")
    return ComponentDraft(
        kind=kind,
        name=draft.name,
        version=draft.version,
        description=draft.description,
        spec=spec_to_json(kind, draft.spec, f"{field_path}.spec"),
    )


def provenance_from_proto(p: message_pb2.Provenance) -> Provenance:
    return Provenance(p.publisher, p.source_repo, p.commit, p.pipeline_url, dict(p.labels))


def provenance_to_proto(p: Provenance) -> message_pb2.Provenance:
    return message_pb2.Provenance(
        publisher=p.publisher,
        source_repo=p.source_repo,
        commit=p.commit,
        pipeline_url=p.pipeline_url,
        labels=p.labels,
    )


def verified_provenance_to_proto(v: VerifiedProvenance | None) -> message_pb2.VerifiedProvenance:
    if v is None:
        return message_pb2.VerifiedProvenance(verified=False)
    return message_pb2.VerifiedProvenance(
        verified=True,
        issuer=v.issuer,
        subject=v.subject,
        repository=v.repository,
        ref=v.ref,
        commit_sha=v.commit_sha,
        workflow=v.workflow,
        claims=v.claim_map(),
    )


def _publish_record(
    time: dt.datetime,
    provenance: Provenance,
    principal: str,
    verified: VerifiedProvenance | None,
) -> message_pb2.PublishRecord:
    return message_pb2.PublishRecord(
        publish_time=to_timestamp(time),
        provenance=provenance_to_proto(provenance),
        principal=principal,
        verified_provenance=verified_provenance_to_proto(verified),
    )


def component_to_proto(c: Component) -> message_pb2.Component:
    return message_pb2.Component(
        kind=kind_to_proto(c.kind),
        name=c.name,
        version=c.version,
        digest=c.digest,
        description=c.description,
        spec=spec_to_proto(c.kind, c.spec),
        schema_digest=c.schema_digest or "",
        publish=_publish_record(c.publish_time, c.provenance, c.principal, c.verified),
    )


def definition_from_proto(d: message_pb2.AgentDefinition) -> AgentDefinition:
    source = d.system_prompt.WhichOneof("source")
    return AgentDefinition(
        agent_id=d.agent_id,
        version_label=d.version_label,
        description=d.description,
        system_prompt_text=d.system_prompt.text if source == "text" else None,
        system_prompt_ref=d.system_prompt.ref if source == "ref" else None,
        model_policy=d.model_policy,
        skills=tuple(d.skills),
        tools=tuple(d.tools),
        permission_policy=d.permission_policy,
        completion_policy=d.completion_policy,
    )


def definition_to_proto(d: AgentDefinition) -> message_pb2.AgentDefinition:
    out = message_pb2.AgentDefinition(
        agent_id=d.agent_id,
        version_label=d.version_label,
        description=d.description,
        model_policy=d.model_policy,
        skills=d.skills,
        tools=d.tools,
        permission_policy=d.permission_policy,
        completion_policy=d.completion_policy,
    )
    if d.system_prompt_text is not None:
        out.system_prompt.text = d.system_prompt_text
    elif d.system_prompt_ref is not None:
        out.system_prompt.ref = d.system_prompt_ref
    return out


def _resolved(e: ClosureEntry) -> message_pb2.ResolvedComponent:
    return message_pb2.ResolvedComponent(
        kind=kind_to_proto(e.kind),
        name=e.name,
        version=e.version,
        digest=e.digest,
        requested_ref=e.requested_ref,
        schema_digest=e.schema_digest or "",
    )


def closure_from_proto(closure: message_pb2.ResolvedClosure) -> tuple[ClosureEntry, ...]:
    """The closure entries a served version names (its digest is recomputed from them)."""

    def entry(slot: str, r: message_pb2.ResolvedComponent) -> ClosureEntry:
        return ClosureEntry(
            slot=slot,
            kind=kind_from_proto(r.kind, f"closure.{slot}"),
            name=r.name,
            version=r.version,
            digest=r.digest,
            requested_ref=r.requested_ref,
            schema_digest=r.schema_digest or None,
        )

    out = [
        entry(slot, getattr(closure, slot))
        for slot in ("system_prompt", "model_policy", "permission_policy", "completion_policy")
        if closure.HasField(slot)
    ]
    for family in ("skills", "tools"):
        out.extend(entry(f"{family}[{r.name}]", r) for r in getattr(closure, family))
    return tuple(out)


def closure_to_proto(closure: tuple[ClosureEntry, ...]) -> message_pb2.ResolvedClosure:
    out = message_pb2.ResolvedClosure()
    for e in closure:
        family = e.slot.partition("[")[0]
        if family in ("skills", "tools"):
            getattr(out, family).append(_resolved(e))
        else:
            getattr(out, family).CopyFrom(_resolved(e))
    return out


def agent_version_to_proto(v: AgentVersion) -> message_pb2.AgentVersion:
    return message_pb2.AgentVersion(
        agent_id=v.agent_id,
        version_label=v.version_label,
        digest=v.digest,
        definition=definition_to_proto(v.definition),
        closure=closure_to_proto(v.closure),
        publish=_publish_record(v.publish_time, v.provenance, v.principal, v.verified),
        tags=list(v.tags),
    )


_REFERENCE_KIND = {
    "LABEL": enum_pb2.REFERENCE_KIND_LABEL,
    "DIGEST": enum_pb2.REFERENCE_KIND_DIGEST,
    "TAG": enum_pb2.REFERENCE_KIND_TAG,
}


def resolution_to_proto(r: Resolution) -> message_pb2.Resolution:
    return message_pb2.Resolution(
        requested_ref=r.requested_ref,
        kind=_REFERENCE_KIND[r.kind.value],
        resolved_digest=r.resolved_digest,
        tag=r.tag,
        tag_event_sequence=r.tag_event_sequence,
        resolve_time=to_timestamp(r.resolve_time),
    )


def tag_to_proto(t: Tag) -> message_pb2.Tag:
    return message_pb2.Tag(
        agent_id=t.agent_id,
        name=t.name,
        digest=t.digest,
        update_time=to_timestamp(t.update_time),
        updated_by=t.updated_by,
        event_sequence=t.event_sequence,
        updated_by_label=t.updated_by_label,
    )


def tag_event_to_proto(e: TagEvent) -> message_pb2.TagEvent:
    return message_pb2.TagEvent(
        sequence=e.sequence,
        agent_id=e.agent_id,
        tag=e.tag,
        type=enum_pb2.TAG_EVENT_TYPE_SET if e.type == "SET" else enum_pb2.TAG_EVENT_TYPE_DELETE,
        from_digest=e.from_digest,
        to_digest=e.to_digest,
        actor=e.actor,
        reason=e.reason,
        provenance=provenance_to_proto(e.provenance),
        event_time=to_timestamp(e.event_time),
        actor_label=e.actor_label,
    )


_CHANGE_TYPE = {
    "ADDED": enum_pb2.CHANGE_TYPE_ADDED,
    "REMOVED": enum_pb2.CHANGE_TYPE_REMOVED,
    "MODIFIED": enum_pb2.CHANGE_TYPE_MODIFIED,
}


def change_to_proto(c: FieldChange) -> message_pb2.FieldChange:
    return message_pb2.FieldChange(
        path=c.path,
        type=_CHANGE_TYPE[c.type],
        base_value=c.base_value,
        target_value=c.target_value,
        base_schema_digest=c.base_schema_digest,
        target_schema_digest=c.target_schema_digest,
    )
