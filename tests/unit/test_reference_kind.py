"""A run's reference kind has one set of names wherever it appears (issue 17, item 11).

The registry records it as ``agentrt_core.model.ReferenceKind`` and serves it as
``agentrt.registry.v1.ReferenceKind``; a run stores that name and serves it as
``agentrt.runtime.v1.ReferenceKind``. The protos do not import each other, so the mapping
goes by name and the names must be the same.
"""

from __future__ import annotations

from agentrt.registry.v1 import enum_pb2 as registry_enum
from agentrt.runtime.v1 import enum_pb2 as runtime_enum
from agentrt_core.model import ReferenceKind

_PREFIX = "REFERENCE_KIND_"


def _names(enum: object) -> set[str]:
    values = enum.DESCRIPTOR.values  # type: ignore[attr-defined]
    return {v.name.removeprefix(_PREFIX) for v in values} - {"UNSPECIFIED"}


def test_every_reference_kind_has_the_same_name_in_the_model_and_both_protos() -> None:
    model = {k.value for k in ReferenceKind}
    assert _names(runtime_enum.ReferenceKind) == model
    assert _names(registry_enum.ReferenceKind) == model
