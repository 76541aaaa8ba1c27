"""Bundle files: the YAML a CI job publishes, read into registry protos and domain types.

A bundle has two top-level keys: ``components`` (a list of component drafts, optional) and
``agent`` (one agent definition). Each component is written as ``kind``, ``name``,
``version``, ``description`` and ``spec``, where ``spec`` holds the fields of the kind's spec
message with their proto names and enum values without their proto prefix
(``RATE_LIMITED``, not ``ERROR_CLASS_RATE_LIMITED``)::

    components:
      - kind: TOOL
        name: read_file
        version: 1
        spec: {description: Read a file, input_schema: {type: object}}
    agent:
      agent_id: coding_agent
      version_label: agent_v7
      system_prompt: {text: You are a careful coding agent.}
      model_policy: coding-balanced@3
      tools: [read_file@1]

The file is mapped through the same proto messages (``ComponentDraft``, ``AgentDefinition``)
that a gRPC client sends, then through :mod:`agentrt_core.registry_map`, so ``agentrt digest``
normalises exactly as the server does and computes the same digest offline.

Anything that stops a file from becoming protos raises :class:`BundleError` with one line
naming the file and the place in it. Rule violations found afterwards (a bad JSON Schema, an
unresolvable reference) are the registry's own errors from :mod:`agentrt_core.publishing`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt_core import registry_map
from agentrt_core.canonical import ComponentKind
from agentrt_core.errors import FieldViolation, InvalidArgument
from agentrt_core.model import AgentDefinition, Component, ComponentDraft, Provenance
from agentrt_core.proto_json import enum_value
from agentrt_core.publishing import (
    ComponentSource,
    DigestedAgent,
    DigestedComponent,
    digest_agent,
    digest_component,
)

__all__ = [
    "AGENT_PREFIX",
    "Bundle",
    "BundleError",
    "FileComponent",
    "FileComponentSource",
    "digest_bundle",
    "load",
    "parse",
]

#: Field-path prefix of the agent in violations (``agent.tools[1]``), matching the file's key.
AGENT_PREFIX = "agent"

# Enum values are written without the proto prefix; the prefix is added back before ParseDict.
_ENUM_PREFIXES = {
    enum_pb2.ComponentKind.DESCRIPTOR.full_name: "COMPONENT_KIND_",
    enum_pb2.ErrorClass.DESCRIPTOR.full_name: "ERROR_CLASS_",
    enum_pb2.PermissionDecision.DESCRIPTOR.full_name: "PERMISSION_DECISION_",
    enum_pb2.CompletionCondition.DESCRIPTOR.full_name: "COMPLETION_CONDITION_",
}

# The spec message of each kind, as written under a component's ``spec:``.
_SPEC_CASES: dict[ComponentKind, str] = {
    ComponentKind.PROMPT: "prompt",
    ComponentKind.SKILL: "skill",
    ComponentKind.TOOL: "tool",
    ComponentKind.MODEL_POLICY: "model_policy",
    ComponentKind.PERMISSION_POLICY: "permission_policy",
    ComponentKind.COMPLETION_POLICY: "completion_policy",
}

_COMPONENT_KEYS = ("kind", "name", "version", "description", "spec")
_TOP_LEVEL_KEYS = ("components", "agent")

# String fields that YAML readers commonly write unquoted as numbers (``version: 1``).
_VERSION_FIELDS = frozenset({"version", "version_label"})

# Published components need a time; a file's components were never published, and the
# digest does not cover the time, so any fixed value will do.
_UNPUBLISHED = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class BundleError(Exception):
    """The file cannot be read into protos; ``str()`` is one line naming the file and place."""


@dataclass(frozen=True)
class FileComponent:
    """One entry of ``components:``: its place in the file, its proto, its domain draft."""

    #: Where it sits in the file (``components[2]``); also the prefix of its violations.
    where: str
    proto: message_pb2.ComponentDraft
    draft: ComponentDraft

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.draft.name}@{self.draft.version}"


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle file."""

    source: str
    components: tuple[FileComponent, ...]
    #: The agent as it goes on the wire, or None when the file declares none.
    agent: message_pb2.AgentDefinition | None
    definition: AgentDefinition | None

    def require_agent(self) -> tuple[message_pb2.AgentDefinition, AgentDefinition]:
        """The agent, for commands that need one.

        Raises:
            BundleError: the file has no ``agent:`` section.
        """
        if self.agent is None or self.definition is None:
            raise BundleError(f"{self.source}: no 'agent:' section (an agent definition)")
        return self.agent, self.definition


