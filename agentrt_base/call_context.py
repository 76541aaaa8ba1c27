"""What a log line may say about the call it was written in: the method and the ids the
request names (thread, run, attempt, step).

An interceptor sets :data:`CALL` for the length of each call, from the request's own
top-level ``thread_id``/``run_id``/``attempt_id``/``step_id`` fields (found once per request
type from its descriptor). Only ids are taken, never content (prompts, arguments, outputs). The JSON
log format (``agentrt_base.log_format``) reads it; the interceptor is mounted only with that
format, so the text format costs nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import grpc

from agentrt_base.handler_wrap import BIDI_STREAM, CLIENT_STREAM, Handler, WrappingInterceptor, call

#: The fields a request may carry that a log line reports, in the order it reports them.
ID_FIELDS: Final = ("thread_id", "run_id", "attempt_id", "step_id")


@dataclass(frozen=True)
class Call:
    method: str
    ids: tuple[tuple[str, str], ...] = ()


CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("agentrt_call", default=None)


#: Each request type's id fields, found once from its descriptor.
_FIELDS: dict[type, tuple[str, ...]] = {}


def ids_of(request: Any) -> tuple[tuple[str, str], ...]:
    """The non-empty id fields of ``request`` (none when it is not a message: a request that
    did not decode)."""
    fields = _FIELDS.get(type(request))
    if fields is None:
        names = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
        fields = _FIELDS[type(request)] = tuple(name for name in ID_FIELDS if name in names)
    found = []
    for name in fields:
        value = getattr(request, name)
        if value:
            found.append((name, str(value)[:64]))  # an id is short; a hostile one is clipped
    return tuple(found)


class CallContextInterceptor(WrappingInterceptor):
    """Sets :data:`CALL` around every call's handler."""

    def wrap_unary(self, method: str, kind: str, behavior: Handler) -> Handler:
        streaming_request = kind in (CLIENT_STREAM, BIDI_STREAM)

        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            ids = () if streaming_request else ids_of(request)
            token = CALL.set(Call(method, ids))
            try:
                return await call(behavior, request, context)
            finally:
                CALL.reset(token)

        return wrapper

    def wrap_stream(self, method: str, kind: str, behavior: Handler) -> Handler:
        streaming_request = kind == BIDI_STREAM

        async def generator(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            ids = () if streaming_request else ids_of(request)
            # Set for the generator's own steps: each resumption runs in the caller's context,
            # so it is set again around each one rather than once.
            iterator = behavior(request, context).__aiter__()
            while True:
                token = CALL.set(Call(method, ids))
                try:
                    response = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    CALL.reset(token)
                yield response

        return generator
