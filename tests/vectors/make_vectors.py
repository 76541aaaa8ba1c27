"""Regenerate the digest test vectors in this directory.

Run from the repository root::

    PYTHONPATH=. .venv/bin/python tests/vectors/make_vectors.py

Each vector is ``{"description", "kind", "input", "canonical", "digest"}`` where ``input`` holds
the arguments of the document function (written *un-normalised* on purpose: members out of
order, sets shuffled, defaults present) and ``canonical`` is the exact JCS text. The vectors are
the contract for other implementations, so a change here is a change of the digest rules:
review the diff of the JSON files, not just this script. ``tests/unit/test_vectors.py`` checks
every file independently (``hashlib`` on the ``canonical`` text, the ``rfc8785`` library on it).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from agentrt_core.canonical import AgentClosure, agent_document, component_document
from agentrt_core.jcs import canonical_bytes, digest_bytes, schema_digest

HERE = Path(__file__).parent

READ_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["path"],
    "properties": {
        "path": {"type": "string", "description": "Path relative to the workspace root."},
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576, "default": 65536},
    },
    "additionalProperties": False,
}

COMPONENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "prompt": (
        "A PROMPT: kind, name, version, description and spec are all in the document; an "
        'empty description stays as "" (always present); the text is hashed byte-exact '
        "(quotes, tabs and newlines escaped by JCS).",
        {
            "kind": "PROMPT",
            "name": "repo-assistant",
            "version": "1.0.0",
            "description": "",
            "spec": {"text": 'You are a careful engineer.\n\tQuote: "measure twice".\n'},
        },
    ),
    "skill_set_ordering": (
        "A SKILL: files are a set, sorted by path in UTF-16 code-unit order (U+1F600, stored "
        "as the surrogate pair D83D DE00, sorts before U+FB33); a default member "
        '(content "") is omitted.',
        {
            "kind": "SKILL",
            "name": "repo-debug",
            "version": "2.1.0",
            "description": "Reproduce, bisect, fix.",
            "spec": {
                "instructions": "Reproduce first, then bisect.",
                "files": [
                    {"path": "scripts/run.sh", "content": "#!/bin/sh\nexec make test\n"},
                    {"path": "\ufb33.md", "content": "dalet with dagesh"},
                    {"path": "README.md", "content": "# repo-debug\n"},
                    {"path": "\U0001f600.md", "content": ""},
                ],
                "description": "Debug a failing test in a repository.",
            },
        },
    ),
    "tool": (
        "A TOOL: input_schema and output_schema are free-form JSON, kept verbatim (keys "
        "sorted); side_effects false would be omitted, true is kept.",
        {
            "kind": "TOOL",
            "name": "read_file",
            "version": "1",
            "description": "Reads workspace files.",
            "spec": {
                "side_effects": False,
                "input_schema": READ_FILE_SCHEMA,
                "output_schema": {"type": "string"},
                "description": "Read a UTF-8 text file from the workspace.",
            },
        },
    ),
    "tool_defaults": (
        "Absent equals default in spec structures (empty description, side_effects false "
        "omitted), but free-form JSON keeps its empty values: output_schema {} stays.",
        {
            "kind": "TOOL",
            "name": "noop",
            "version": "0.1.0-rc.1+build.5",
            "description": "",
            "spec": {
                "description": "",
                "side_effects": False,
                "input_schema": {"type": "object", "properties": {}, "required": []},
                "output_schema": {},
            },
        },
    ),
    "model_policy": (
        "A MODEL_POLICY: candidate order is kept (first = primary); fallback_on is a set "
        "(sorted, deduplicated); parameters are free-form JSON; 8192.0 is the number 8192.",
        {
            "kind": "MODEL_POLICY",
            "name": "coding-balanced",
            "version": "3",
            "description": "Sonnet first; GPT-4.1 when rate limited.",
            "spec": {
                "candidates": [
                    {
                        "name": "primary",
                        "provider": "anthropic",
                        "model_id": "claude-sonnet-4-5",
                        "parameters": {"temperature": 0.2, "max_tokens": 4096},
                        "max_context_tokens": 200000,
                        "fallback_on": ["RATE_LIMITED", "PROVIDER_ERROR", "RATE_LIMITED"],
                    },
                    {
                        "name": "fallback",
                        "provider": "openai",
                        "model_id": "gpt-4.1",
                        "parameters": {"temperature": 0.2},
                        "max_context_tokens": 8192.0,
                    },
                ]
            },
        },
    ),
    "permission_policy": (
        "A PERMISSION_POLICY: rules are a set keyed by tool, sorted by tool name.",
        {
            "kind": "PERMISSION_POLICY",
            "name": "workspace-safe",
            "version": "4",
            "description": "Writes need approval; deletes are denied.",
            "spec": {
                "rules": [
                    {"tool": "write_file", "decision": "REQUIRE_APPROVAL"},
                    {"tool": "read_file", "decision": "ALLOW"},
                    {"tool": "delete_file", "decision": "DENY"},
                ],
                "default_decision": "REQUIRE_APPROVAL",
            },
        },
    ),
    "completion_policy": (
        "A COMPLETION_POLICY: checks are a set keyed by name, sorted by name.",
        {
            "kind": "COMPLETION_POLICY",
            "name": "test-and-diff",
            "version": "3",
            "description": "Tests pass and a diff exists.",
            "spec": {
                "checks": [
                    {"name": "tests-pass", "description": "The test suite passes."},
                    {"name": "diff-reviewed", "description": "A diff artifact exists."},
                ]
            },
        },
    ),
    "completion_policy_conditions": (
        "A COMPLETION_POLICY with checks the runtime evaluates from the ledger: condition is "
        "an enum name (ARTIFACT_EXISTS, TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS, NO_OPEN_STEPS), "
        "written only when set, with its artifact_kind or tool; a worker-attested check has "
        "no condition member (UNSPECIFIED and empty strings are omitted), exactly as before "
        "conditions existed.",
        {
            "kind": "COMPLETION_POLICY",
            "name": "ledger-checks",
            "version": "1",
            "description": "What the runtime can see for itself.",
            "spec": {
                "checks": [
                    {
                        "tool": "run_tests",
                        "name": "tests-after-changes",
                        "condition": "TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS",
                        "artifact_kind": "",
                    },
                    {"name": "nothing-open", "condition": "NO_OPEN_STEPS", "tool": ""},
                    {
                        "name": "diff-produced",
                        "description": "A diff artifact exists.",
                        "condition": "ARTIFACT_EXISTS",
                        "artifact_kind": "diff",
                    },
                    {"name": "reviewed", "condition": "UNSPECIFIED", "description": "Read."},
                ]
            },
        },
    ),
    "numbers": (
        "Numbers are IEEE-754 doubles written as ECMAScript Number.toString (RFC 8785 "
        "§3.2.2.3): 1.0 is 1, -0.0 is 0, 1e21 is 1e+21, 1e20 is written out, 1e-7 is 1e-7, "
        "0.000001 is written out, 2**53-1 is the largest integer accepted.",
        {
            "kind": "TOOL",
            "name": "numbers",
            "version": "1",
            "description": "",
            "spec": {
                "input_schema": {
                    "one": 1,
                    "one_point_zero": 1.0,
                    "minus_zero": -0.0,
                    "e21": 1e21,
                    "e20": 1e20,
                    "e_minus_7": 1e-7,
                    "micro": 0.000001,
                    "tenth": 0.1,
                    "third": 1 / 3,
                    "max_safe": 2**53 - 1,
                    "min_safe": -(2**53 - 1),
                    "two_pow_60": float(2**60),
                    "tiny": 5e-324,
                    "huge": 1.7976931348623157e308,
                    "list": [1.5, -2.25, 333333333.3333333, 4.0],
                }
            },
        },
    ),
    "struct_numbers": (
        "Numbers as a protobuf Struct carries them (every one a double), read by the number "
        "rule (agentrt_core.proto_json.json_number; docs/digest.md §2.5): a finite whole double "
        "with |x| <= 2**53-1 becomes an integer (42.0 is 42, -0.0 is 0), any other double stays "
        "a double: 2**53 and 2**53+2 are written out as JCS writes those doubles, 1e300 is "
        "1e+300. Read as integers, 2**53 and 2**53+2 would be refused (integers beyond "
        "2**53-1), so the rule's bound is the digests' bound.",
        {
            "kind": "TOOL",
            "name": "struct_numbers",
            "version": "1",
            "description": "",
            "spec": {
                "input_schema": {
                    "whole": 42.0,
                    "minus_zero": -0.0,
                    "half": 0.5,
                    "max_safe": float(2**53 - 1),
                    "two_pow_53": float(2**53),
                    "two_pow_53_plus_2": float(2**53 + 2),
                    "e300": 1e300,
                }
            },
        },
    ),
    "unicode": (
        "Strings are not Unicode-normalised (e + U+0301 stays distinct from U+00E9), non-BMP "
        "characters are written as UTF-8, controls are escaped, and object keys sort by "
        "UTF-16 code units (the RFC 8785 §3.2.3 example keys). The component description is "
        "byte-exact text too (e + U+0301, U+1F600).",
        {
            "kind": "TOOL",
            "name": "unicode",
            "version": "1.0.0",
            "description": "cafe\u0301 \U0001f600",
            "spec": {
                "description": "caf\u00e9 / cafe\u0301 \U0001d11e \U0001f600 \u2028 \x7f \x1f",
                "input_schema": {
                    "\u20ac": "Euro Sign",
                    "\r": "Carriage Return",
                    "\ufb33": "Hebrew Letter Dalet With Dagesh",
                    "1": "One",
                    "\U0001f600": "Emoji: Grinning Face",
                    "\u0080": "Control",
                    "\u00f6": "Latin Small Letter O With Diaeresis",
                },
            },
        },
    ),
    "prompt_inline": (
        "An inline system prompt is stored as an anonymous PROMPT: empty name and version, "
        "so the document has no name and no version member.",
        {
            "kind": "PROMPT",
            "name": "",
            "version": "",
            "description": "",
            "spec": {"text": "You are coding_agent. Keep changes small."},
        },
    ),
}


def _write(name: str, vector: dict[str, Any]) -> None:
    text = json.dumps(vector, ensure_ascii=False, indent=2) + "\n"
    (HERE / f"{name}.json").write_text(text, encoding="utf-8")


def _vector(description: str, kind: str, inputs: dict[str, Any], doc: Any) -> dict[str, Any]:
    canonical = canonical_bytes(doc)
    return {
        "description": description,
        "kind": kind,
        "input": inputs,
        "canonical": canonical.decode("utf-8"),
        "digest": digest_bytes(canonical),
    }


def main() -> None:
    """Write every vector file."""
    digests: dict[str, str] = {}
    for name, (description, inputs) in COMPONENTS.items():
        vector = _vector(description, "component", inputs, component_document(**inputs))
        digests[name] = vector["digest"]
        _write(name, vector)

    schema_inputs = {"schema": READ_FILE_SCHEMA}
    _write(
        "schema",
        _vector(
            "A tool's input schema digested alone: JCS of the object as given. It equals the "
            "schema_digest of the read_file tool in the agent vectors.",
            "schema",
            schema_inputs,
            READ_FILE_SCHEMA,
        ),
    )
    read_file_schema = schema_digest(READ_FILE_SCHEMA)

    def entry(key: str, **extra: str) -> dict[str, Any]:
        """The closure entry of a component vector: its name, version and digest."""
        component = COMPONENTS[key][1]
        if component["name"] == "":  # an anonymous (inline) prompt: the digest alone
            return {"digest": digests[key]}
        # Members out of order on purpose: the document sorts them.
        return {
            "digest": digests[key],
            **extra,
            "version": component["version"],
            "name": component["name"],
        }

    def tool_entry(key: str) -> dict[str, Any]:
        schema = COMPONENTS[key][1]["spec"]["input_schema"]
        return entry(key, schema_digest=schema_digest(schema))

    agent_inputs: dict[str, Any] = {
        "agent_id": "coding_agent",
        "version_label": "agent_v7",
        "description": "Fixes failing tests.",
        "closure": {
            "system_prompt": entry("prompt"),
            "model_policy": entry("model_policy"),
            "tools": [tool_entry("tool"), tool_entry("tool_defaults")],
            "skills": [entry("skill_set_ordering")],
            "permission_policy": entry("permission_policy"),
            "completion_policy": entry("completion_policy"),
        },
    }
    assert agent_inputs["closure"]["tools"][0]["schema_digest"] == read_file_schema
    _write(
        "agent",
        _vector(
            "An agent: agent_id, version_label, description and the entries of the resolved "
            "components (name, version, digest; tools add schema_digest), skills and tools "
            "sorted by name. The requested references (ranges such as ^2.1) and publish "
            "metadata are not part of it.",
            "agent",
            agent_inputs,
            agent_document(
                agent_inputs["agent_id"],
                agent_inputs["version_label"],
                agent_inputs["description"],
                AgentClosure.from_mapping(agent_inputs["closure"]),
            ),
        ),
    )

    minimal_inputs: dict[str, Any] = {
        "agent_id": "coding_agent",
        "version_label": "1",
        "description": "",
        "closure": {
            "system_prompt": entry("prompt_inline"),
            "model_policy": entry("model_policy"),
        },
    }
    _write(
        "agent_inline_prompt",
        _vector(
            "A minimal agent with an inline system prompt: its entry is the anonymous PROMPT's "
            "digest alone (no name, no version); empty skills and tools stay as [], absent "
            "policies are omitted. The label '1' is a label here, not a component version.",
            "agent",
            minimal_inputs,
            agent_document(
                minimal_inputs["agent_id"],
                minimal_inputs["version_label"],
                minimal_inputs["description"],
                AgentClosure.from_mapping(minimal_inputs["closure"]),
            ),
        ),
    )
    _write("event", event_vector())
    for name, vector in more_event_vectors().items():
        _write(name, vector)


def event_vector() -> dict[str, Any]:
    """A run's first event, made by the runtime's own functions: ``input`` is the ``Event`` in
    the proto3 JSON mapping (what a watcher receives), ``canonical`` the document its hash
    covers and ``digest`` its hash (docs/audit.md, "Recomputing an event's hash")."""
    from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2

    resolve_time = dt.datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=dt.UTC)
    attributes = event_pb2.RunCreatedAttributes(
        agent=message_pb2.AgentBinding(
            requested_ref="coding_agent:prod",
            agent_digest="sha256:" + "ab" * 32,
            agent_id="coding_agent",
            version_label="agent_v7",
            resolved_via_tag="prod",
            reference_kind=enum_pb2.REFERENCE_KIND_TAG,
            tag_event_sequence=4,
        ),
        goal=message_pb2.Goal(objective="make the tests pass", scope=["src/"]),
        max_attempts=3,
        permission_ceiling=enum_pb2.PERMISSION_CEILING_FULL,
        concurrency_policy=enum_pb2.CONCURRENCY_POLICY_REJECT,
        runtime_version="0.1.0",
        creator_principal="alice",
    )
    attributes.agent.resolve_time.FromDatetime(resolve_time)
    return _event_vector(
        "An event as a watcher receives it (the Event message in the proto3 JSON mapping, "
        "proto field names), and the document its hash covers: event_type is the EventType "
        "name without EVENT_TYPE_, lowercased, its first _ a dot (run.created); event_time "
        "has exactly six fractional digits (the wire's .120Z is .120000Z); sequence is a "
        "number (the wire's int64 is a string); the set attributes member is kept as it is; "
        'empty members absent on the wire (prev_hash) are "" in the document.',
        attributes,
        event_id="evt_01EXAMPLE1",
        run_id="run_01EXAMPLE",
        sequence=1,
        when=resolve_time,
        prev_hash="",
    )


#: A previous event's hash, for the vectors of events after a run's first.
_PREV = "sha256:" + "cd" * 32


def more_event_vectors() -> dict[str, dict[str, Any]]:
    """Events of other shapes, each exercising a spelling the first one does not (the
    cross-language tests recompute every ``event*.json``)."""
    from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2

    return {
        "event_thread_message": _event_vector(
            'A thread\'s own event: no run_id on the wire, "" in the document; an event_time '
            "with no fraction on the wire (05Z) is .000000Z in the document; an enum inside "
            "the attributes is its full name.",
            event_pb2.ThreadMessageAppendedAttributes(
                message_id="msg_01EXAMPLE", role=enum_pb2.MESSAGE_ROLE_USER
            ),
            event_id="evt_01EXAMPLE2",
            run_id="",
            sequence=2,
            when=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            prev_hash=_PREV,
        ),
        "event_step_ended": _event_vector(
            "A later event of a run: prev_hash is the previous event's hash; an event_time "
            "with six digits stays as it is; int64 members of the attributes (usage tokens) "
            "stay strings, a double (cost_usd) is a JSON number, a false bool is absent.",
            event_pb2.StepEndedAttributes(
                step_id="stp_01EXAMPLE",
                status=enum_pb2.STEP_STATUS_SUCCEEDED,
                output_ref="sha256:" + "ef" * 32,
                usage=message_pb2.Usage(input_tokens=1200, output_tokens=345, cost_usd=0.0125),
                reported_model_id="claude-sonnet-4-5",
                retryable=False,
            ),
            event_id="evt_01EXAMPLE3",
            run_id="run_01EXAMPLE",
            sequence=7,
            when=dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
            prev_hash=_PREV,
        ),
        "event_status_changed": _event_vector(
            "An event type of several words: only the first _ becomes a dot "
            "(EVENT_TYPE_RUN_STATUS_CHANGED is run.status_changed); text outside ASCII is "
            "hashed as UTF-8, not escaped; an event_time with three digits gets three zeros.",
            event_pb2.RunStatusChangedAttributes(
                previous_status=enum_pb2.RUN_STATUS_RUNNING,
                status=enum_pb2.RUN_STATUS_PAUSED,
                actor="Zo\u00eb \U0001f600",
                reason="paus\u00e9 \u2028 by operator",
                actor_principal="zoe@example.com",
            ),
            event_id="evt_01EXAMPLE4",
            run_id="run_01EXAMPLE",
            sequence=12,
            when=dt.datetime(2026, 1, 2, 3, 4, 5, 7000, tzinfo=dt.UTC),
            prev_hash=_PREV,
        ),
        "event_artifact_created": _event_vector(
            "A map in the attributes (labels) is a JSON object whose keys JCS sorts; an int64 "
            "(size) is a string.",
            event_pb2.ArtifactCreatedAttributes(
                artifact_id="art_01EXAMPLE",
                step_id="stp_01EXAMPLE",
                name="app.py",
                blob_digest="sha256:" + "ef" * 32,
                media_type="text/x-python",
                attempt_id="att_01EXAMPLE",
                size=9007199254740993,
                labels={"kind": "src", "Language": "python", "\u00e9tape": "2"},
            ),
            event_id="evt_01EXAMPLE5",
            run_id="run_01EXAMPLE",
            sequence=9,
            when=dt.datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=dt.UTC),
            prev_hash=_PREV,
        ),
    }


def _event_vector(
    description: str,
    attributes: Any,
    *,
    event_id: str,
    run_id: str,
    sequence: int,
    when: dt.datetime,
    prev_hash: str,
) -> dict[str, Any]:
    """The vector of the event carrying ``attributes``, hashed by the runtime's own
    functions; its ``canonical`` document is spelled out here, apart from the runtime's."""
    from google.protobuf import json_format

    from agentrt.runtime.v1 import event_pb2
    from agentrt_core import event_chain

    event = event_pb2.Event(
        id=event_id,
        run_id=run_id,
        thread_id="thr_01EXAMPLE",
        sequence=sequence,
        event_type=_EVENT_TYPES[attributes.DESCRIPTOR.name],
        prev_hash=prev_hash,
    )
    member = event_pb2.Event.DESCRIPTOR.oneofs_by_name["attributes"]
    (field,) = [f for f in member.fields if f.message_type.name == attributes.DESCRIPTOR.name]
    getattr(event, field.name).CopyFrom(attributes)
    event.event_time.FromDatetime(when)
    attributes_json = json_format.MessageToDict(attributes, preserving_proto_field_name=True)
    members: dict[str, Any] = {
        "event_id": event.id,
        "thread_id": event.thread_id,
        "run_id": event.run_id,
        "sequence": event.sequence,
        "event_type": event_chain.event_type_name(attributes),
        "event_time": event_chain.format_time(when),
        "prev_hash": event.prev_hash,
    }
    event.hash = event_chain.event_hash(attributes=attributes_json, **members)
    document = {
        "attributes": attributes_json,
        "event_time": members["event_time"],
        "event_type": members["event_type"],
        "id": event.id,
        "prev_hash": event.prev_hash,
        "run_id": event.run_id,
        "sequence": event.sequence,
        "thread_id": event.thread_id,
        "type": "agentrt.event.v1",
    }
    wire = json_format.MessageToDict(event, preserving_proto_field_name=True)
    # A map prints in no fixed order: sorted here, the file comes out the same every time.
    for map_field in attributes.DESCRIPTOR.fields:
        if map_field.message_type is not None and map_field.message_type.GetOptions().map_entry:
            printed = wire[field.name]
            if map_field.name in printed:
                printed[map_field.name] = dict(sorted(printed[map_field.name].items()))
    vector = _vector(description, "event", wire, document)
    assert vector["digest"] == event.hash
    return vector


def _event_types() -> dict[str, Any]:
    """EventType value by attributes message name: RunCreatedAttributes is
    EVENT_TYPE_RUN_CREATED, the member ``run_created_attributes``."""
    from agentrt.runtime.v1 import enum_pb2, event_pb2

    oneof = event_pb2.Event.DESCRIPTOR.oneofs_by_name["attributes"]
    return {
        f.message_type.name: enum_pb2.EventType.Value(
            "EVENT_TYPE_" + f.name.removesuffix("_attributes").upper()
        )
        for f in oneof.fields
    }


_EVENT_TYPES = _event_types()


if __name__ == "__main__":
    main()
