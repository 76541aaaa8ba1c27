"""The server interceptor that turns domain errors into gRPC status, in one place.

A server interceptor wraps every handler of every service: servicers raise
:class:`agentrt_core.errors.AgentrtError` subclasses and never touch status codes themselves.
The status each error becomes (its code and ``google.rpc`` details, https://google.aip.dev/193)
is built by :mod:`agentrt_base.error_status`; this module sends it, in the
``grpc-status-details-bin`` trailer, which every official gRPC client library decodes
(Go ``status.FromError(err).Details()``, Java ``StatusProto.fromThrowable``, Node
``@grpc/grpc-js`` + ``google-rpc`` protos, Python ``grpc_status.rpc_status.from_call``).

A failure of the database rather than of the call (a lost connection, a lock held past the
busy timeout, a lost serialization conflict: ``agentrt_base.db_failures.database_failure``)
answers ``UNAVAILABLE`` or ``ABORTED``, which the caller may retry. Any other exception that is
not an ``AgentrtError`` is a bug of ours: it is logged with a fresh error id and answered
``INTERNAL`` with that id only — never a traceback on the wire.

Before any handler runs, the interceptor authenticates the caller (the gate), counts the call
against the caller's limits (:mod:`agentrt_base.limits`: rate, open watches, long polls), then
checks the request itself
(:mod:`agentrt_base.wire`): bytes that do not decode, NUL characters, non-finite numbers and
out-of-range times are refused ``INVALID_ARGUMENT`` here, for every RPC of every service
(health and reflection included, which get that check only), so no domain code sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from google.rpc import status_pb2

from agentrt_base.access import VISIBLE
from agentrt_base.auth import CALLER
from agentrt_base.db_failures import database_failure
from agentrt_base.error_status import internal_status, to_status
from agentrt_base.handler_wrap import WrappingInterceptor
from agentrt_base.limits import METHOD_KINDS, Limiter, Slot, anonymous_key
from agentrt_base.wire import Undecodable, check_request, guard_deserializer
from agentrt_core import errors, reasons
from agentrt_core.ids import new_id

log = logging.getLogger("agentrt.errors")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], status: status_pb2.Status) -> None:
    await context.abort(
        grpc.StatusCode(next(c for c in grpc.StatusCode if c.value[0] == status.code)),
        status.message,
        trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),),
    )


async def _handle(
    exc: BaseException, method: str, context: grpc.aio.ServicerContext[Any, Any]
) -> None:
    """Turn an exception escaping a handler into the right status; re-raise what is not ours."""
    if isinstance(exc, errors.AgentrtError):
        _, status = to_status(exc)
        await _abort(context, status)
    elif isinstance(exc, NotImplementedError):
        # The generated base servicer raises this for RPCs whose issue has not landed.
        await _abort(
            context,
            to_status(errors.Unimplemented(f"{method} is not implemented by this server yet"))[1],
        )
    elif (failure := database_failure(exc)) is not None:
        # Not a bug of the call: the database went away, stayed locked, or a transaction
        # lost a conflict. The caller may retry; the operator sees what happened.
        log.warning("database failure in %s: %s", method, exc)
        await _abort(context, to_status(failure)[1])
    else:
        error_id = new_id("err")
        log.error("unhandled error in %s (id %s)", method, error_id, exc_info=exc)
        await _abort(context, internal_status(error_id))


def _is_control_flow(exc: BaseException) -> bool:
    # context.abort() raises AbortError to unwind the handler: it must pass through untouched,
    # as must cancellation of the call (client gone, server shutting down).
    return isinstance(exc, grpc.aio.AbortError | grpc.aio.BaseError)


# Handlers are typed loosely on purpose: the aio server calls them with aio contexts, while
# grpc's stubs describe RpcMethodHandler's behaviours with the sync context type.
Handler = Callable[[Any, Any], Any]
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


#: What every call to an agentrt service passes first (``auth_gate.Authenticator``): raises to
#: refuse.
#: Awaited, so verifying a JWT can wait for its issuer's keys without blocking the loop.
Gate = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]
#: What every request of an agentrt call passes once it is read and checked (the permission
#: table, ``access.Authorizer``): the method's full name and the request; raises to refuse.
#: A client stream is judged by its first message (the one that names what it touches).
Authorize = Callable[[str, Any], Awaitable[None]]
#: What it passes next: the caller's limits (``limits.Limiter``), raising to refuse; returns
#: the slot a watch or long poll holds until it ends.
Admission = Callable[[grpc.aio.ServicerContext[Any, Any]], Slot | None]


def admission(limiter: Limiter, method: str) -> Admission:
    """Count a call of ``method`` against its caller: the authenticated principal, or
    ``anonymous@<peer host>`` when the server authenticates nobody."""
    kind = METHOD_KINDS.get(method)

    def admit(context: grpc.aio.ServicerContext[Any, Any]) -> Slot | None:
        principal = CALLER.get()
        if principal is None:
            return limiter.admit(anonymous_key(context.peer()), None, kind)
        return limiter.admit(principal.name, principal.limits, kind)

    return admit


@dataclass(frozen=True)
class _Checks:
    """What every call to an agentrt service passes before its handler, in this order: who
    is calling (``gate``), what it may still spend (``admit``), the request's bytes
    (``wire.check_request``) and what the request may touch (``authorize``; a client
    stream's first message). Each is optional: a server without auth has no gate and no
    authorisation."""

    method: str
    streamed_request: bool
    gate: Gate | None
    admit: Admission | None
    authorize: Authorize | None
    #: Set (with a gate) for the calls that outlive a reload: watches and long polls.
    changes: ConfigChanges | None = None

    @property
    def revocable(self) -> bool:
        return self.changes is not None

    async def enter(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Any, Slot | None]:
        """The request to hand the handler, and the slot the call holds until it ends (the
        caller releases it); raises the first refusal, holding nothing."""
        if self.gate is not None:
            await self.gate(context)
        slot = self.admit(context) if self.admit is not None else None
        try:
            if self.streamed_request:
                return _checked_stream(request, self.method, self.authorize), slot
            check_request(request)
            if self.authorize is not None:
                await self.authorize(self.method, request)
            return request, slot
        except BaseException:
            if slot is not None:
                slot.release()
            raise


class ConfigChanges(Protocol):
    """Where the configuration that authenticates callers says it changed
    (``auth_gate.Authenticator``): its generation, and a wait for the next one."""

    generation: int

    async def changed(self, generation: int) -> None: ...


async def _judged_again(
    checks: _Checks, request: Any, context: grpc.aio.ServicerContext[Any, Any], generation: int
) -> Exception:
    """Wait for each new configuration and judge the call again with the same gate and
    permission table that admitted it; return the first refusal (issue 25: revoking a
    principal ends what it already opened)."""
    assert checks.changes is not None
    # What a list (a long poll) was admitted to see; its handler goes on with that.
    admitted = VISIBLE.get()
    while True:
        await checks.changes.changed(generation)
        generation = checks.changes.generation
        try:
            if checks.gate is not None:
                await checks.gate(context)
            if checks.authorize is not None:
                await checks.authorize(checks.method, request)
        except Exception as exc:
            return exc
        if not VISIBLE.get().covers(admitted):
            # Still allowed to call, but no longer to see all it was handed out under.
            return errors.PermissionDenied(
                "what this caller may see was narrowed by the new auth configuration: call again",
                reason=reasons.OUTSIDE_SCOPE,
            )


async def _first(
    work: asyncio.Future[Any], watchdog: asyncio.Future[Exception]
) -> tuple[bool, Any]:
    """(True, work's result) if ``work`` finishes first, else (False, the refusal) with
    ``work`` cancelled."""
    try:
        await asyncio.wait({work, watchdog}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the call itself was cancelled: take its work down with it
        work.cancel()
        raise
    if work.done():
        return True, work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return False, watchdog.result()


def _wrap_unary(checks: _Checks, behavior: Handler) -> Handler:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        slot = None
        # Read before the gate runs: a reload between the two is not missed.
        generation = checks.changes.generation if checks.changes is not None else 0
        try:
            request, slot = await checks.enter(request, context)
            if not checks.revocable:
                return await behavior(request, context)
            # A long poll: it ends when it is served, or when the caller is refused again.
            watchdog = asyncio.ensure_future(_judged_again(checks, request, context, generation))
            try:
                served, outcome = await _first(
                    asyncio.ensure_future(behavior(request, context)), watchdog
                )
            finally:
                watchdog.cancel()
            if not served:
                raise outcome
            return outcome
        except Exception as exc:
            if _is_control_flow(exc):
                raise
            await _handle(exc, checks.method, context)
        finally:
            # Also when the call is cancelled (the client went away): the slot is freed.
            if slot is not None:
                slot.release()

    return wrapper


def _wrap_stream(checks: _Checks, behavior: Handler) -> Handler:
    async def wrapper(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        slot = None
        generation = checks.changes.generation if checks.changes is not None else 0
        try:
            request, slot = await checks.enter(request, context)
            if not checks.revocable:
                async for response in behavior(request, context):
                    yield response
                return
            # A watch: each next message races the caller being refused again (only with
            # authentication configured; a server without it pays nothing).
            responses = behavior(request, context).__aiter__()
            watchdog = asyncio.ensure_future(_judged_again(checks, request, context, generation))
            try:
                while True:
                    try:
                        served, outcome = await _first(
                            asyncio.ensure_future(responses.__anext__()), watchdog
                        )
                    except StopAsyncIteration:
                        break
                    if not served:
                        raise outcome
                    yield outcome
            finally:
                watchdog.cancel()
                with contextlib.suppress(Exception):
                    await responses.aclose()
        except Exception as exc:
            if _is_control_flow(exc):
                raise
            await _handle(exc, checks.method, context)
        finally:
            # Also when the stream is cancelled or closed by the client: the slot is freed.
            if slot is not None:
                slot.release()

    return wrapper


async def _checked_stream(
    requests: AsyncIterator[Any], method: str, authorize: Authorize | None
) -> AsyncIterator[Any]:
    """A client stream whose every message is checked as it arrives, the first one also
    authorised (the handler's loop raises the first refusal, which the wrapper maps like any
    other)."""
    first = True
    async for request in requests:
        check_request(request)
        if first and authorize is not None:
            await authorize(method, request)
        first = False
        yield request


def _guard_only(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """Health and reflection keep their own conventions (no error mapping), but bytes that
    do not decode still answer ``INVALID_ARGUMENT`` rather than gRPC's ``UNKNOWN``."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _abort(context, to_status(request.error())[1])

    def unary(behavior: Handler) -> Handler:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if type(request) is Undecodable:
                await refuse(request, context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

        return wrapper

    def server_streaming(behavior: Handler) -> Handler:
        if inspect.isasyncgenfunction(behavior):

            async def generator(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                if type(request) is Undecodable:
                    await refuse(request, context)
                async for response in behavior(request, context):
                    yield response

            return generator
        return unary(behavior)  # writes through context.write (health's Watch)

    def client_streaming(behavior: Handler, inner: Callable[[Handler], Handler]) -> Handler:
        wrapped = inner(behavior)

        def with_checked(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async def checked() -> AsyncIterator[Any]:
                async for request in requests:
                    if type(request) is Undecodable:
                        await refuse(request, context)
                    yield request

            return wrapped(checked(), context)

        if inspect.isasyncgenfunction(behavior):

            async def generator(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for response in with_checked(requests, context):
                    yield response

            return generator

        async def coroutine(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await with_checked(requests, context)

        return coroutine

    return _rebuild(
        handler,
        unary=unary,
        server_streaming=server_streaming,
        client_streaming=lambda b: client_streaming(b, unary),
        bidi=lambda b: client_streaming(b, server_streaming),
    )


def _rebuild(
    handler: grpc.RpcMethodHandler[Any, Any],
    *,
    unary: Callable[[Handler], Handler],
    server_streaming: Callable[[Handler], Handler],
    client_streaming: Callable[[Handler], Handler],
    bidi: Callable[[Handler], Handler],
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler with its behaviour wrapped (by its kind) and its request
    deserializer guarded."""
    kwargs = {
        "request_deserializer": guard_deserializer(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            client_streaming(handler.stream_unary), **kwargs
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            server_streaming(handler.unary_stream), **kwargs
        )
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(bidi(handler.stream_stream), **kwargs)
    return handler


class ErrorMappingInterceptor(WrappingInterceptor):
    """Applies the mapping above to every RPC of every service mounted on the server."""

    def __init__(
        self,
        gate: Gate | None = None,
        limiter: Limiter | None = None,
        authorize: Authorize | None = None,
        changes: ConfigChanges | None = None,
    ) -> None:
        #: Run first in every call to an agentrt service (authentication), its refusal
        #: mapped like any other error; health and reflection do not pass it.
        self._gate = gate
        #: Run next (per-principal limits, ``agentrt_base.limits``); None: no limits.
        self._limiter = limiter
        #: Run on every agentrt request once read (authorisation, ``agentrt_base.access``).
        self._authorize = authorize
        #: Where the gate's configuration says it changed: watches and long polls are judged
        #: again under each new one (None: never).
        self._changes = changes
        # A method's handler is the same object on every call: it is wrapped once (the
        # server asks on every call, and building a wrapper and a handler each time cost
        # ~2 us a call); WrappingInterceptor keeps the wrapper.
        super().__init__()

    def rewrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        # Its own rewrap rather than the base's per-kind hooks: the error mapping builds a
        # method's checks once and shares them between the kinds' wrappers.
        # Only agentrt's own services get the error mapping: health and reflection have their
        # own conventions (health's Watch writes through the context rather than yielding).
        if not method.startswith("/agentrt."):
            return _guard_only(handler)
        gate, authorize = self._gate, self._authorize
        admit = admission(self._limiter, method) if self._limiter is not None else None
        long_lived = METHOD_KINDS.get(method) is not None and gate is not None
        changes = self._changes if long_lived else None
        return _rebuild(
            handler,
            unary=lambda b: _wrap_unary(_Checks(method, False, gate, admit, authorize, changes), b),
            server_streaming=lambda b: _wrap_stream(
                _Checks(method, False, gate, admit, authorize, changes), b
            ),
            client_streaming=lambda b: _wrap_unary(
                _Checks(method, True, gate, admit, authorize), b
            ),
            bidi=lambda b: _wrap_stream(_Checks(method, True, gate, admit, authorize), b),
        )