# -- reading ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys.

    PyYAML silently keeps the last of two equal keys; in a file whose content is digested and
    published forever, a silently dropped ``version:`` or ``tools:`` is worse than an error.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(path: str | Path) -> Bundle:
    """Read and validate a bundle file.

    Args:
        path: The YAML file.

    Returns:
        The bundle, its components in file order.

    Raises:
        BundleError: the file is missing, is not YAML, or does not have the bundle's shape
            (unknown fields, wrong types, unquoted float versions, unknown enum values).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BundleError(f"cannot read {source}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise BundleError(f"{source}: not UTF-8 text: {exc.reason}") from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise BundleError(f"{where}: not valid YAML: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise BundleError(f"{source}: not valid YAML: {_one_line(str(exc))}") from exc
    return parse(data, source)


def parse(data: object, source: str = "<bundle>") -> Bundle:
    """Turn an already-parsed YAML document into a bundle.

    Args:
        data: What ``yaml.safe_load`` returned.
        source: The file's name, used in messages.

    Raises:
        BundleError: as for :func:`load`.
    """
    if not isinstance(data, dict):
        raise BundleError(f"{source}: expected a mapping with 'components:' and 'agent:'")
    unknown = [k for k in data if k not in _TOP_LEVEL_KEYS]
    if unknown:
        raise BundleError(
            f"{source}: unknown top-level key {unknown[0]!r} (expected 'components' and 'agent')"
        )
    raw_components = data.get("components") or []
    if not isinstance(raw_components, list):
        raise BundleError(f"{source}: components: expected a list")
    components = tuple(
        _component(item, f"components[{i}]", source) for i, item in enumerate(raw_components)
    )
    agent: message_pb2.AgentDefinition | None = None
    definition: AgentDefinition | None = None
    if data.get("agent") is not None:
        agent = _message(data["agent"], message_pb2.AgentDefinition(), AGENT_PREFIX, f"{source}: ")
        definition = registry_map.definition_from_proto(agent)
    return Bundle(source, components, agent, definition)


def _component(item: object, where: str, source: str) -> FileComponent:
    if not isinstance(item, dict):
        raise BundleError(f"{source}: {where}: expected a mapping ({', '.join(_COMPONENT_KEYS)})")
    name = item.get("name")
    # Name the component in every message, so a long file is easy to navigate.
    label = f"{where} ({name}@{item.get('version')})" if isinstance(name, str) else where
    context = f"{source}: {label}: "
    unknown = [k for k in item if k not in _COMPONENT_KEYS]
    if unknown:
        raise BundleError(
            f"{context}unknown field {unknown[0]!r} (expected {', '.join(_COMPONENT_KEYS)})"
        )
    for key in ("kind", "name", "version", "spec"):
        if item.get(key) is None:
            raise BundleError(f"{context}{key}: required")
    kind = _kind(item["kind"], context)
    case = _SPEC_CASES[kind]
    proto = message_pb2.ComponentDraft(
        kind=enum_value(enum_pb2.ComponentKind, "COMPONENT_KIND_", kind.value),
        name=_string(item["name"], "name", context),
        version=_string(item["version"], "version", context),
        description=_string(item.get("description") or "", "description", context),
    )
    spec_message = getattr(proto.spec, case)
    _message(item["spec"], spec_message, "spec", context)
    # An all-default spec message is not "set" in its oneof until touched.
    spec_message.SetInParent()
    try:
        draft = registry_map.draft_from_proto(proto, where)
    except InvalidArgument as exc:
        raise BundleError(f"{context}{_first_violation(exc)}") from exc
    return FileComponent(where, proto, draft)


def _kind(value: object, context: str) -> ComponentKind:
    names = ", ".join(k.value for k in ComponentKind)
    if not isinstance(value, str):
        raise BundleError(f"{context}kind: expected one of {names}")
    try:
        return ComponentKind(value.removeprefix("COMPONENT_KIND_"))
    except ValueError:
        raise BundleError(f"{context}kind: {value!r} is not one of {names}") from None


def _string(value: object, key: str, context: str) -> str:
    if isinstance(value, str):
        return value
    if key.rpartition(".")[2].partition("[")[0] in _VERSION_FIELDS:
        # bool is an int subclass; `version: yes` is a mistake, not version 1.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, float):
            raise BundleError(
                f"{context}{key}: {value!r} was read as a number, which can silently change "
                f'it (2.10 reads as 2.1); quote the version: "{value}"'
            )
    raise BundleError(f"{context}{key}: expected a string, got {_type_name(value)}")


def _message(value: object, message: Message, path: str, context: str) -> Any:
    """Fill ``message`` from a YAML mapping; return it.

    The mapping is checked against the message's descriptor first, so an unknown field or a
    wrong type is reported with its path in the file; ``ParseDict`` then does the conversion
    (including Struct values, which are free-form JSON).
    """
    document = _to_proto_json(value, cast(Descriptor, message.DESCRIPTOR), path, context)
    try:
        json_format.ParseDict(document, message)
    except json_format.ParseError as exc:
        raise BundleError(f"{context}{path}: {_one_line(str(exc))}") from exc
    return message


def _to_proto_json(
    value: object, descriptor: Descriptor, path: str, context: str
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BundleError(f"{context}{path}: expected a mapping, got {_type_name(value)}")
    out: dict[str, Any] = {}
    oneofs: dict[str, str] = {}
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key) if isinstance(key, str) else None
        if field is None:
            known = ", ".join(f.name for f in descriptor.fields)
            raise BundleError(
                f"{context}{path}.{key}: unknown field ({descriptor.name} has: {known})"
            )
        if item is None:
            continue  # `description:` with nothing after it: the field is absent
        oneof = field.containing_oneof
        if oneof is not None:
            if oneof.name in oneofs:
                raise BundleError(
                    f"{context}{path}: give either {oneofs[oneof.name]!r} or {key!r}, not both"
                )
            oneofs[oneof.name] = key
        where = f"{path}.{key}"
        if field.is_repeated:
            if not isinstance(item, list):
                raise BundleError(f"{context}{where}: expected a list, got {_type_name(item)}")
            out[key] = [
                _field_value(field, element, f"{where}[{i}]", context)
                for i, element in enumerate(item)
            ]
        else:
            out[key] = _field_value(field, item, where, context)
    return out


def _field_value(field: FieldDescriptor, value: object, where: str, context: str) -> Any:
    if field.message_type is not None:
        if field.message_type.full_name == "google.protobuf.Struct":
            if not isinstance(value, dict):
                raise BundleError(f"{context}{where}: expected a mapping (a JSON object)")
            return value
        return _to_proto_json(value, field.message_type, where, context)
    if field.enum_type is not None:
        return _enum(field, value, where, context)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _string(value, where, context)
    if field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise BundleError(f"{context}{where}: expected true or false, got {_type_name(value)}")
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise BundleError(f"{context}{where}: expected an integer, got {_type_name(value)}")
    return value


def _enum(field: FieldDescriptor, value: object, where: str, context: str) -> str:
    enum = field.enum_type
    assert enum is not None
    prefix = _ENUM_PREFIXES.get(enum.full_name, "")
    allowed = [v.name.removeprefix(prefix) for v in enum.values if v.number != 0]
    name = value.removeprefix(prefix) if isinstance(value, str) else None
    if name not in allowed:
        raise BundleError(f"{context}{where}: {value!r} is not one of {', '.join(allowed)}")
    return prefix + str(name)


def _type_name(value: object) -> str:
    if value is None:
        return "nothing"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _first_violation(error: InvalidArgument) -> str:
    if error.violations:
        first = error.violations[0]
        return f"{first.field}: {first.description}"
    return error.message


# -- offline digests -------------------------------------------------------------------------


class FileComponentSource:
    """A :class:`agentrt_core.publishing.ComponentSource` over components declared in files.

    References resolve as they would on the server once the components are published;
    ``fallback`` (a server, say) is asked for whatever the files do not declare.
    """

    def __init__(self, fallback: ComponentSource | None = None) -> None:
        self._fallback = fallback
        self._by_version: dict[tuple[str, str], tuple[Component, str]] = {}
        self._by_digest: dict[str, Component] = {}
        self._kinds: dict[str, tuple[ComponentKind, str]] = {}

    def add(self, digested: DigestedComponent, where: str) -> None:
        """Add one validated component.

        Raises:
            InvalidArgument: the same ``name@version`` is declared with other content, or a
                name is declared with two kinds (both refused by the server too).
        """
        draft = digested.draft
        kind, first = self._kinds.setdefault(draft.name, (draft.kind, where))
        if kind is not draft.kind:
            raise InvalidArgument.for_field(
                f"{where}.kind",
                f"{draft.name!r} is a {kind.value} at {first}; names are unique across kinds",
            )
        component = Component(
            kind=draft.kind,
            name=draft.name,
            version=draft.version,
            digest=digested.digest,
            description=draft.description,
            spec=digested.spec,
            schema_digest=digested.schema_digest,
            publish_time=_UNPUBLISHED,
            provenance=Provenance(),
        )
        key = (draft.name, draft.version)
        existing, existing_where = self._by_version.setdefault(key, (component, where))
        if existing.digest != component.digest:
            raise InvalidArgument.for_field(
                where,
                f"{draft.name}@{draft.version} is also declared at {existing_where} with "
                f"different content ({existing.digest} there, {component.digest} here)",
            )
        self._by_digest.setdefault(component.digest, component)

    def by_version(self, name: str, version: str) -> Component | None:
        """The declared ``name@version``, else the fallback's."""
        found = self._by_version.get((name, version))
        if found is not None:
            return found[0]
        return self._fallback.by_version(name, version) if self._fallback else None

    def by_digest(self, digest: str) -> Component | None:
        """The declared component with this digest, else the fallback's."""
        found = self._by_digest.get(digest)
        if found is not None:
            return found
        return self._fallback.by_digest(digest) if self._fallback else None

    def versions(self, name: str) -> Sequence[Component]:
        """Every version of ``name``: declared ones, then the fallback's other versions."""
        declared = {v: c for (n, v), (c, _) in self._by_version.items() if n == name}
        if self._fallback is not None:
            for component in self._fallback.versions(name):
                declared.setdefault(component.version, component)
        return list(declared.values())


