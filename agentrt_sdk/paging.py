"""Walking AIP-158 pages: every ``List*`` call of the SDK reads through :func:`collect`."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from agentrt_sdk.transport import Connection

#: The page size the SDK asks for (the server clamps it to its own maximum).
PAGE_SIZE = 200


async def collect(
    connection: Connection,
    service: str,
    method: str,
    request: Message,
    items: str,
    limit: int | None = None,
) -> list[Any]:
    """Every item of field ``items`` over all pages (at most ``limit``), in server order."""
    found: list[Any] = []
    request.page_size = PAGE_SIZE  # type: ignore[attr-defined]
    while True:
        response: Any = await connection.unary(service, method, request, Message)
        found.extend(getattr(response, items))
        if limit is not None and len(found) >= limit:
            return found[:limit]
        token = response.next_page_token
        if not token:
            return found
        request.page_token = token  # type: ignore[attr-defined]
