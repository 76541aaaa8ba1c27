"""Agent versions as signed A2A Agent Cards.

An A2A Agent Card (https://a2a-protocol.org, "Agent Card") describes an agent to other
agents; its ``signatures`` are JWS (RFC 7515) over the card's RFC 8785 canonical form with the
``signatures`` member removed, each in the flattened JSON form without the payload (detached):
``protected`` (base64url of the protected header) and ``signature`` (base64url of the
signature over ``protected || "." || base64url(canonical card)``). Ours are Ed25519, ``alg``
``EdDSA`` (RFC 8037), ``kid`` the key id of ``GetSigningKeys``: any JOSE library verifies them
with the published public key.

The card says what the version is: its name and label, its description, the skills and tools
its closure pinned (as A2A skills), and, in an extension, its digest and the registry log that
recorded it, so a card can be traced back to the log entry that published the version.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from agentrt_core.jcs import canonical_bytes
from agentrt_core.model import ClosureEntry
from agentrt_core.signed_note import Signer, Verifier

#: The A2A protocol version the cards follow.
PROTOCOL_VERSION = "0.3.0"
#: The card extension naming the agent version behind it.
EXTENSION = "https://agentrt.dev/a2a/agent-version/v1"


class CardError(ValueError):
    """A card whose signature does not verify, or that is not a signed card."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise CardError("not base64url") from None


def card(
    *,
    agent_id: str,
    version_label: str,
    description: str,
    digest: str,
    closure: Sequence[ClosureEntry],
    log_origin: str,
    url: str,
) -> dict[str, Any]:
    """The unsigned card of one agent version."""
    skills = [
        {
            "id": f"{e.name}@{e.version}",
            "name": e.name,
            "description": f"{e.kind.value.lower()} {e.name}@{e.version} ({e.digest})",
            "tags": [e.kind.value.lower()],
        }
        for e in closure
        if e.slot.startswith(("skills[", "tools["))
    ]
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "name": agent_id,
        "description": description or f"{agent_id}@{version_label}",
        "url": url,
        "version": version_label,
        "capabilities": {
            "extensions": [
                {
                    "uri": EXTENSION,
                    "description": "The agentrt agent version this card describes.",
                    "required": False,
                    "params": {"digest": digest, "registry_log": log_origin},
                }
            ]
        },
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    }


def signing_input(document: dict[str, Any], protected: str) -> bytes:
    unsigned = {k: v for k, v in document.items() if k != "signatures"}
    return f"{protected}.{_b64url(canonical_bytes(unsigned))}".encode()


def sign(document: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """``document`` with one more signature, by ``signer``."""
    header = {"alg": "EdDSA", "kid": signer.verifier.key_id, "typ": "JOSE"}
    protected = _b64url(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())
    signature = signer.sign(signing_input(document, protected))
    signatures = [
        *document.get("signatures", []),
        {"protected": protected, "signature": _b64url(signature)},
    ]
    return {**document, "signatures": signatures}


def verify(document: dict[str, Any], verifiers: Sequence[Verifier]) -> list[Verifier]:
    """The trusted keys that signed the card; :class:`CardError` unless one did. A signature
    by an unknown ``kid`` is skipped; one by a trusted key that does not verify fails."""
    by_id = {v.key_id: v for v in verifiers}
    signed: list[Verifier] = []
    for entry in document.get("signatures") or []:
        if not isinstance(entry, dict):
            raise CardError("a signature is a JSON object")
        protected = str(entry.get("protected", ""))
        try:
            header = json.loads(_unb64url(protected))
        except ValueError:
            raise CardError("a signature's protected header is not JSON") from None
        verifier = by_id.get(str(header.get("kid", ""))) if isinstance(header, dict) else None
        if verifier is None:
            continue
        if header.get("alg") != "EdDSA":
            raise CardError(f"the signature of {verifier.key_id} is not EdDSA")
        raw = _unb64url(str(entry.get("signature", "")))
        if not verifier.verify(signing_input(document, protected), raw):
            raise CardError(f"the signature of {verifier.key_id} does not verify")
        signed.append(verifier)
    if not signed:
        raise CardError("the card is signed by none of the trusted keys")
    return signed
