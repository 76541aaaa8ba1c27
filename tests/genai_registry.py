"""Telemetry checked against the OpenTelemetry GenAI semantic conventions, as vendored.

The conventions are read from ``third_party/otel-semconv-genai/`` (its README says which
upstream files and commits; the upstream repository has no tagged release, so the pin is a
commit, ``REGISTRY_RELEASE``). Every check returns a list of human-readable problems, each
naming the attribute or metric, empty when all is well, so a test can ``assert not problems``
and show them all at once.

What is checked, and what deliberately is not:

- Only ``gen_ai.*`` attribute keys are looked up in the registry (``server.port``,
  ``error.type``... belong to the core conventions, which are not vendored). A ``gen_ai.*``
  key is a problem when the registry does not define it, when it is deprecated (the core
  repository's deprecated ``gen_ai`` attributes are vendored for that), or when the Python
  value does not have the declared type.
- Types are strict, as the OTLP wire is: ``int`` must be an ``int`` and not a ``bool``;
  ``double`` must be a ``float`` (an ``int`` would be sent as an OTLP ``int_value``, not a
  ``double_value``, so ``1`` for a double is reported); ``string[]`` etc. a list or tuple of
  that type; ``any`` accepts every value.
- Enum-typed attributes (``type: {members: ...}``) list *well-known* values, and the
  conventions allow others (for instance ``gen_ai.operation.name``: a system-specific name may
  be used when none applies), so a value outside the members is **not** a problem by default.
  Pass ``closed_enums=True`` to report it, when a test knows the value must be a member.
- Metrics: the name must be defined, with that instrument and unit; every attribute must be one
  the metric declares (metric attributes are dimensions: an extra one is a cardinality
  decision upstream did not make), every ``required`` one must be present, and the values pass
  ``attribute_problems``. Conditionally required attributes are not checked: their conditions
  are prose.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

VENDORED = Path(__file__).resolve().parents[1] / "third_party" / "otel-semconv-genai"
REGISTRY_RELEASE = "untagged@004902b8cb70"
"""The pinned upstream version: no release or tag exists, so the commit of the metrics and
spans files (the registry's own commit is in the README)."""

_GENAI_MODEL = VENDORED / "model" / "gen-ai"
_CORE_DEPRECATED = (
    VENDORED / "core" / "model" / "gen-ai" / "deprecated" / "registry-deprecated.yaml"
)

INSTRUMENTS = ("counter", "updowncounter", "gauge", "histogram")
"""The instrument names the conventions (and ``metric_problems``) use."""


@dataclass(frozen=True)
class AttributeDef:
    """One attribute of the registry.

    ``type`` is the declared type (``string``, ``int``, ``double``, ``boolean``, their ``[]``
    arrays, or ``any``); for an enum it is the members' value type and ``members`` holds the
    well-known values. ``deprecated`` is empty, or says what to use instead."""

    name: str
    type: str
    members: tuple[str | int, ...] = ()
    deprecated: str = ""
    brief: str = ""


@dataclass(frozen=True)
class MetricDef:
    """One metric: its instrument and unit, and its attributes with their requirement level
    (``required``, ``conditionally_required``, ``recommended`` or ``opt_in``)."""

    name: str
    instrument: str
    unit: str
    attributes: Mapping[str, str]


def _load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return document


def _deprecation_text(deprecated: object) -> str:
    if isinstance(deprecated, str):
        return deprecated or "deprecated"
    if isinstance(deprecated, dict):
        if deprecated.get("renamed_to"):
            return f"renamed to {deprecated['renamed_to']}"
        return str(deprecated.get("note") or deprecated.get("reason") or "deprecated")
    return "deprecated"


def _definition(name: str, entry: Mapping[str, Any]) -> AttributeDef:
    declared = entry.get("type")
    members: tuple[str | int, ...] = ()
    if isinstance(declared, dict):
        members = tuple(member["value"] for member in declared.get("members", ()))
        kind = "int" if members and all(type(m) is int for m in members) else "string"
    else:
        kind = str(declared)
    return AttributeDef(
        name=name,
        type=kind,
        members=members,
        deprecated=_deprecation_text(entry["deprecated"]) if "deprecated" in entry else "",
        brief=" ".join(str(entry.get("brief", "")).split()),
    )


@functools.cache
def _attributes() -> dict[str, AttributeDef]:
    found: dict[str, AttributeDef] = {}
    # The core repository's deprecated gen_ai attributes first, so that the GenAI registry's
    # definition wins should a name be in both.
    for group in _load(_CORE_DEPRECATED).get("groups", ()):
        for entry in group.get("attributes", ()):
            if "id" in entry:
                found[entry["id"]] = _definition(entry["id"], entry)
    for entry in _load(_GENAI_MODEL / "registry.yaml")["attributes"]:
        found[entry["key"]] = _definition(entry["key"], entry)
    return found


def _level(requirement: object) -> str:
    """``required`` or ``{conditionally_required: "..."}`` -> the level's name."""
    if isinstance(requirement, dict):
        (name,) = requirement
        return str(name)
    return str(requirement)


@functools.cache
def _groups() -> dict[str, list[dict[str, Any]]]:
    """Attribute groups by id: the metrics' own and those of spans.yaml they refer to."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for file in ("spans.yaml", "metrics.yaml"):
        for group in _load(_GENAI_MODEL / file).get("attribute_groups", ()):
            groups[group["id"]] = list(group.get("attributes", ()))
    return groups


def _resolve(items: Iterable[Mapping[str, Any]], into: dict[str, str]) -> dict[str, str]:
    """Attribute references in order, groups expanded: a later reference to the same attribute
    overrides its requirement level, and one without a level keeps the earlier level (the
    YAML re-references attributes only to mark them sampling-relevant)."""
    for item in items:
        if "ref_group" in item:
            _resolve(_groups()[item["ref_group"]], into)
        elif "requirement_level" in item:
            into[item["ref"]] = _level(item["requirement_level"])
        else:
            into.setdefault(item["ref"], "recommended")
    return into


@functools.cache
def _metrics() -> dict[str, MetricDef]:
    found: dict[str, MetricDef] = {}
    for entry in _load(_GENAI_MODEL / "metrics.yaml")["metrics"]:
        found[entry["name"]] = MetricDef(
            name=entry["name"],
            instrument=entry["instrument"],
            unit=entry["unit"],
            attributes=_resolve(entry.get("attributes", ()), {}),
        )
    return found


@functools.cache
def _spans() -> dict[str, tuple[str, dict[str, str]]]:
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for entry in _load(_GENAI_MODEL / "spans.yaml")["spans"]:
        found[entry["type"]] = (entry["kind"], _resolve(entry.get("attributes", ()), {}))
    return found


def defined_attribute(name: str) -> AttributeDef | None:
    """The registry's definition of ``name`` (deprecated ones included), or None."""
    return _attributes().get(name)


def attribute_names() -> list[str]:
    """Every attribute the vendored registry defines and does not deprecate."""
    return sorted(name for name, found in _attributes().items() if not found.deprecated)


def metric_definition(name: str) -> MetricDef | None:
    """The metric called ``name``, or None."""
    return _metrics().get(name)


def metric_names() -> list[str]:
    return sorted(_metrics())


def span_definition(span_type: str) -> tuple[str, Mapping[str, str]] | None:
    """A span type's kind (``client``, ``internal``) and its attributes with their requirement
    levels, e.g. ``span_definition("gen_ai.execute_tool.internal")``; None if undefined."""
    return _spans().get(span_type)


def span_types() -> list[str]:
    return sorted(_spans())


def _type_matches(declared: str, value: object) -> bool:
    if declared == "any":
        return True
    if declared.endswith("[]"):
        element = declared.removesuffix("[]")
        return isinstance(value, list | tuple) and all(_type_matches(element, v) for v in value)
    if declared == "string":
        return isinstance(value, str)
    if declared == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if declared == "double":
        return isinstance(value, float)
    if declared == "boolean":
        return isinstance(value, bool)
    raise ValueError(f"the registry declares a type this checker does not know: {declared!r}")


def attribute_problems(
    attributes: Mapping[str, object], *, closed_enums: bool = False
) -> list[str]:
    """What is wrong with the ``gen_ai.*`` attributes among ``attributes`` (others are not
    looked at): undefined, deprecated, or of the wrong type; with ``closed_enums``, an enum's
    value that is not one of its well-known members."""
    problems: list[str] = []
    for name, value in sorted(attributes.items()):
        if not name.startswith("gen_ai."):
            continue
        found = defined_attribute(name)
        if found is None:
            problems.append(
                f"{name}: not defined by the GenAI semantic conventions ({REGISTRY_RELEASE})"
            )
            continue
        if found.deprecated:
            problems.append(f"{name}: deprecated ({found.deprecated})")
        if not _type_matches(found.type, value):
            problems.append(f"{name}: declared {found.type}, got {type(value).__name__} {value!r}")
        elif closed_enums and found.members and value not in found.members:
            known = ", ".join(map(str, found.members))
            problems.append(f"{name}: {value!r} is not a well-known value ({known})")
    return problems


def metric_problems(
    name: str,
    instrument: str,
    unit: str,
    attributes: Mapping[str, object],
    *,
    closed_enums: bool = False,
) -> list[str]:
    """What is wrong with a metric as exported: ``instrument`` is one of ``INSTRUMENTS``
    (``tests.otlp_receiver.MetricPoint.instrument`` gives it for a received point) and
    ``attributes`` one data point's."""
    found = metric_definition(name)
    if found is None:
        return [
            f"metric {name}: not defined by the GenAI semantic conventions ({REGISTRY_RELEASE})"
        ]
    problems: list[str] = []
    if instrument != found.instrument:
        problems.append(f"metric {name}: instrument {instrument}, defined as {found.instrument}")
    if unit != found.unit:
        problems.append(f"metric {name}: unit {unit!r}, defined as {found.unit!r}")
    for attribute in sorted(attributes):
        if attribute not in found.attributes:
            problems.append(f"metric {name}: attribute {attribute} is not one of the metric's")
    for attribute, level in sorted(found.attributes.items()):
        if level == "required" and attribute not in attributes:
            problems.append(f"metric {name}: required attribute {attribute} is missing")
    problems.extend(
        f"metric {name}: {problem}"
        for problem in attribute_problems(attributes, closed_enums=closed_enums)
    )
    return problems


def span_problems(
    span_type: str, attributes: Mapping[str, object], *, closed_enums: bool = False
) -> list[str]:
    """What is wrong with a span's attributes for the span type it stands for: a ``required``
    attribute missing, and whatever ``attribute_problems`` finds. Spans may carry attributes
    beyond the type's, so extra ones are not reported."""
    found = span_definition(span_type)
    if found is None:
        return [f"span type {span_type}: not defined by the GenAI semantic conventions"]
    problems = [
        f"span {span_type}: required attribute {attribute} is missing"
        for attribute, level in sorted(found[1].items())
        if level == "required" and attribute not in attributes
    ]
    problems.extend(
        f"span {span_type}: {problem}"
        for problem in attribute_problems(attributes, closed_enums=closed_enums)
    )
    return problems
