"""What one entry of the registry log says: its leaf, RFC 8785 canonical JSON.

Pure and shared: the server builds leaves here when it appends, and a verifier (``agentrt
verify``, the audit bundle check) reads them here to see what an entry proves. A leaf names
what changed by digest and who changed it, never the content: the content is proven by its
digest, the digest by the leaf, the leaf by the tree. docs/audit.md lists the fields.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from agentrt_core.event_chain import format_time
from agentrt_core.jcs import canonical_bytes

COMPONENT = "component"
AGENT_VERSION = "agent_version"
TAG = "tag"
ATTESTATION = "attestation"
TYPES = (COMPONENT, AGENT_VERSION, TAG, ATTESTATION)
#: The fields each type's leaf has, besides ``type`` (a leaf with others is not one of ours).
FIELDS = {
    COMPONENT: {"digest", "kind", "name", "version", "principal", "time"},
    AGENT_VERSION: {"digest", "agent_id", "version_label", "principal", "time"},
    TAG: {"event", "agent_id", "tag", "sequence", "from_digest", "to_digest", "principal", "time"},
    ATTESTATION: {"digest", "predicate_type", "envelope_digest", "key_id", "principal", "time"},
}


class LeafError(ValueError):
    """A leaf that is not canonical JSON of one of the types above."""


@dataclass(frozen=True)
class Leaf:
    """A leaf's bytes and what they say."""

    data: bytes
    fields: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.fields["type"])

    @property
    def subject_digest(self) -> str:
        """The component or agent version it published (or an attestation is about); the
        tag's new target for a move (empty for a deletion)."""
        return str(self.fields["digest"] if self.type != TAG else self.fields["to_digest"])


def _leaf(fields: dict[str, Any]) -> Leaf:
    return Leaf(canonical_bytes(fields), fields)


def component_leaf(
    *, digest: str, kind: str, name: str, version: str, principal: str, time: dt.datetime
) -> Leaf:
    """A component version published (an anonymous prompt has an empty name and version)."""
    return _leaf(
        {
            "type": COMPONENT,
            "digest": digest,
            "kind": kind,
            "name": name,
            "version": version,
            "principal": principal,
            "time": format_time(time),
        }
    )


def agent_version_leaf(
    *, digest: str, agent_id: str, version_label: str, principal: str, time: dt.datetime
) -> Leaf:
    return _leaf(
        {
            "type": AGENT_VERSION,
            "digest": digest,
            "agent_id": agent_id,
            "version_label": version_label,
            "principal": principal,
            "time": format_time(time),
        }
    )


def tag_leaf(
    *,
    event: str,
    agent_id: str,
    tag: str,
    sequence: int,
    from_digest: str,
    to_digest: str,
    principal: str,
    time: dt.datetime,
) -> Leaf:
    """A tag moved (``SET``) or deleted (``DELETE``): the agent's tag-history event."""
    return _leaf(
        {
            "type": TAG,
            "event": event,
            "agent_id": agent_id,
            "tag": tag,
            "sequence": sequence,
            "from_digest": from_digest,
            "to_digest": to_digest,
            "principal": principal,
            "time": format_time(time),
        }
    )


def attestation_leaf(
    *,
    digest: str,
    predicate_type: str,
    envelope_digest: str,
    key_id: str,
    principal: str,
    time: dt.datetime,
) -> Leaf:
    """An attestation attached to agent version ``digest`` (``envelope_digest``: SHA-256 of
    the envelope as kept)."""
    return _leaf(
        {
            "type": ATTESTATION,
            "digest": digest,
            "predicate_type": predicate_type,
            "envelope_digest": envelope_digest,
            "key_id": key_id,
            "principal": principal,
            "time": format_time(time),
        }
    )


def parse_leaf(data: bytes) -> Leaf:
    """What a leaf says; :class:`LeafError` unless it is a canonical leaf of a known type."""
    try:
        fields = json.loads(data)
    except ValueError:
        raise LeafError("the leaf is not JSON") from None
    if not isinstance(fields, dict) or fields.get("type") not in TYPES:
        raise LeafError("the leaf is not an object with a known type")
    if set(fields) - {"type"} != FIELDS[fields["type"]]:
        raise LeafError(f"a {fields['type']} leaf has the fields {sorted(FIELDS[fields['type']])}")
    try:
        canonical = canonical_bytes(fields)
    except ValueError:
        raise LeafError("the leaf is not canonical JSON") from None
    if canonical != data:
        raise LeafError("the leaf is not in its RFC 8785 canonical form")
    return Leaf(data, fields)
