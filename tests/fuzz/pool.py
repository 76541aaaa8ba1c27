"""Values that reach deep code: ids, digests, fences and page tokens the server itself handed
out, harvested from every successful response.

A fuzzer that invents ids only ever meets NOT_FOUND. Requests built from this pool name a real
run, a real step, the fence of a live attempt, so they get past the lookups into the domain
code. The pool is keyed by request field name: ``Run.id`` is filed as ``run_id``, any other
string field under its own name (``thread_id``, ``digest``, ``agent_id``...).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agentrt.runtime.v1 import message_pb2 as runtime_messages
from tests.fuzz.rpcs import message_type

#: Request fields that name something filed under another key.
ALIASES = {
    "input_ref": "digest",
    "output_ref": "digest",
    "state_ref": "digest",
    "blob_digest": "digest",
    "expected_digest": "digest",
    "agent_digest": "digest",
    "tool_schema_digest": "schema_digest",
    "after_cursor": "cursor",
}

#: Values no response carries but that a valid request needs (the witness's agent and tools).
SEEDS = {
    "agent_ref": ["coding_agent:prod", "coding_agent@agent_v7", "coding_agent"],
    "component_ref": ["read_file@1", "apply_patch@2", "coding-balanced@3"],
    "tool": ["read_file", "apply_patch", "run_tests"],
    "check": ["tests-pass", "diff-reviewed"],
    "worker_id": ["w1", "fuzz-worker"],
    "tag": ["prod", "canary"],
    "agent_id": ["coding_agent"],
    "model_id": ["claude-sonnet-4", "gpt-4.1"],
    "name": ["read_file", "repo-debug", "artifact.txt"],
    "media_type": ["text/plain", "application/json"],
}

_KEEP = 8  # the first values of a key (the witness's) are never evicted
_CAP = 48


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Pool:
    def __init__(self) -> None:
        self.values: dict[str, list[str]] = {k: list(v) for k, v in SEEDS.items()}
        self.fences: list[runtime_messages.Fence] = []
        self.fingerprints: list[str] = []
        self._evict = 0

    def add(self, key: str, value: str) -> None:
        found = self.values.setdefault(key, [])
        if value in found:
            return
        if len(found) < _CAP:
            found.append(value)
        else:
            self._evict += 1
            found[_KEEP + self._evict % (_CAP - _KEEP)] = value

    def candidates(self, field_name: str) -> list[str]:
        """Values for a request field: filed under its name, its alias, or its name with the
        leading words dropped (``parent_run_id`` -> ``run_id``, ``retry_of_step_id`` ->
        ``step_id``)."""
        name = ALIASES.get(field_name, field_name)
        parts = name.split("_")
        for start in range(len(parts)):
            found = self.values.get("_".join(parts[start:]))
            if found:
                return found
        return []

    def harvest(self, message: Message) -> None:
        """File every id, digest, fence and page token in a response."""
        if message.DESCRIPTOR.full_name == runtime_messages.Fence.DESCRIPTOR.full_name:
            fence = runtime_messages.Fence()
            fence.MergeFromString(message.SerializeToString())
            if fence.attempt_id and all(f != fence for f in self.fences):
                self.fences.append(fence)
                del self.fences[_CAP:]
        for field, value in message.ListFields():
            self._harvest_field(message, field, value)

    def _harvest_field(self, message: Message, field: FieldDescriptor, value: Any) -> None:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if message_type(field).GetOptions().map_entry:
                return
            items = value if field.is_repeated else [value]
            for item in items:
                self.harvest(item)
            return
        if field.type != FieldDescriptor.TYPE_STRING or field.is_repeated:
            return
        if not value or len(value) > 200:
            return
        if field.name == "id":
            self.add(f"{_snake(message.DESCRIPTOR.name)}_id", value)
        elif field.name == "next_page_token":
            self.add("page_token", value)
            fingerprint = token_fingerprint(value)
            if fingerprint and fingerprint not in self.fingerprints:
                self.fingerprints.append(fingerprint)
        else:
            self.add(field.name, value)


def encode_token(data: Any) -> str:
    """A page token as agentrt_core.paging writes them: unpadded base64url of JSON."""
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def token_fingerprint(token: str) -> str | None:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError:
        return None
    if isinstance(decoded, dict) and isinstance(decoded.get("f"), str):
        return str(decoded["f"])
    return None
