"""Checking a registry against its log, as a client that trusts only a public key
(``agentrt verify``; docs/audit.md, "Verifying").

:func:`verify_version` proves that the agent version a reference resolves to is the one the
log recorded: its content recomputes to its digest, the log holds its publish entry under a
checkpoint signed by a trusted key, that checkpoint extends every checkpoint this client saw
before (kept in a small :class:`LogState` file, so a server that rewrites or forks its history
is caught, and one that shows a smaller log is a rollback), and, for a tag, no later entry
moved the tag elsewhere (so an old version served under a tag since moved is caught).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from agentrt.registry.v1 import enum_pb2
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt_core import canonical, log_verify
from agentrt_core import registry_map as pm
from agentrt_core.log_entries import AGENT_VERSION, TAG
from agentrt_core.publishing import to_agent_closure
from agentrt_core.signed_note import Checkpoint, NoteError, Verifier
from agentrt_sdk.errors import NotFoundError
from agentrt_sdk.registry_api import Registry

VerificationError = log_verify.VerificationError
ENV_STATE = "AGENTRT_LOG_STATE"


def default_state_path() -> Path:
    """``$AGENTRT_LOG_STATE``, else ``$XDG_STATE_HOME/agentrt/log-state.json`` (by default
    under ``~/.local/state``)."""
    if os.environ.get(ENV_STATE):
        return Path(os.environ[ENV_STATE])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agentrt" / "log-state.json"


@dataclass
class LogState:
    """Per log origin: the keys trusted for it and the newest checkpoint seen (its note)."""

    path: Path
    logs: dict[str, dict[str, object]] = field(default_factory=dict)
    #: The log origin each target served: a server may not turn into another log (and so
    #: have its keys pinned afresh on first use).
    targets: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> LogState:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise VerificationError(f"the state file {path} cannot be read: {exc}") from None
        logs = data.get("logs") if isinstance(data, dict) else None
        targets = data.get("targets", {}) if isinstance(data, dict) else None
        if not isinstance(logs, dict) or not isinstance(targets, dict):
            raise VerificationError(f"the state file {path} is not one agentrt wrote")
        return cls(path, logs, {str(k): str(v) for k, v in targets.items()})

    def keys(self, origin: str) -> list[Verifier]:
        entry = self.logs.get(origin, {})
        try:
            return [Verifier.parse(str(k)) for k in entry.get("keys", [])]  # type: ignore[attr-defined]
        except NoteError as exc:
            raise VerificationError(f"the state file {self.path}: {exc}") from None

    def seen(self, origin: str, keys: list[Verifier]) -> Checkpoint | None:
        note = self.logs.get(origin, {}).get("checkpoint")
        return log_verify.checkpoint(str(note), keys, origin) if note else None

    def remember(self, origin: str, keys: list[Verifier], note: str, target: str = "") -> None:
        self.logs[origin] = {"keys": [k.encode() for k in keys], "checkpoint": note}
        if target:
            self.targets[target] = origin
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        document = {"logs": self.logs, "targets": self.targets}
        temporary.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        temporary.replace(self.path)  # whole or not at all: a crash never leaves half a file


@dataclass(frozen=True)
class VerifiedVersion:
    ref: str
    digest: str
    entry_index: int
    checkpoint: Checkpoint
    #: The size of the checkpoint seen before this one (None: the first for this log).
    previous_size: int | None
    #: True when the keys were trusted on this first use (none given, none pinned).
    pinned_now: bool
    #: For a tag: the entry that set the target served.
    tag_entry: int | None = None


async def verify_version(
    registry: Registry,
    ref: str,
    state: LogState,
    keys: list[Verifier] | None = None,
    target: str = "",
) -> VerifiedVersion:
    """Prove what ``ref`` resolves to, or raise :class:`VerificationError` saying what fails.
    ``target``: where the server was reached, remembered with the log it served."""
    current = await registry.checkpoint()
    origin = current.origin
    known = state.targets.get(target) if target else None
    if known is not None and known != origin:
        raise VerificationError(
            f"the server at {target} served the log {known!r} before and now says it is "
            f"{origin!r}: a server does not become another log (if it was reinstalled, "
            "start a new state file)"
        )
    trusted, pinned_now = keys or state.keys(origin), False
    if not trusted:
        trusted = [Verifier.parse(k.verifier_key) for k in await registry.signing_keys()]
        pinned_now = True
    response = await registry.resolve(ref)
    version, resolution = response.agent_version, response.resolution
    await _check_content(registry, version)
    try:
        inclusion = await registry.inclusion_proof(digest=version.digest)
    except NotFoundError:
        raise VerificationError(
            f"the registry log has no entry that published {version.digest}"
        ) from None
    proven = log_verify.inclusion(
        note=inclusion.checkpoint.note,
        verifiers=trusted,
        index=inclusion.entry.index,
        leaf_data=inclusion.entry.leaf,
        tree_size=inclusion.tree_size,
        hashes=list(inclusion.hashes),
        origin=origin,
    )
    fields = proven.leaf.fields
    if proven.leaf.type != AGENT_VERSION or fields["digest"] != version.digest:
        raise VerificationError(f"log entry {proven.index} does not publish {version.digest}")
    if (fields["agent_id"], fields["version_label"]) != (version.agent_id, version.version_label):
        raise VerificationError(
            f"log entry {proven.index} publishes {version.digest} as "
            f"{fields['agent_id']}@{fields['version_label']}, not "
            f"{version.agent_id}@{version.version_label}"
        )
    signed = proven.checkpoint
    previous = state.seen(origin, trusted)
    if previous is not None:
        hashes: list[bytes] = []
        if previous.size <= signed.size:  # else a rollback, which the check names
            hashes = list((await registry.consistency_proof(previous.size, signed.size)).hashes)
        log_verify.consistency(previous, signed, hashes)
    tag_entry = None
    if resolution.kind == enum_pb2.REFERENCE_KIND_TAG:
        tag_entry = await _check_tag(registry, version, resolution, proven.index, signed)
    state.remember(origin, trusted, inclusion.checkpoint.note, target)
    return VerifiedVersion(
        ref=ref,
        digest=version.digest,
        entry_index=proven.index,
        checkpoint=signed,
        previous_size=previous.size if previous else None,
        pinned_now=pinned_now,
        tag_entry=tag_entry,
    )


async def _check_content(registry: Registry, version: rmsg.AgentVersion) -> None:
    """The served content recomputes to the served digest, and so does every component it
    pins, as served (a row rewritten in place is not what the digest, and so the log,
    recorded; a worker is handed the component rows, not the agent's)."""
    try:
        closure = pm.closure_from_proto(version.closure)
        recomputed = canonical.agent_digest(
            version.agent_id,
            version.version_label,
            version.definition.description,
            to_agent_closure(closure),
        )
    except (ValueError, KeyError) as exc:
        raise VerificationError(f"the served version has no canonical form: {exc}") from None
    if recomputed != version.digest:
        raise VerificationError(
            f"the served content of {version.agent_id}@{version.version_label} recomputes to "
            f"{recomputed}, not the {version.digest} it is served under"
        )
    pinned = {e.slot: e.digest for e in closure}
    if version.definition.system_prompt.HasField("text"):
        text = version.definition.system_prompt.text
        prompt = canonical.component_digest("PROMPT", "", "", "", {"text": text})
        if prompt != pinned.get("system_prompt"):
            raise VerificationError(
                f"the served inline system prompt recomputes to {prompt}, not the "
                f"{pinned.get('system_prompt')} the version pins"
            )
    components = await asyncio.gather(*(registry.get_component(e.digest) for e in closure))
    for entry, component in zip(closure, components, strict=True):
        try:
            spec = pm.spec_to_json(entry.kind, component.spec, "spec")
            digest, schema = canonical.component_digests(
                entry.kind.value, component.name, component.version, component.description, spec
            )
        except (ValueError, KeyError) as exc:
            raise VerificationError(
                f"component {entry.digest} has no canonical form: {exc}"
            ) from None
        if digest != entry.digest or (schema or "") != (entry.schema_digest or ""):
            raise VerificationError(
                f"the served content of component {entry.slot} ({entry.name or 'inline'}) "
                f"recomputes to {digest}, not the {entry.digest} the version pins"
            )


async def _check_tag(
    registry: Registry,
    version: rmsg.AgentVersion,
    resolution: rmsg.Resolution,
    published_at: int,
    signed: Checkpoint,
) -> int:
    """The entry that set the tag to the served version, and no later move of it, among the
    entries after the version's publish, proven together against ``signed``."""
    entries = None
    while entries is None or entries.end < signed.size:
        start = published_at + 1 if entries is None else entries.end
        if start >= signed.size:
            break
        page = await registry.log_entries(start, signed.size)
        if entries is None:
            entries = log_verify.EntryRange(start, list(page.prefix_hashes))
        for entry in page.entries:
            entries.add(entry.index, entry.leaf)
        if not page.entries:
            raise VerificationError(f"the log returned no entries from {start}")
    set_at: tuple[int, int] | None = None  # (entry index, tag event sequence)
    moved_to: str | None = None
    if entries is not None:
        entries.check(signed)
        for index, leaf in entries.leaves:
            f = leaf.fields
            if leaf.type == TAG and (f["agent_id"], f["tag"]) == (version.agent_id, resolution.tag):
                moved_to = str(f["to_digest"])
                set_at = (index, int(f["sequence"])) if moved_to == version.digest else None
    if moved_to is not None and moved_to != version.digest:
        where = f"moved to {moved_to}" if moved_to else "deleted"
        raise VerificationError(
            f"rollback: {version.agent_id}:{resolution.tag} was served as {version.digest}, but "
            f"the log shows the tag {where} since"
        )
    if set_at is None:
        raise VerificationError(
            f"the log has no move of {version.agent_id}:{resolution.tag} to {version.digest}"
        )
    if set_at[1] != resolution.tag_event_sequence:
        raise VerificationError(
            f"the server says tag event {resolution.tag_event_sequence} set "
            f"{version.agent_id}:{resolution.tag}; the log says event {set_at[1]}"
        )
    return set_at[0]
