"""DSSE envelopes (Dead Simple Signing Envelope, the in-toto and Sigstore signature wrapper):
sign a payload with an Ed25519 key, and check an envelope against trusted keys.

The signature is over ``PAE(payloadType, payload)`` = ``"DSSEv1" SP LEN(type) SP type SP
LEN(body) SP body``, lengths in ASCII decimal bytes; the envelope is JSON with ``payload``
base64 (standard alphabet), ``payloadType`` and ``signatures`` (``keyid``, ``sig``). Spec:
https://github.com/secure-systems-lab/dsse/blob/master/protocol.md and envelope.md. An
envelope made here is read by ``cosign verify-blob-attestation --type`` and the in-toto
verifiers given the public key (docs/audit.md says how).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from agentrt_core.signed_note import Signer, Verifier

#: The payload type of an in-toto Statement.
IN_TOTO = "application/vnd.in-toto+json"


class EnvelopeError(ValueError):
    """A malformed envelope, or one no trusted key signed."""


def pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign(payload: bytes, signer: Signer, payload_type: str = IN_TOTO) -> dict[str, Any]:
    signature = signer.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [
            {"keyid": signer.verifier.key_id, "sig": base64.b64encode(signature).decode()}
        ],
    }


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise EnvelopeError(f"the envelope's {what} is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        try:  # the spec allows the URL-safe alphabet too
            return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            raise EnvelopeError(f"the envelope's {what} is not base64") from None


def open_envelope(
    envelope: dict[str, Any], verifiers: Sequence[Verifier], payload_type: str = IN_TOTO
) -> tuple[bytes, list[Verifier]]:
    """The payload and the trusted keys that signed it; :class:`EnvelopeError` unless one
    did. A signature naming no trusted key is skipped; one that names a trusted key and does
    not verify fails the envelope."""
    if not isinstance(envelope, dict):
        raise EnvelopeError("an envelope is a JSON object")
    if envelope.get("payloadType") != payload_type:
        raise EnvelopeError(
            f"the payload type is {envelope.get('payloadType')!r}, not {payload_type!r}"
        )
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise EnvelopeError("the envelope has no signatures")
    message = pae(payload_type, payload)
    by_id = {v.key_id: v for v in verifiers}
    signed: list[Verifier] = []
    for entry in signatures:
        if not isinstance(entry, dict):
            raise EnvelopeError("a signature is a JSON object")
        verifier = by_id.get(str(entry.get("keyid", "")))
        if verifier is None:
            continue
        if not verifier.verify(message, _b64(entry.get("sig"), "signature")):
            raise EnvelopeError(f"the signature of {verifier.key_id} does not verify")
        signed.append(verifier)
    if not signed:
        names = ", ".join(v.key_id for v in verifiers) or "none"
        raise EnvelopeError(f"the envelope is signed by none of the trusted keys ({names})")
    return payload, signed


def statement(envelope: dict[str, Any], verifiers: Sequence[Verifier]) -> dict[str, Any]:
    """The in-toto Statement an envelope signed by a trusted key holds."""
    payload, _ = open_envelope(envelope, verifiers)
    return parse_statement(payload)


def parse_statement(payload: bytes) -> dict[str, Any]:
    """An envelope's payload as an in-toto Statement v1 (its signature checked already)."""
    try:
        value = json.loads(payload)
    except ValueError:
        raise EnvelopeError("the payload is not JSON") from None
    if not isinstance(value, dict) or value.get("_type") != "https://in-toto.io/Statement/v1":
        raise EnvelopeError("the payload is not an in-toto Statement v1")
    return value
