"""Run attestations: each run's end signed by the server, kept, and served.

A run is attested when it ends: :class:`RunAttester` is told of every run end after its
commit (``Runtime.run_ended``), and signs the run as that end
committed it, in the background, off the path of the call that ended it. At start it attests
the ended runs that have none (a server stopped between an end and its signature). Asked for
an attestation (GetRunAttestation), it serves the kept one of an ended run, signing it first
if the background has not yet; a running run is signed as it stands, and nothing is kept.

What the statement says is ``runtime_service.run_provenance``; the envelope is
``agentrt_core.dsse``'s, signed by the registry log's key (``agentrt_base.signing_keys``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from agentrt_base.db import utcnow
from agentrt_base.signing_keys import SigningKeys
from agentrt_core import dsse
from agentrt_core.bundle_evidence import evidence_document
from agentrt_core.errors import InvalidArgument, NotFound
from registry.transparency import RegistryLog
from runtime_service import run_provenance
from runtime_service.lifecycle import TERMINAL
from runtime_service.services.context import Runtime
from runtime_service.store import attestations, audit_reads

log = logging.getLogger(__name__)

#: Ended runs attested per read at start.
_CATCH_UP_PAGE = 200


@dataclass(frozen=True)
class Attestation:
    envelope: str
    #: The run had ended: this is the envelope signed at its end.
    final: bool


class RunAttester:
    """Signs runs as they end; serves what it signed."""

    def __init__(self, runtime: Runtime, keys: SigningKeys) -> None:
        self._rt = runtime
        self._keys = keys
        self._ended: asyncio.Queue[str] | None = None

    # -- told of run ends after their commit (``Runtime.run_ended``) ----------------------

    def ended(self, run_id: str) -> None:
        if self._ended is not None:
            self._ended.put_nowait(run_id)

    async def run(self, stop: asyncio.Event) -> None:
        """Attest what ends, and first what ended unattested, until ``stop`` is set."""
        self._ended = asyncio.Queue()
        await self._catch_up(stop)
        while not stop.is_set():
            waiting = asyncio.ensure_future(self._ended.get())
            stopping = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if waiting not in done:
                waiting.cancel()
                break
            stopping.cancel()
            await self._attest_quietly(waiting.result())

    async def _catch_up(self, stop: asyncio.Event) -> None:
        after = ""
        while not stop.is_set():
            ids = await self._rt.read(
                lambda s: attestations.unattested(s, after, _CATCH_UP_PAGE)  # noqa: B023
            )
            for run_id in ids:
                await self._attest_quietly(run_id)
            if len(ids) < _CATCH_UP_PAGE:
                return
            after = ids[-1]

    async def _attest_quietly(self, run_id: str) -> None:
        try:
            await self.attestation(run_id)
        except Exception:  # a failure here must not stop the next run's signature
            log.exception("could not attest run %s; it is attested when asked for", run_id)

    # -- the use case ---------------------------------------------------------------------

    async def attestation(self, run_id: str) -> Attestation:
        if not run_id:
            raise InvalidArgument.for_field("run_id", "required")
        kept, ended, envelope = await self._rt.read(lambda s: self._read(s, run_id))
        if kept is not None:
            return Attestation(kept, True)
        assert envelope is not None
        if not ended:
            return Attestation(envelope, False)
        key_id = self._keys.signer.verifier.key_id
        stored = await self._rt.write(
            lambda s: attestations.keep(s, run_id, envelope, key_id, utcnow())
        )
        return Attestation(stored, True)

    def _read(self, session: Session, run_id: str) -> tuple[str | None, bool, str | None]:
        """The kept envelope, or: whether the run has ended, and its envelope signed now."""
        audit_reads.snapshot(session)  # first: one snapshot for everything read
        kept = attestations.get(session, run_id)
        if kept is not None:
            return kept, True, None
        run = audit_reads.run(session, run_id)
        if run is None:
            raise NotFound("run", run_id)
        statement = run_provenance.statement(
            installation_id=audit_reads.installation_id(session),
            run=run,
            attempts=audit_reads.attempts_of_run(session, run.id),
            steps=audit_reads.steps_of_run(session, run.id),
            artifacts=audit_reads.artifacts_of_run(session, run.id),
        )
        envelope = dsse.sign(statement, self._keys.signer)
        return None, run.status in TERMINAL, json.dumps(envelope, separators=(",", ":"))


async def bundle_evidence(
    attester: RunAttester, log: RegistryLog, run_id: str, agent_digest: str
) -> dict[str, Any]:
    """What an audit bundle carries signed: the run's attestation, and its agent version's
    entry in the registry log proven against a fresh checkpoint (``agentrt_core.bundle_evidence``
    checks them offline)."""
    attestation = await attester.attestation(run_id)
    inclusion = await log.inclusion(index=None, digest=agent_digest, tree_size=0)
    proof = inclusion.proof
    return evidence_document(
        envelope=json.loads(attestation.envelope),
        final=attestation.final,
        checkpoint_note=inclusion.checkpoint.note,
        index=proof.index,
        leaf=proof.leaf,
        tree_size=proof.tree_size,
        hashes=proof.hashes,
    )
