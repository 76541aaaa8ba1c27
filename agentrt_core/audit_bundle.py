"""Audit bundles, pure: no database, no server, no gRPC.

The server uses :func:`build_document` / :func:`encode` for ``ExportBundle``; ``agentrt audit
verify BUNDLE`` uses :func:`decode` and :func:`verify_bundle` on a file alone. The event chain
is checked by :func:`agentrt_core.audit_chain.verify_chain`, the function ``VerifyRun``
uses, and the digests are recomputed with the registry's own canonical form
(:mod:`agentrt_core.canonical`) and the event hash of :mod:`runtime_service.events`, so
"verifies offline" means "recomputes exactly what the server computed when it wrote the data".
``docs/audit.md`` describes the format.

:class:`~agentrt_core.audit_chain.Link` is part of this module's API: a bundle's events are
links (:func:`build_document` takes them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrt_core import audit_rows, canonical
from agentrt_core.audit_chain import Link, verify_chain
from agentrt_core.canonical import CanonicalError
from agentrt_core.model import ClosureEntry
from agentrt_core.publishing import to_agent_closure

__all__ = [
    "BUNDLE_TYPE",
    "BundleFormatError",
    "BundleReport",
    "Link",
    "build_document",
    "decode",
    "encode",
    "media_type",
    "verify_bundle",
]

BUNDLE_TYPE = "agentrt.audit.bundle.v1"

Format = Literal["json", "jsonl"]

#: Sections of the document that JSONL writes one record per line, in this order, with the
#: record tag each line carries.
_RECORDS: tuple[tuple[str, str], ...] = (
    ("attempts", "attempt"),
    ("steps", "step"),
    ("artifacts", "artifact"),
    ("checkpoints", "checkpoint"),
    ("inputs", "input"),
    ("components", "component"),
    ("events", "event"),
)


#: Sections a bundle written before they existed does not have (then not checked).
_ADDED_LATER = ("inputs",)


class BundleFormatError(ValueError):
    """The bytes are not an audit bundle (truncated, not JSON, a section missing)."""


# -- building and encoding -------------------------------------------------------------------


def build_document(
    *,
    installation_id: str,
    export_time: str,
    run: dict[str, Any],
    thread: dict[str, Any],
    attempts: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    artifacts: list[dict[str, Any]],
    checkpoints: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    events: Sequence[Link],
    chain_head: tuple[int, str],
    agent: dict[str, Any],
    components: list[dict[str, Any]],
    evidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The bundle as one JSON object (see ``docs/audit.md``, "Bundle format").

    Runtime records (run, thread, attempts, steps, artifacts, checkpoints) are in the
    proto3 JSON mapping of their API messages, so any client generated from the protos can
    read them; events, the agent and components are in the form their digests cover.
    """
    return {
        "type": BUNDLE_TYPE,
        "installation_id": installation_id,
        "export_time": export_time,
        "run": run,
        "thread": thread,
        "attempts": attempts,
        "steps": steps,
        "artifacts": artifacts,
        "checkpoints": checkpoints,
        "inputs": inputs,
        "chain_head": {"sequence": chain_head[0], "hash": chain_head[1]},
        "events": [e.to_json() for e in events],
        "agent": agent,
        "components": components,
        # What the server signed (bundle_evidence.py): checked with its key, not by the above.
        **({"evidence": evidence} if evidence is not None else {}),
    }


def media_type(fmt: Format) -> str:
    return "application/jsonl" if fmt == "jsonl" else "application/json"


