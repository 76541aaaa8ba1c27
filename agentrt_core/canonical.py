"""The documents whose digests are a component's and an agent version's digest.

A digest is ``sha256:<64 lowercase hex>`` of the RFC 8785 (JCS) serialisation of a
*normalised document*. The work is in three layers, one module each:

* :mod:`agentrt_core.jcs`: JSON to canonical bytes and digests, refusing values two
  implementations could disagree on (integers a double cannot hold, NaN, lone surrogates);
* :mod:`agentrt_core.specs`: the normalised spec of each component kind (absent and default
  members, lists that are sets, unknown members);
* this module: the component document (kind, name, version, description, spec) and the agent
  document (id, label, description, and the digests of everything its closure resolved to),
  and their digests.

The rules are written out, with test vectors, in ``docs/digest.md``; these modules are their
reference implementation and must stay in step with that file.

:class:`~agentrt_core.jcs.CanonicalError` and :class:`~agentrt_core.specs.ComponentKind` are
part of this module's API (every function here raises the one and takes the other), so they
are importable from here too.

The module is pure: no I/O, no storage, no protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentrt_core.jcs import (
    JSON_ENCODER,
    CanonicalError,
    check_text,
    digest_bytes,
    digest_document,
    schema_digest,
    type_name,
)
from agentrt_core.refs import is_digest, is_valid_label, is_valid_name, is_valid_version
from agentrt_core.specs import ComponentKind, Struct, keyed_set, parse_kind, read_spec

__all__ = [
    "AGENT_DOCUMENT_TYPE",
    "COMPONENT_DOCUMENT_TYPE",
    "AgentClosure",
    "CanonicalError",
    "ComponentKind",
    "ResolvedEntry",
    "agent_digest",
    "agent_document",
    "component_digest",
    "component_document",
    "tool_digests",
]

COMPONENT_DOCUMENT_TYPE: Final = "agentrt.component.v1"
"""The ``type`` member of a component document (bumped if the rules ever change)."""
AGENT_DOCUMENT_TYPE: Final = "agentrt.agent.v1"
"""The ``type`` member of an agent document."""

_NAME_GRAMMAR: Final = "1-64 of a-z 0-9 _ -, starting with a letter; 'sha256' is reserved"


def _check_string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise CanonicalError(path, f"must be a string, not {type_name(value)}")
    # The text itself, even if a subclass (a str enum) would encode or compare differently.
    return str.__str__(value)


def _check_name(name: object, path: str) -> str:
    name = _check_string(name, path)
    if is_valid_name(name):
        return name
    raise CanonicalError(path, f"{name!r} is not a valid name ({_NAME_GRAMMAR})")


def _check_version(version: object, path: str) -> str:
    version = _check_string(version, path)
    if is_valid_version(version):
        return version
    raise CanonicalError(
        path,
        f"{version!r} is not a component version (semver 2.0.0 such as '2.1.0', or a positive "
        "integer such as '3')",
    )


def _check_description(description: object, path: str) -> str:
    description = _check_string(description, path)
    check_text(description, path)
    return description


def component_document(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the normalised document whose digest is a component's digest.

    The shape is ``{"type": "agentrt.component.v1", "kind", "name", "version",
    "description", "spec"}``; ``description`` is always present (possibly ``""``). The version
    and description are content: a version label maps to exactly one digest forever and a
    digest to exactly one ``name@version``, so a digest read in an audit log says which version
    it was without a look-up, and storage keys each published version by its digest.

    An *anonymous* PROMPT (how an agent's inline system prompt is stored) has an empty name and
    an empty version; its document omits both members:
    ``{"type", "kind": "PROMPT", "description", "spec"}``.

    Args:
        kind: A :class:`ComponentKind` value such as ``"TOOL"``.
        name: The component name (name grammar of :mod:`agentrt_core.refs`), or ``""`` for an
            anonymous PROMPT.
        version: A component version (semver 2.0.0 or a positive integer), or ``""`` for an
            anonymous PROMPT.
        description: Free text, kept byte-exact; may be empty.
        spec: The kind's spec as a JSON-like mapping (see :func:`normalise_spec`).

    Returns:
        The normalised document, ready for :func:`digest_document`.

    Raises:
        CanonicalError: The kind, name, version, description or spec is invalid (an empty
            name or version except both on a PROMPT); ``field`` says where.
    """
    return _component_document(kind, name, version, description, spec)[0]


