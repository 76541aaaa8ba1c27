"""Opaque page tokens for keyset pagination (AIP-158).

A token carries the sort key of the last item served plus a fingerprint of the request's
filters, so a token reused with different filters is refused instead of silently returning a
page of something else. Tokens are base64url JSON: opaque to callers, debuggable by us.

Tokens are not signed (every replica must accept every other's without a shared secret), so
a caller can hand back any JSON. Each list therefore declares the shape of its key
(:data:`KeyPart` types, in order) and :func:`page_request` refuses any position that does not
have it before a query sees it: no list can be made to compare a column with a value of
another type, an integer wider than the database's, or a NUL character.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrt_core.errors import InvalidArgument

T = TypeVar("T")

#: What one part of a list's sort key can be; datetimes travel as ISO 8601 text.
KeyPart = type[str] | type[int] | type[dt.datetime]
_INT64 = 1 << 63
#: Longer than any id, name or digest a key holds.
_MAX_KEY_TEXT = 1024


@dataclass(frozen=True)
class PageRequest:
    """A validated page size and the decoded position to continue after (None: first page)."""

    size: int
    after: list[Any] | None


def _fingerprint(filters: dict[str, Any]) -> str:
    data = json.dumps(filters, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


#: What page_size 0 means, for every list of every service (the protos say so: one number,
#: whichever list a client pages through).
DEFAULT_PAGE_SIZE = 100
#: The most one page holds; a larger page_size is treated as this.
MAX_PAGE_SIZE = 1000


def page_request(
    page_size: int,
    page_token: str,
    filters: dict[str, Any],
    *,
    key: tuple[KeyPart, ...],
    default: int = DEFAULT_PAGE_SIZE,
    maximum: int = MAX_PAGE_SIZE,
) -> PageRequest:
    """Validate ``page_size`` (0 = default, capped at maximum) and decode ``page_token``,
    whose position must have the shape ``key`` (the position comes back typed: datetimes
    as ``datetime``).

    Raises:
        InvalidArgument: a negative size, or a token that is malformed, has a position of
            another shape, or was issued for different filters.
    """
    if page_size < 0:
        raise InvalidArgument.for_field("page_size", "must not be negative")
    size = min(page_size or default, maximum)
    if not page_token:
        return PageRequest(size, None)
    try:
        padded = page_token + "=" * (-len(page_token) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode()))
        fingerprint, after = decoded["f"], decoded["k"]
        position = _position(after, key)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument.for_field("page_token", "not a token this server issued") from exc
    if fingerprint != _fingerprint(filters):
        raise InvalidArgument.for_field("page_token", "issued for a request with different filters")
    return PageRequest(size, position)


def _position(after: Any, key: tuple[KeyPart, ...]) -> list[Any]:
    """The token's position typed as ``key`` says; ValueError if it has another shape."""
    if not isinstance(after, list) or len(after) != len(key):
        raise ValueError("position of another length")
    typed: list[Any] = []
    for part, value in zip(key, after, strict=True):
        if part is int:
            # bool is an int to Python, not to a column.
            if type(value) is not int or not -_INT64 <= value < _INT64:
                raise ValueError("not a 64-bit integer")
            typed.append(value)
            continue
        if type(value) is not str or len(value) > _MAX_KEY_TEXT or "\x00" in value:
            raise ValueError("not a key's text")
        typed.append(dt.datetime.fromisoformat(value) if part is dt.datetime else value)
    return typed


def next_page_token(last_key: list[Any], filters: dict[str, Any]) -> str:
    """The token that continues after the item whose sort key is ``last_key``."""
    key = [part.isoformat() if isinstance(part, dt.datetime) else part for part in last_key]
    data = json.dumps({"f": _fingerprint(filters), "k": key}).encode()
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def cut_page(
    rows: Sequence[T], size: int, filters: dict[str, Any], key: Callable[[T], list[Any]]
) -> tuple[list[T], str]:
    """The page out of rows read with ``LIMIT size + 1``: at most ``size`` of them, and the
    token that continues after the last (``key`` gives its sort key), or "" when there is no
    more."""
    if len(rows) <= size:
        return list(rows), ""
    page = list(rows[:size])
    return page, next_page_token(key(page[-1]), filters)