def encode(document: Mapping[str, Any], fmt: Format = "json") -> bytes:
    """Serialise a bundle document.

    ``json``: one indented document (readable, diffable). ``jsonl``: a header line holding
    everything but the record lists plus their counts, then one ``{"record", "value"}`` line
    per record. The counts are what make a JSONL file cut off exactly at a line end fail
    verification instead of looking complete.
    """
    if fmt == "json":
        return (json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
    header = {k: v for k, v in document.items() if k not in dict(_RECORDS)}
    header["format"] = "jsonl"
    header["counts"] = {section: len(document[section]) for section, _ in _RECORDS}
    lines = [_line(header)]
    for section, tag in _RECORDS:
        lines += [_line({"record": tag, "value": value}) for value in document[section]]
    return "".join(lines).encode()


def _line(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"


def decode(data: bytes) -> dict[str, Any]:
    """Parse a bundle in either format back into the document form.

    Raises:
        BundleFormatError: not UTF-8, not JSON (a truncated file ends mid-document), not a
            bundle, or a JSONL file whose record counts do not add up.
    """
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise BundleFormatError(f"not UTF-8 text (byte {exc.start})") from exc
    first, _, rest = text.partition("\n")
    header = _try_json(first)
    if isinstance(header, dict) and header.get("format") == "jsonl":
        return _decode_jsonl(header, rest)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleFormatError(
            f"not a complete JSON document (truncated?): {exc.msg} at line {exc.lineno} "
            f"column {exc.colno} of {len(data)} bytes"
        ) from exc
    return _check_type(document)


def _try_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _decode_jsonl(header: dict[str, Any], rest: str) -> dict[str, Any]:
    counts = header.pop("counts", None)
    header.pop("format")
    if not isinstance(counts, dict):
        raise BundleFormatError("the JSONL header has no record counts")
    document = _check_type(header)
    tags = {tag: section for section, tag in _RECORDS}
    for section, _ in _RECORDS:
        document[section] = []
    for number, line in enumerate(rest.splitlines(), start=2):
        if not line.strip():
            continue
        record = _try_json(line)
        if not isinstance(record, dict) or record.get("record") not in tags:
            raise BundleFormatError(f"line {number} is not a bundle record (truncated?)")
        document[tags[record["record"]]].append(record.get("value"))
    for section, _ in _RECORDS:
        expected, found = counts.get(section), len(document[section])
        if section in _ADDED_LATER and expected is None and not found:
            del document[section]  # a bundle from before the section existed
            continue
        if expected != found:
            raise BundleFormatError(
                f"the header announces {expected} {section} but the file holds {found} (truncated?)"
            )
    return document


def _check_type(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("type") != BUNDLE_TYPE:
        raise BundleFormatError(f"not an agentrt audit bundle (type is not {BUNDLE_TYPE!r})")
    return document


# -- verification ----------------------------------------------------------------------------


@dataclass
class BundleReport:
    """What :func:`verify_bundle` checked; ``failures`` is empty when everything verified."""

    run_id: str = ""
    agent: str = ""
    agent_digest: str = ""
    component_count: int = 0
    step_count: int = 0
    event_count: int = 0
    head_hash: str = ""
    rows_checked: int = 0
    #: ``kind.field`` of served fields the run's chain does not commit to (audit_rows).
    not_covered: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def verify_bundle(document: Mapping[str, Any]) -> BundleReport:
    """Verify a decoded bundle without a server.

    Checks, in order: every component digest (and tool schema digest) recomputes from the
    component's canonical form; every closure entry names a component of the bundle with the
    same kind, name, version and schema; the agent digest recomputes from the closure and is
    the digest the run is bound to; every step's recorded versions are in the closure; every
    row (run, attempts, steps, checkpoints, artifacts, inputs) is what the chain's events
    committed to (:func:`audit_rows.compare`, as ``VerifyRun`` checks it); the event chain
    recomputes link by link up to the recorded head.

    Raises:
        BundleFormatError: a section is missing or of the wrong shape.
    """
    report = BundleReport()
    fail = report.failures.append
    run = _object(document.get("run"), "run")
    report.run_id = _text(run, "id", "run")
    binding = _object(run.get("agent", {}), "run.agent")
    components = _verify_components(_list(document, "components"), report)
    agent = _object(document.get("agent"), "agent")
    closure = _verify_agent(agent, components, binding, report)
    events = [_link_from_json(e, f"events[{i}]") for i, e in enumerate(_list(document, "events"))]
    steps = _list(document, "steps")
    report.step_count = len(steps)
    for i, raw in enumerate(steps):
        step = _object(raw, f"steps[{i}]")
        for problem in _step_problems(step, report.run_id, closure):
            fail(problem)
    rows: dict[str, Any] = {"run": run}
    for section in ("attempts", "steps", "checkpoints", "artifacts", "inputs"):
        if section in _ADDED_LATER and section not in document:
            continue
        rows[section] = [
            _object(r, f"{section}[{i}]") for i, r in enumerate(_list(document, section))
        ]
    thread_id = _text(run, "thread_id", "run")
    checked = audit_rows.compare(rows, events, run_id=report.run_id, thread_id=thread_id)
    report.rows_checked, report.not_covered = checked.rows_checked, checked.not_covered
    for mismatch in checked.mismatches:
        fail(f"row {mismatch.describe()}")
    if checked.more:
        fail(f"{checked.more} more rows differ from the chain")
    head = _object(document.get("chain_head"), "chain_head")
    head_sequence = head.get("sequence")
    if not isinstance(head_sequence, int):
        raise BundleFormatError("chain_head.sequence: expected an integer")
    chain = verify_chain(
        events,
        head=(head_sequence, _text(head, "hash", "chain_head")),
        chain=(thread_id, report.run_id),
    )
    report.event_count, report.head_hash = chain.event_count, chain.head_hash
    if chain.first_break is not None:
        b = chain.first_break
        detail = f" (expected {b.expected_hash or '-'}, found {b.found_hash or '-'})"
        fail(f"event chain broken at sequence {b.sequence}: {b.reason}{detail}")
    return report


@dataclass(frozen=True)
class _Component:
    kind: str
    name: str
    version: str
    digest: str
    schema_digest: str | None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}" if self.name else f"(inline {self.kind.lower()})"


def _verify_components(raw: list[Any], report: BundleReport) -> dict[str, _Component]:
    """Components whose stated digests recompute, by digest."""
    verified: dict[str, _Component] = {}
    for i, item in enumerate(raw):
        where = f"components[{i}]"
        c = _object(item, where)
        kind, name, version = (_text(c, k, where) for k in ("kind", "name", "version"))
        description, digest = _text(c, "description", where), _text(c, "digest", where)
        stated_schema = c.get("schema_digest") or None
        ref = f"{name}@{version}" if name else f"(inline {kind.lower()})"
        spec = _object(c.get("spec"), f"{where}.spec")
        try:
            recomputed, schema = canonical.component_digests(kind, name, version, description, spec)
        except CanonicalError as exc:
            report.failures.append(f"component {ref}: has no canonical form: {exc}")
            continue
        if recomputed != digest:
            report.failures.append(
                f"component {ref}: digest recomputes to {recomputed}, the bundle says {digest}"
            )
            continue
        if schema != stated_schema:
            report.failures.append(
                f"component {ref}: input schema digest recomputes to {schema}, the bundle says "
                f"{stated_schema}"
            )
            continue
        verified[digest] = _Component(kind, name, version, digest, schema)
    report.component_count = len(verified)
    return verified


def _verify_agent(
    agent: dict[str, Any],
    components: dict[str, _Component],
    binding: dict[str, Any],
    report: BundleReport,
) -> list[ClosureEntry]:
    fail = report.failures.append
    agent_id = _text(agent, "agent_id", "agent")
    label = _text(agent, "version_label", "agent")
    stated = _text(agent, "digest", "agent")
    report.agent, report.agent_digest = f"{agent_id}@{label}", stated
    closure: list[ClosureEntry] = []
    for i, raw in enumerate(_list(agent, "closure", "agent")):
        try:
            entry = ClosureEntry.from_json(_object(raw, f"agent.closure[{i}]"))
        except (KeyError, ValueError, TypeError) as exc:
            raise BundleFormatError(f"agent.closure[{i}]: not a closure entry ({exc})") from exc
        closure.append(entry)
        component = components.get(entry.digest)
        if component is None:
            fail(
                f"agent closure {entry.slot}: component {entry.render()} is not among the "
                "bundle's verified components"
            )
        elif (component.kind, component.name, component.version, component.schema_digest) != (
            entry.kind.value,
            entry.name,
            entry.version,
            entry.schema_digest,
        ):
            fail(
                f"agent closure {entry.slot}: says {entry.render()} but that digest is "
                f"{component.ref}"
            )
    try:
        recomputed = canonical.agent_digest(
            agent_id, label, _text(agent, "description", "agent"), to_agent_closure(closure)
        )
    except (CanonicalError, KeyError) as exc:
        fail(f"agent {agent_id}@{label}: its closure has no canonical form: {exc}")
        return closure
    if recomputed != stated:
        fail(
            f"agent {agent_id}@{label}: digest recomputes to {recomputed}, the bundle says {stated}"
        )
    bound = binding.get("agent_digest", "")
    if bound != stated:
        fail(f"the run is bound to agent {bound}, but the bundle's agent is {stated}")
    return closure


def _step_problems(step: dict[str, Any], run_id: str, closure: list[ClosureEntry]) -> Iterator[str]:
    """Why a step's recorded versions are not the agent's (nothing when they are). Whether
    they are what the chain recorded is :func:`audit_rows.compare`'s check."""
    step_id = str(step.get("id", ""))
    name = (
        f"step {step.get('sequence', '?')} {step_id} "
        f"({str(step.get('type', '')).removeprefix('STEP_TYPE_')})"
    )
    if step.get("run_id") != run_id:
        yield f"{name}: belongs to run {step.get('run_id')}, not {run_id}"
    versions = _object(step.get("versions", {}), f"{name}.versions")
    by_slot = {e.slot: e for e in closure}
    model = versions.get("model") or {}
    policy = model.get("policy_digest", "")
    if policy and policy != _digest_of(by_slot.get("model_policy")):
        yield f"{name}: model policy {policy} is not the agent's model policy"
    prompt = versions.get("system_prompt_digest", "")
    if prompt and prompt != _digest_of(by_slot.get("system_prompt")):
        yield f"{name}: system prompt {prompt} is not the agent's system prompt"
    for family in ("skills", "tools"):
        for used in versions.get(family, []):
            pinned = by_slot.get(f"{family}[{used.get('name', '')}]")
            recorded = f"{used.get('name')}@{used.get('version')} {used.get('digest')}"
            if pinned is None or (pinned.version, pinned.digest) != (
                used.get("version"),
                used.get("digest"),
            ):
                yield f"{name}: {family[:-1]} {recorded} is not in the agent's closure"
            elif family == "tools" and used.get("schema_digest") != pinned.schema_digest:
                schema = used.get("schema_digest")
                yield f"{name}: tool {recorded} schema {schema} is not the pinned one"


def _digest_of(entry: ClosureEntry | None) -> str:
    return entry.digest if entry is not None else ""


def _link_from_json(data: Any, where: str) -> Link:
    """Read an event of a bundle's ``events`` section."""
    record = _object(data, where)
    sequence = record.get("sequence")
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        raise BundleFormatError(f"{where}.sequence: expected an integer")
    texts = [
        _text(record, key, where)
        for key in ("id", "thread_id", "run_id", "event_type", "event_time", "prev_hash")
    ]
    event_id, thread_id, run_id, event_type, event_time, prev_hash = texts
    return Link(
        event_id,
        thread_id,
        run_id,
        sequence,
        event_type,
        event_time,
        record.get("attributes", {}),
        prev_hash,
        _text(record, "hash", where),
    )


# -- shape helpers ---------------------------------------------------------------------------


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BundleFormatError(f"{where}: expected a JSON object")
    return value


def _list(document: Mapping[str, Any], key: str, where: str = "") -> list[Any]:
    value = document.get(key)
    if not isinstance(value, list):
        raise BundleFormatError(f"{where + '.' if where else ''}{key}: expected a JSON array")
    return value


def _text(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key, "")
    if not isinstance(value, str):
        raise BundleFormatError(f"{where}.{key}: expected a string")
    return value
