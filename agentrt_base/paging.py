"""Opaque page tokens for keyset pagination (AIP-158).

A token carries the sort key of the last item served plus a fingerprint of the request's
filters, so a token reused with different filters is refused instead of silently returning a
page of something else. Tokens are base64url JSON: opaque to callers, debuggable by us.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrt_base.errors import InvalidArgument

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    """A validated page size and the decoded position to continue after (None: first page)."""

    size: int
    after: list[Any] | None


def _fingerprint(filters: dict[str, Any]) -> str:
    data = json.dumps(filters, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def page_request(
    page_size: int,
    page_token: str,
    filters: dict[str, Any],
    *,
    default: int = 100,
    maximum: int = 1000,
) -> PageRequest:
    """Validate ``page_size`` (0 = default, capped at maximum) and decode ``page_token``.

    Raises:
        InvalidArgument: a negative size, or a token that is malformed or was issued for
            different filters.
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
        if not isinstance(after, list):
            raise ValueError
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument.for_field("page_token", "not a token this server issued") from exc
    if fingerprint != _fingerprint(filters):
        raise InvalidArgument.for_field("page_token", "issued for a request with different filters")
    return PageRequest(size, after)


def next_page_token(last_key: list[Any], filters: dict[str, Any]) -> str:
    """The token that continues after the item whose sort key is ``last_key``."""
    data = json.dumps({"f": _fingerprint(filters), "k": last_key}, default=str).encode()
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
