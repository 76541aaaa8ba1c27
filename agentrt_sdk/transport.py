"""One connection to an agentrt server: the channel, credentials, deadlines, and the retry
rule every SDK call goes through.

The retry rule (:meth:`Connection.unary`): a call is sent again, with backoff, only when
sending it twice cannot do twice what it does —

- it is a read (``Get*``, ``List*``, ``Diff*``, ``Compute*``, ``Verify*``, ``Find*``);
- it carries an idempotency key: an empty ``request_id`` is filled with a fresh UUID *once,
  before the first try*, so every retry carries the same one (AIP-155); a ``BeginStep``
  with an ``idempotency_key``;
- or the contract makes it idempotent by itself (:data:`IDEMPOTENT`: a heartbeat, ending a
  step or an attempt with the same outcome, publishing identical content, uploading a
  content-addressed blob);

and only for errors that say "not now" rather than "no": ``UNAVAILABLE`` (including
``COMMIT_OUTCOME_UNKNOWN``, which the contract says to retry with the same key),
``ABORTED``/``TRANSACTION_CONFLICT``, and the caller's own rate limit (after its
``RetryInfo`` delay).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf.message import Message

from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import runtime_service_pb2_grpc, worker_service_pb2_grpc
from agentrt_core.connect import (
    ENV_TOKEN,
    ClientTls,
    channel_credentials,
    plaintext_failure_hint,
    resolve_target,
)
from agentrt_sdk import errors
from agentrt_sdk.tracing import outgoing_metadata

__all__ = ["Connection", "RetryPolicy"]

R = TypeVar("R", bound=Message)

#: Methods safe to repeat without a key: the contract makes a repeat return the first answer.
IDEMPOTENT = frozenset(
    {
        "Heartbeat",  # renews the same lease
        "EndTurn",  # "repeating it for an ended turn returns the same result"
        "EndStep",  # "repeating the same outcome returns the step unchanged"
        "FinishAttempt",  # "repeating the same outcome returns the same result"
        "PublishComponent",  # identical content returns the published one (created=false)
        "PublishAgentVersion",
        "PutBlob",  # content-addressed
        "GetBlob",
        "ExportBundle",
        "WatchRun",
        "WatchThread",
    }
)
_READ_PREFIXES = ("Get", "List", "Diff", "Compute", "Verify", "Find")

#: Reasons under a retryable code that mean "try again" (ABORTED is otherwise a real conflict).
_RETRY_ABORTED_REASONS = frozenset({"TRANSACTION_CONFLICT"})


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (delays drawn from [0, min(cap, base * 2^n)]).

    Attributes:
        attempts: tries in all, the first included (1 disables retries).
        initial_backoff: seconds before the first retry's upper bound doubles.
        max_backoff: the bound's cap.
    """

    attempts: int = 6
    initial_backoff: float = 0.1
    max_backoff: float = 5.0

    def delay(self, retry: int, floor: float | None = None) -> float:
        bound = min(self.max_backoff, self.initial_backoff * (2**retry))
        return max(floor or 0.0, random.uniform(0, bound))


def is_retryable(error: errors.AgentrtError) -> bool:
    """Whether ``error`` says "not now" (see the module docstring)."""
    if isinstance(error, errors.UnavailableError | errors.RateLimitedError):
        return True
    return isinstance(error, errors.AbortedError) and error.reason in _RETRY_ABORTED_REASONS


def repeatable(method: str, request: Message) -> bool:
    """Whether sending ``request`` twice does what sending it once does.

    Fills an empty ``request_id`` with a fresh key as a side effect, so the caller sends the
    same key on every try."""
    if method in IDEMPOTENT or method.startswith(_READ_PREFIXES):
        return True
    fields = request.DESCRIPTOR.fields_by_name
    keyed: Any = request  # a request with one of the key fields, checked by name below
    if "request_id" in fields:
        if not keyed.request_id:
            keyed.request_id = str(uuid.uuid4())
        return True
    return "idempotency_key" in fields and bool(keyed.idempotency_key)


_SERVICES: dict[str, Callable[[grpc.aio.Channel], Any]] = {
    "registry": registry_service_pb2_grpc.RegistryServiceStub,
    "runtime": runtime_service_pb2_grpc.RuntimeServiceStub,
    "worker": worker_service_pb2_grpc.WorkerServiceStub,
    "audit": audit_service_pb2_grpc.AuditServiceStub,
}