def digest_components(bundle: Bundle) -> list[DigestedComponent]:
    """Validate and digest every component of a bundle, in file order.

    Raises:
        InvalidArgument: the first component that breaks a registry rule; violation fields
            are paths in the file (``components[2].spec.input_schema``).
    """
    digested: list[DigestedComponent] = []
    for component in bundle.components:
        try:
            digested.append(digest_component(component.draft, field_prefix=component.where))
        except InvalidArgument as exc:
            raise _as_file_paths(exc, component) from exc
    return digested


def _as_file_paths(error: InvalidArgument, component: FileComponent) -> InvalidArgument:
    """Rewrite ``components[2].spec.tool.x`` to ``components[2].spec.x``: in the file, the spec
    case is implied by ``kind`` and has no key of its own."""
    case = f"{component.where}.spec.{_SPEC_CASES[component.draft.kind]}"
    violations = [
        FieldViolation(
            f"{component.where}.spec{v.field.removeprefix(case)}"
            if v.field == case or v.field.startswith((case + ".", case + "["))
            else v.field,
            v.description,
        )
        for v in error.violations
    ]
    return InvalidArgument(error.message, violations, reason=error.reason, metadata=error.metadata)


def digest_bundle(
    bundle: Bundle, extra: Iterable[Bundle] = (), fallback: ComponentSource | None = None
) -> DigestedAgent:
    """Compute the digest ``agentrt publish`` would produce for the bundle's agent, offline.

    Args:
        bundle: The file with the agent.
        extra: More files whose components references may resolve to (``--with``).
        fallback: Asked for components no file declares (a server), if given.

    Raises:
        BundleError: the bundle declares no agent, or an ``extra`` file breaks a rule.
        InvalidArgument: a component or the definition breaks a registry rule.
        NotFound: a reference resolves to no declared (or fallback) component; its
            ``resource_name`` is the reference and ``metadata["field"]`` its field path.
    """
    _, definition = bundle.require_agent()
    source = FileComponentSource(fallback)
    for each in (bundle, *extra):
        try:
            digested = digest_components(each)
        except InvalidArgument as exc:
            if each is bundle:
                raise
            # Violation paths are relative to a file; say which one when it is not the main one.
            raise BundleError(f"{each.source}: {_first_violation(exc)}") from exc
        for component, one in zip(each.components, digested, strict=True):
            where = component.where if each is bundle else f"{each.source}: {component.where}"
            source.add(one, where)
    return digest_agent(definition, source, prefix=AGENT_PREFIX)
