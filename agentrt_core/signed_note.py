"""Signed notes and checkpoints: the C2SP ``signed-note`` and ``tlog-checkpoint`` formats.

A *signed note* is UTF-8 text ending in a newline, a blank line, then one line per signature:
``— <key name> <base64(key hash || signature)>``. An Ed25519 key is named by its *verifier
key*, ``<name>+<key hash as 8 hex digits>+<base64(0x01 || public key)>``, the key hash being
the first four bytes of ``SHA-256(name || "\\n" || 0x01 || public key)``.
A *checkpoint* is a note whose text is the log's origin, its size in decimal and its root
hash in base64, a line each (then optional extension lines).

Specs: https://github.com/C2SP/C2SP/blob/main/signed-note.md and
https://github.com/C2SP/C2SP/blob/main/tlog-checkpoint.md. The same formats are read by Go's
``golang.org/x/mod/sumdb/note`` and by the Sigstore and transparency-dev tools, so the
server's checkpoints can be checked with any of them. Signatures are ``cryptography``'s
Ed25519 (RFC 8032), never hand-written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: The signature type byte of an Ed25519 key (C2SP signed-note, "Signature types").
ALG_ED25519 = 0x01
SIGNATURE_PREFIX = "\u2014 "
#: At most this many signature lines are read (the spec lets a verifier set a bound).
MAX_SIGNATURES = 100


class NoteError(ValueError):
    """A note, key or checkpoint that is malformed or whose signature does not verify."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise NoteError(f"{what} is not base64") from None


def check_key_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name) or not name.isprintable():
        raise NoteError(f"key name {name!r}: non-empty, printable, no spaces and no '+'")


def key_hash(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public_key).digest()[:4]


@dataclass(frozen=True)
class Verifier:
    """One Ed25519 public key and its name."""

    name: str
    public_key: bytes

    @property
    def key_hash(self) -> bytes:
        return key_hash(self.name, self.public_key)

    @property
    def key_id(self) -> str:
        """``<name>+<key hash>``: how a DSSE signature or a listing names this key."""
        return f"{self.name}+{self.key_hash.hex()}"

    def encode(self) -> str:
        """The verifier key, ``name+hash+base64``."""
        return f"{self.key_id}+{_b64(bytes([ALG_ED25519]) + self.public_key)}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except InvalidSignature:
            return False
        return True

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """A verifier key; :class:`NoteError` naming what is wrong."""
        parts = text.strip().split("+", 2)  # the base64 may hold "+" too
        if len(parts) != 3:
            raise NoteError("a verifier key is name+hash+base64")
        name, hash_hex, key_b64 = parts
        check_key_name(name)
        key = _unb64(key_b64, "the verifier key")
        if len(key) != 33 or key[0] != ALG_ED25519:
            raise NoteError("the verifier key is not an Ed25519 key (type 0x01, 32 bytes)")
        verifier = cls(name, key[1:])
        if hash_hex.lower() != verifier.key_hash.hex() or len(hash_hex) != 8:
            raise NoteError(f"the verifier key's hash {hash_hex!r} does not match its key")
        return verifier


@dataclass(frozen=True)
class Signer:
    """An Ed25519 private key and its name."""

    name: str
    private_key: Ed25519PrivateKey

    @property
    def verifier(self) -> Verifier:
        raw = self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return Verifier(self.name, raw)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


def sign_note(text: str, signer: Signer) -> str:
    """``text`` signed: the note as it is served and verified, byte for byte."""
    _check_text(text)
    signature = signer.sign(text.encode())
    line = f"{SIGNATURE_PREFIX}{signer.name} {_b64(signer.verifier.key_hash + signature)}\n"
    return f"{text}\n{line}"


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("a note's text ends with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note's text has no control characters but newlines")


def open_note(note: str, verifiers: list[Verifier]) -> tuple[str, list[Verifier]]:
    """The note's text and which of ``verifiers`` signed it; :class:`NoteError` unless at
    least one did. Signatures by other keys are ignored, as the spec says; a signature that
    claims a known key and does not verify fails the note."""
    split = note.rfind("\n\n")
    if split < 0 or not note.endswith("\n"):
        raise NoteError("a signed note is its text, a blank line, then its signatures")
    text, lines = note[: split + 1], note[split + 2 :].splitlines()
    _check_text(text)
    if not lines or len(lines) > MAX_SIGNATURES:
        raise NoteError(f"a signed note has 1 to {MAX_SIGNATURES} signature lines")
    known = {(v.name, v.key_hash): v for v in verifiers}
    signed: list[Verifier] = []
    for line in lines:
        if not line.startswith(SIGNATURE_PREFIX):
            raise NoteError(f"signature line {line!r} does not start with '\u2014 '")
        name, _, encoded = line[len(SIGNATURE_PREFIX) :].rpartition(" ")
        check_key_name(name)
        raw = _unb64(encoded, "a signature")
        if len(raw) < 5:
            raise NoteError("a signature is a key hash and the signature")
        verifier = known.get((name, raw[:4]))
        if verifier is None:
            continue
        if not verifier.verify(text.encode(), raw[4:]):
            raise NoteError(f"the signature of {verifier.key_id} does not verify")
        signed.append(verifier)
    if not signed:
        names = ", ".join(v.key_id for v in verifiers) or "none"
        raise NoteError(f"the note is signed by none of the trusted keys ({names})")
    return text, signed


@dataclass(frozen=True)
class Checkpoint:
    """A log's state: its origin, how many entries, and their root hash."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.size), _b64(self.root_hash), *self.extensions]
        return "".join(f"{line}\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "":
            raise NoteError("a checkpoint is origin, size and root hash, a line each")
        origin, size_text, root_text, *extensions = lines[:-1]
        if not origin:
            raise NoteError("a checkpoint's origin is not empty")
        if not size_text.isdigit() or (size_text.startswith("0") and size_text != "0"):
            raise NoteError(f"a checkpoint's size {size_text!r} is a decimal number")
        root_hash = _unb64(root_text, "the checkpoint's root hash")
        if len(root_hash) != 32:
            raise NoteError("a checkpoint's root hash is 32 bytes (SHA-256)")
        if any(not line for line in extensions):
            raise NoteError("a checkpoint's extension lines are not empty")
        return cls(origin, int(size_text), root_hash, tuple(extensions))


def open_checkpoint(note: str, verifiers: list[Verifier], origin: str = "") -> Checkpoint:
    """The checkpoint a signed note holds, signed by one of ``verifiers`` (and of the log
    ``origin``, when given)."""
    text, _ = open_note(note, verifiers)
    checkpoint = Checkpoint.parse(text)
    if origin and checkpoint.origin != origin:
        raise NoteError(f"the checkpoint is of log {checkpoint.origin!r}, not {origin!r}")
    return checkpoint