class Connection:
    """A gRPC channel to one server with the SDK's credentials, deadline and retry rule.

    Created and used inside one running event loop (grpc.aio binds a channel to its loop).

    Args:
        target: ``HOST:PORT``; default ``AGENTRT_TARGET`` or ``127.0.0.1:50051``.
        token: API or OIDC token sent as ``authorization: Bearer``; default ``AGENTRT_TOKEN``.
        tls: the server's CA (and a client certificate); default from ``AGENTRT_TLS_*``.
        timeout: per-try deadline of unary calls, in seconds.
        retry: the backoff of retried calls.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        token = token or os.environ.get(ENV_TOKEN) or None
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        tls = tls or ClientTls.resolve(None, None, None)
        self._plaintext = tls is None
        if tls is None:
            self.channel = grpc.aio.insecure_channel(self.target, options=list(options))
        else:
            self.channel = grpc.aio.secure_channel(
                self.target, channel_credentials(tls), options=list(options)
            )
        self._stubs = {name: make(self.channel) for name, make in _SERVICES.items()}

    async def close(self) -> None:
        await self.channel.close()

    def _callable(self, service: str, method: str) -> Any:
        return getattr(self._stubs[service], method)

    async def unary(
        self,
        service: str,
        method: str,
        request: Message,
        answer: type[R],
        *,
        call_timeout: float | None = None,
    ) -> R:
        """Call a unary RPC answering ``answer``, retrying under the module's rule.

        Raises:
            AgentrtError: the typed exception of the final failure (:mod:`agentrt_sdk.errors`).
        """
        call = self._callable(service, method)
        retry_ok = repeatable(method, request)
        metadata = outgoing_metadata(self._metadata)
        result = await self._with_retries(
            method,
            retry_ok,
            lambda: call(request, timeout=call_timeout or self.timeout, metadata=metadata),
        )
        return cast(R, result)

    async def stream_in(
        self,
        service: str,
        method: str,
        requests: Callable[[], Sequence[Message]],
        answer: type[R],
        *,
        call_timeout: float | None = None,
    ) -> R:
        """Call a client-streaming RPC; ``requests`` makes the messages anew for each try."""
        call = self._callable(service, method)
        metadata = outgoing_metadata(self._metadata)
        result = await self._with_retries(
            method,
            method in IDEMPOTENT,
            lambda: call(iter(requests()), timeout=call_timeout or self.timeout, metadata=metadata),
        )
        return cast(R, result)

    async def stream_out(
        self, service: str, method: str, request: Message, *, call_timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """Iterate a server-streaming RPC once (no retries: a resuming stream knows its
        cursor and reconnects itself, as :mod:`agentrt_sdk.watch` does)."""
        call = self._callable(service, method)(
            request, timeout=call_timeout, metadata=outgoing_metadata(self._metadata)
        )
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise await self._final_error(exc, method) from None
        finally:
            call.cancel()

    async def _final_error(self, exc: grpc.aio.AioRpcError, method: str) -> errors.AgentrtError:
        """The exception a call that will not be tried again raises: a plaintext channel's
        UNAVAILABLE says so when the server speaks TLS (gRPC says only "Socket closed")."""
        if self._plaintext and exc.code() == grpc.StatusCode.UNAVAILABLE:
            hint = await asyncio.to_thread(plaintext_failure_hint, self.target)
            return errors.from_rpc_error(exc, method, note=hint)
        return errors.from_rpc_error(exc, method)

    async def _with_retries(
        self, method: str, retry_ok: bool, send: Callable[[], Awaitable[Any]]
    ) -> Any:
        tries = self.retry.attempts if retry_ok else 1
        for attempt in range(tries):
            try:
                return await send()
            except grpc.aio.AioRpcError as exc:
                error = errors.from_rpc_error(exc, method)
                if attempt + 1 >= tries or not is_retryable(error):
                    raise await self._final_error(exc, method) from None
                floor = getattr(error, "retry_delay", None)
                await asyncio.sleep(self.retry.delay(attempt, floor))
        raise AssertionError("unreachable: the last try returns or raises")
