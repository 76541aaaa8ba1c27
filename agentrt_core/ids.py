"""Opaque, typed, time-ordered identifiers (``run_01JF…``).

Ids are a type prefix plus a ULID (48-bit millisecond timestamp, 80 random bits, Crockford
base32), so they sort by creation time, read well in logs and URLs, and tell at a glance what
they name. See https://github.com/ulid/spec for the encoding.
"""

from __future__ import annotations

import os
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = 0
_last_random = 0


def _ulid_int() -> int:
    """A 128-bit ULID value, monotonic within this process.

    Within one millisecond the random part is incremented rather than redrawn, so ids made in a
    burst still sort in the order they were made (the ULID spec's monotonic mode).
    """
    global _last_ms, _last_random
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            _last_random = (_last_random + 1) & ((1 << 80) - 1)
        else:
            _last_ms = now_ms
            _last_random = int.from_bytes(os.urandom(10), "big")
        return (now_ms << 80) | _last_random


#: Every pair of Crockford digits (10 bits), so a 130-bit value is 13 lookups, not 26.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]


def _encode(value: int) -> str:
    # 26 digits of 5 bits hold 130 bits: the ULID's 128, left-padded with two zero bits.
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in range(120, -1, -10)])


def new_id(prefix: str) -> str:
    """Return a new id such as ``run_01JF3Q9W1T8Y6Z0K5D8E2M4N7P``."""
    return f"{prefix}_{_encode(_ulid_int())}"


def has_prefix(value: str, prefix: str) -> bool:
    """Whether ``value`` looks like an id made by :func:`new_id` with ``prefix``."""
    head, sep, tail = value.partition("_")
    return bool(sep) and head == prefix and len(tail) == 26 and all(c in _CROCKFORD for c in tail)
