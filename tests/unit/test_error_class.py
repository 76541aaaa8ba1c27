"""The two ErrorClass enums name the same classes, and a model policy names only those.

A model policy (registry) names the error classes that trigger a fallback; a worker
(runtime) reports the class a step or an attempt failed with. The packages do not import
each other, and numbers already on the wire keep their meaning, so the enums are a pair
with the same names and different numbers: every conversion goes by name.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrt.registry.v1 import enum_pb2 as registry_enum
from agentrt.runtime.v1 import enum_pb2 as runtime_enum
from agentrt_core import publishing
from agentrt_core.errors import InvalidArgument
from agentrt_core.model import ComponentDraft, ComponentKind

_PREFIX = "ERROR_CLASS_"
_VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def _names(enum: object) -> set[str]:
    values = enum.DESCRIPTOR.values  # type: ignore[attr-defined]
    return {v.name.removeprefix(_PREFIX) for v in values} - {"UNSPECIFIED"}


def test_the_runtime_and_registry_enums_have_the_same_names() -> None:
    runtime, registry = _names(runtime_enum.ErrorClass), _names(registry_enum.ErrorClass)
    assert runtime - registry == set(), "only in agentrt.runtime.v1.ErrorClass"
    assert registry - runtime == set(), "only in agentrt.registry.v1.ErrorClass"


def test_every_class_a_model_policy_may_name_is_one_a_worker_can_report() -> None:
    accepted = []
    for name in sorted(_names(registry_enum.ErrorClass)):
        candidate = {"name": "a", "provider": "p", "model_id": "x", "fallback_on": [name]}
        draft = ComponentDraft(
            ComponentKind.MODEL_POLICY, "m", "1", "", {"candidates": [candidate]}
        )
        try:
            publishing.digest_component(draft)
        except InvalidArgument:  # not an error a model call can end with: never a trigger
            continue
        accepted.append(name)
        assert runtime_enum.ErrorClass.Value(_PREFIX + name) > 0
    assert {"RATE_LIMITED", "CONTENT_FILTERED"} <= set(accepted)


def test_the_vectors_name_only_error_classes_and_are_publishable() -> None:
    names = _names(runtime_enum.ErrorClass)
    for path in sorted(_VECTORS.glob("*.json")):
        vector = json.loads(path.read_text(encoding="utf-8"))
        if vector["kind"] != "component" or vector["input"]["kind"] != "MODEL_POLICY":
            continue
        for candidate in vector["input"]["spec"]["candidates"]:
            assert set(candidate.get("fallback_on", [])) <= names, path.name
        args = vector["input"]
        publishing.digest_component(
            ComponentDraft(
                ComponentKind(args["kind"]),
                args["name"],
                args["version"],
                args["description"],
                args["spec"],
            )
        )
