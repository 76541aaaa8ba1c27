"""Attestations on agent versions: attach one (signed by a key the auth config trusts for the
caller, or by the server for an OIDC-verified caller), list them; and what a tag policy reads
of them (``attested``).

An attachment is appended to the registry log in its own transaction, as a publish is: its
leaf names the version, the predicate type, the envelope's digest, the key and the principal.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from sqlalchemy.orm import Session

from agentrt_base.auth import CALLER
from agentrt_base.db import Database, utcnow
from agentrt_core import content_limits, dsse, reasons
from agentrt_core.attestation_policy import Attested
from agentrt_core.errors import InvalidArgument, NotFound, PermissionDenied, ViolationCollector
from agentrt_core.ids import new_id
from agentrt_core.jcs import canonical_bytes, digest_bytes
from agentrt_core.log_entries import attestation_leaf
from agentrt_core.model import VerifiedProvenance
from agentrt_core.paging import cut_page, page_request
from agentrt_core.signed_note import NoteError, Verifier
from registry import attestation_store, log_store, store
from registry.service_common import Page, digest_field, write_retrying
from registry.transparency import RegistryLog, inclusion_in

#: The largest envelope or statement attached (UTF-8 bytes).
MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Attached:
    row: attestation_store.AttestationRow
    created: bool
    proof: log_store.Proof


class AttestationsService:
    def __init__(self, database: Database, log: RegistryLog) -> None:
        self._db = database
        self._log = log

    async def attach(self, agent_id: str, digest: str, envelope: str, statement: str) -> Attached:
        problems = ViolationCollector()
        if not agent_id:
            problems.add("agent_id", "required")
        digest_field(digest, "digest", problems)
        if bool(envelope) == bool(statement):
            problems.add("content", "required: exactly one of envelope or statement")
        for name, text in (("envelope", envelope), ("statement", statement)):
            if len(text.encode()) > MAX_BYTES:
                problems.add(name, f"at most {MAX_BYTES} bytes")
        problems.raise_if_any()
        signed, key_id, principal, verified = self._signed(envelope, statement)
        predicate_type = _check_statement(signed, digest)
        stored = json.dumps(signed, separators=(",", ":"), sort_keys=True)
        envelope_digest = digest_bytes(stored.encode())

        def write(session: Session) -> Attached:
            version = store.agent_version_by_digest(session, digest)
            if version is None or version.agent_id != agent_id:
                raise NotFound("agent version", f"{agent_id}@{digest}")
            existing = attestation_store.by_envelope(session, digest, envelope_digest)
            if existing is not None:
                leaf = log_store.entry_leaf(session, existing.log_index) or b""
                return Attached(existing, False, inclusion_in(session, existing.log_index, leaf))
            now = utcnow()
            leaf_value = attestation_leaf(
                digest=digest,
                predicate_type=predicate_type,
                envelope_digest=envelope_digest,
                key_id=key_id,
                principal=principal,
                time=now,
            )
            row = attestation_store.AttestationRow(
                id=new_id("att"),
                agent_digest=digest,
                predicate_type=predicate_type,
                principal=principal,
                key_id=key_id,
                verified_json=store.verified_json(verified),
                envelope_digest=envelope_digest,
                envelope=stored,
                attach_time=now,
                log_index=-1,  # its entry's, once appended
            )
            session.add(row)
            session.flush()
            # The append last (log_store.append says why), then its index on our own row.
            (proof,) = log_store.append(session, leaf_value)
            row.log_index = proof.index
            session.flush()
            return Attached(row, True, proof)

        return await write_retrying(self._db, write)

    def _signed(
        self, envelope: str, statement: str
    ) -> tuple[dict[str, object], str, str, VerifiedProvenance | None]:
        """The envelope to keep, its key id, the attesting principal and its verified claims."""
        caller = CALLER.get()
        principal = caller.name if caller is not None else "anonymous"
        if envelope:
            try:
                parsed = json.loads(envelope)
            except ValueError:
                raise InvalidArgument.for_field("envelope", "not JSON") from None
            try:
                keys = [Verifier.parse(k) for k in (caller.attestation_keys if caller else ())]
            except NoteError:  # the auth config checked them when it loaded
                keys = []
            try:
                _, signed_by = dsse.open_envelope(parsed, keys)
            except dsse.EnvelopeError as exc:
                if "none of the trusted keys" in str(exc):
                    raise PermissionDenied(
                        f"the envelope is signed by no key the auth config trusts for "
                        f"{principal!r} (its attestation_keys)",
                        reason=reasons.ATTESTATION_UNTRUSTED,
                    ) from None
                raise InvalidArgument.for_field("envelope", str(exc)) from None
            return parsed, signed_by[0].key_id, principal, None
        # Without an auth config every (loopback) caller may do everything, this too; with
        # one, the server vouches only for what an OIDC token proved.
        if caller is not None and caller.method != "oidc":
            raise PermissionDenied(
                "the server signs a statement only for a caller authenticated with an OIDC "
                "token (its verified claims are recorded); sign it yourself and send envelope",
                reason=reasons.ATTESTATION_UNTRUSTED,
            )
        try:
            document = json.loads(statement)
            payload = canonical_bytes(document)
        except ValueError:
            raise InvalidArgument.for_field("statement", "not JSON") from None
        signer = self._log.keys.signer
        verified = VerifiedProvenance(caller.claims) if caller is not None else None
        return dsse.sign(payload, signer), signer.verifier.key_id, principal, verified

    async def list(
        self, digest: str, predicate_type: str, page_size: int, page_token: str
    ) -> Page[attestation_store.AttestationRow]:
        problems = ViolationCollector()
        digest_field(digest, "digest", problems)
        problems.raise_if_any()
        filters = {"digest": digest, "predicate_type": predicate_type}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(int,),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )
        after = page.after[0] if page.after is not None else None

        def read(session: Session) -> Page[attestation_store.AttestationRow]:
            if store.agent_version_by_digest(session, digest) is None:
                raise NotFound("agent version", digest)
            rows, token = cut_page(
                attestation_store.page(session, digest, predicate_type, after, page.size + 1),
                page.size,
                filters,
                lambda r: [r.log_index],
            )
            return Page(rows, token)

        return await self._db.read(read)


def _check_statement(envelope: dict[str, object], digest: str) -> str:
    """The statement's predicate type, if it is an in-toto Statement v1 about ``digest``."""
    try:
        raw = base64.b64decode(str(envelope.get("payload", "")), validate=True)
        statement = dsse.parse_statement(raw)
    except (ValueError, dsse.EnvelopeError) as exc:
        raise InvalidArgument.for_field("envelope", f"payload: {exc}") from None
    predicate_type = statement.get("predicateType")
    if not isinstance(predicate_type, str) or not 0 < len(predicate_type) <= 500:
        raise InvalidArgument.for_field("statement", "predicateType: a string of 1-500 characters")
    if not isinstance(statement.get("predicate"), dict):
        raise InvalidArgument.for_field("statement", "predicate: an object")
    hex_digest = digest.removeprefix("sha256:")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or not any(
        isinstance(s, dict)
        and isinstance(s.get("digest"), dict)
        and s["digest"].get("sha256") == hex_digest
        for s in subjects
    ):
        raise InvalidArgument.for_field(
            "statement", f"subject: no subject has the version's digest (sha256 {hex_digest})"
        )
    return predicate_type


def attested(session: Session, digest: str) -> list[Attested]:
    """A version's attestations as a tag policy reads them (their envelopes were verified
    when attached; the predicate is read from the kept payload)."""
    out = []
    for row in attestation_store.of_version(session, digest):
        statement = dsse.parse_statement(base64.b64decode(json.loads(row.envelope)["payload"]))
        predicate = statement.get("predicate")
        out.append(
            Attested(
                row.predicate_type, row.principal, predicate if isinstance(predicate, dict) else {}
            )
        )
    return out