def _component_document(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> tuple[dict[str, Any], bool]:
    k = parse_kind(kind, "kind")
    name = _check_string(name, "name")
    version = _check_string(version, "version")
    anonymous = k is ComponentKind.PROMPT and name == "" and version == ""
    if not anonymous:
        if k is ComponentKind.PROMPT and (name == "" or version == ""):
            raise CanonicalError(
                "name" if name == "" else "version",
                "is empty, but the other is not: only an anonymous PROMPT has no name, and "
                "then no version either",
            )
        if name == "":
            raise CanonicalError(
                "name", f"is required (only a PROMPT may be anonymous, not a {k.value})"
            )
        _check_name(name, "name")
        _check_version(version, "version")
    description = _check_description(description, "description")
    normalised, fast = read_spec(k, spec)
    # Members written in JCS order, so a fast document can be encoded as it is.
    doc: dict[str, Any] = {"description": description, "kind": k.value}
    if not anonymous:
        doc["name"] = name
    doc["spec"] = normalised
    doc["type"] = COMPONENT_DOCUMENT_TYPE
    if not anonymous:
        doc["version"] = version
    return doc, fast


def component_digest(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> str:
    """Return a component's digest (see :func:`component_document`).

    Prefer this to ``digest_document(component_document(...))``, which gives the same digest
    but checks the (possibly large) document a second time.

    Raises:
        CanonicalError: See :func:`component_document`.
    """
    doc, fast = _component_document(kind, name, version, description, spec)
    if fast:
        # Everything in `doc` was checked and ordered while normalising, so the encoder's
        # output is already the JCS form (see _fast_jcs for why that is exact).
        return digest_bytes(JSON_ENCODER.encode(doc).encode("utf-8"))
    return digest_document(doc)


def component_digests(
    kind: str, name: str, version: str, description: str, spec: Mapping[str, Any]
) -> tuple[str, str | None]:
    """A component's digest and, for a TOOL, its input schema digest (None otherwise): what a
    verifier recomputes from a component it was served or handed.

    Raises:
        CanonicalError: See :func:`component_document`.
    """
    if kind == ComponentKind.TOOL.value:
        return tool_digests(name, version, description, spec)
    return component_digest(kind, name, version, description, spec), None


def tool_digests(
    name: str, version: str, description: str, spec: Mapping[str, Any]
) -> tuple[str, str]:
    """Return a TOOL's component digest and its input schema digest, normalising once.

    Equal to ``(component_digest("TOOL", name, version, description, spec),
    schema_digest(spec["input_schema"]))``; publishing needs both, and a large schema need not
    be checked twice.

    Raises:
        CanonicalError: See :func:`component_document`.
    """
    doc, fast = _component_document(ComponentKind.TOOL, name, version, description, spec)
    if not fast:
        return digest_document(doc), schema_digest(doc["spec"]["input_schema"])
    schema = doc["spec"]["input_schema"]
    return (
        digest_bytes(JSON_ENCODER.encode(doc).encode("utf-8")),
        digest_bytes(JSON_ENCODER.encode(schema).encode("utf-8")),
    )


# --------------------------------------------------------------------------------------------
# Agents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedEntry:
    """One component as an agent's closure resolved it.

    Attributes:
        kind: The component's kind.
        name: The component's name; ``""`` only for an inline system prompt (stored as an
            anonymous PROMPT component).
        version: The version it resolved to; ``None`` only for an inline system prompt.
        digest: The component's digest.
        schema_digest: For a TOOL, the digest of its input schema; ``None`` otherwise.
    """

    kind: ComponentKind
    name: str
    version: str | None
    digest: str
    schema_digest: str | None = None


@dataclass(frozen=True, slots=True)
class AgentClosure:
    """Every component an agent definition resolved to: its lock file.

    Skills and tools are sets (sorted by name in the document). The permission and
    completion policies may be absent; the members are then omitted from the document.
    """

    system_prompt: ResolvedEntry
    model_policy: ResolvedEntry
    skills: tuple[ResolvedEntry, ...] = ()
    tools: tuple[ResolvedEntry, ...] = ()
    permission_policy: ResolvedEntry | None = None
    completion_policy: ResolvedEntry | None = None

    def __post_init__(self) -> None:
        # Accept any sequence but store tuples, so the closure is immutable and hashable.
        object.__setattr__(self, "skills", tuple(self.skills))
        object.__setattr__(self, "tools", tuple(self.tools))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AgentClosure:
        """Build a closure from its JSON form (the agent document's members, as in vectors).

        Each entry is ``{"name", "version", "digest", "schema_digest"?}``, or ``{"digest"}``
        alone for an inline system prompt (name ``""``, version ``None``); its kind follows
        from where it sits.

        Raises:
            CanonicalError: A member is missing, unknown or of the wrong type.
        """
        s = Struct(data, "closure", _SLOTS)

        def entry(value: object, path: str, kind: ComponentKind) -> ResolvedEntry:
            keys = ("name", "version", "digest", "schema_digest")
            e = Struct(value, path, keys)
            got = {k: e.get(k) for k in keys}
            for k, v in got.items():
                if v is not None and not isinstance(v, str):
                    raise CanonicalError(e.at(k), f"must be a string, not {type_name(v)}")
            return ResolvedEntry(
                kind,
                str(got["name"] or ""),
                None if got["version"] is None else str(got["version"]),
                str(got["digest"] or ""),
                None if got["schema_digest"] is None else str(got["schema_digest"]),
            )

        def one(slot: str, kind: ComponentKind) -> ResolvedEntry | None:
            value = s.get(slot)
            return None if value is None else entry(value, s.at(slot), kind)

        system_prompt = one("system_prompt", ComponentKind.PROMPT)
        model_policy = one("model_policy", ComponentKind.MODEL_POLICY)
        if system_prompt is None:
            raise CanonicalError("closure.system_prompt", "is required")
        if model_policy is None:
            raise CanonicalError("closure.model_policy", "is required")
        return cls(
            system_prompt=system_prompt,
            model_policy=model_policy,
            skills=tuple(entry(v, p, ComponentKind.SKILL) for p, v in s.items("skills")),
            tools=tuple(entry(v, p, ComponentKind.TOOL) for p, v in s.items("tools")),
            permission_policy=one("permission_policy", ComponentKind.PERMISSION_POLICY),
            completion_policy=one("completion_policy", ComponentKind.COMPLETION_POLICY),
        )


_SLOTS: Final = (
    "system_prompt",
    "model_policy",
    "skills",
    "tools",
    "permission_policy",
    "completion_policy",
)


def _entry(e: object, path: str, kind: ComponentKind) -> dict[str, Any]:
    if not isinstance(e, ResolvedEntry):
        raise CanonicalError(path, f"must be a ResolvedEntry, not {type_name(e)}")
    if e.kind != kind:
        raise CanonicalError(f"{path}.kind", f"must be {kind.value}, not {e.kind!r}")
    out: dict[str, Any] = {}
    if kind is ComponentKind.PROMPT and e.name == "" and e.version is None:
        # An inline system prompt: an anonymous PROMPT, known by its digest alone. Any other
        # entry names a published version, so a missing name or version is an error rather
        # than a second spelling of the same closure.
        pass
    elif kind is ComponentKind.PROMPT and e.name == "":
        raise CanonicalError(
            f"{path}.name",
            "is empty: only an inline system prompt has an empty name, and it has no version "
            "(None)",
        )
    elif e.version is None:
        raise CanonicalError(
            f"{path}.version",
            "is required (only an inline system prompt, with an empty name, has none)",
        )
    else:
        out["name"] = _check_name(e.name, f"{path}.name")
        out["version"] = _check_version(e.version, f"{path}.version")
    if not isinstance(e.digest, str) or not is_digest(e.digest):
        raise CanonicalError(f"{path}.digest", f"{e.digest!r} is not a sha256 digest")
    out["digest"] = str.__str__(e.digest)
    if kind is ComponentKind.TOOL:
        if not isinstance(e.schema_digest, str) or not is_digest(e.schema_digest):
            raise CanonicalError(
                f"{path}.schema_digest", f"{e.schema_digest!r} is not a sha256 digest"
            )
        out["schema_digest"] = str.__str__(e.schema_digest)
    elif e.schema_digest is not None:
        raise CanonicalError(f"{path}.schema_digest", "only a TOOL entry has a schema digest")
    return out


def _entry_set(
    entries: Sequence[ResolvedEntry], path: str, kind: ComponentKind
) -> list[dict[str, Any]]:
    out = [_entry(e, f"{path}[{i}]", kind) for i, e in enumerate(entries)]
    paths = [f"{path}[{i}]" for i in range(len(out))]
    return keyed_set(out, paths, "name", kind.value.lower() + " name")


def agent_document(
    agent_id: str, version_label: str, description: str, closure: AgentClosure
) -> dict[str, Any]:
    """Return the normalised document whose digest is an agent version's digest.

    The shape is ``{"type": "agentrt.agent.v1", "agent_id", "version_label", "description",
    "system_prompt", "model_policy", "skills", "tools", "permission_policy"?,
    "completion_policy"?}`` where each component is an entry ``{"name", "version", "digest"}``
    (tools add ``"schema_digest"``; an inline system prompt is ``{"digest"}`` alone). This is
    a Merkle tree: the agent digest covers the component digests, which cover the content.

    In the digest: the ``agent_id`` and the ``version_label``, so that a digest names exactly
    one ``agent_id@version_label`` (and a label one digest, forever). Not in it: what the
    definition *requested* (``^2.1``; only what it resolved to counts) and server metadata
    (publish time, publisher, provenance, tags).

    Args:
        agent_id: The agent's name.
        version_label: The agent version label such as ``agent_v7`` (tag grammar).
        description: Free text (kept byte-exact; may be empty).
        closure: What every reference resolved to.

    Returns:
        The normalised document, ready for :func:`digest_document`.

    Raises:
        CanonicalError: An invalid id, label, description or entry (kind, name, version,
            digest), or a skill or tool listed twice; ``field`` says where.
    """
    agent_id = _check_name(agent_id, "agent_id")
    label = _check_string(version_label, "version_label")
    if not is_valid_label(label):
        raise CanonicalError(
            "version_label",
            f"{label!r} is not a valid version label (1-128 of A-Z a-z 0-9 . _ -, not "
            "starting with '.' or '-', not 64 hex digits)",
        )
    description = _check_description(description, "description")
    if not isinstance(closure, AgentClosure):
        raise CanonicalError("closure", f"must be an AgentClosure, not {type_name(closure)}")
    doc: dict[str, Any] = {
        "type": AGENT_DOCUMENT_TYPE,
        "agent_id": agent_id,
        "version_label": label,
        "description": description,
        "system_prompt": _entry(closure.system_prompt, "system_prompt", ComponentKind.PROMPT),
        "model_policy": _entry(closure.model_policy, "model_policy", ComponentKind.MODEL_POLICY),
        "skills": _entry_set(closure.skills, "skills", ComponentKind.SKILL),
        "tools": _entry_set(closure.tools, "tools", ComponentKind.TOOL),
    }
    if closure.permission_policy is not None:
        doc["permission_policy"] = _entry(
            closure.permission_policy, "permission_policy", ComponentKind.PERMISSION_POLICY
        )
    if closure.completion_policy is not None:
        doc["completion_policy"] = _entry(
            closure.completion_policy, "completion_policy", ComponentKind.COMPLETION_POLICY
        )
    return doc


def agent_digest(agent_id: str, version_label: str, description: str, closure: AgentClosure) -> str:
    """Return an agent version's digest (see :func:`agent_document`)."""
    return digest_document(agent_document(agent_id, version_label, description, closure))
