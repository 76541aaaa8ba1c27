"""The worker loop: acquire runs under leases, keep the leases alive, run the agent logic,
and finish each attempt with the outcome the logic reached.

The user writes one function, ``async def agent(attempt: Attempt) -> Result | str | None``,
using ``attempt.generate(...)``, ``attempt.tool(...)``, ``attempt.check(...)``,
``attempt.checkpoint()`` and ``attempt.artifact(...)`` (:mod:`agentrt_sdk.attempt`); the
:class:`Worker` does the protocol around it (docs/worker-guide.md):

- ``AcquireRun`` long-polls, ``concurrency`` runs at a time;
- a heartbeat every third of the lease TTL renews the lease and reads the run's control
  flags: a cancel stops the logic and finishes the attempt CANCELLED, a pause finishes it
  PAUSED, a lost lease stops it without another write (the fence is dead);
- the attempt's turn is opened before the logic runs and ended after; if inputs arrived
  meanwhile (follow-ups) the runtime opens the next turn and the logic runs again for it;
- a tool call waiting for approval finishes the attempt WAITING_APPROVAL; the run continues
  in a new attempt once it is decided, replaying the logic from its last checkpoint;
- an exception from the logic finishes the attempt FAILED_RETRYABLE (the run's
  ``max_attempts`` decides whether another attempt follows), a ``ModelError`` that cannot be
  retried or a policy without a model candidate left FAILED_PERMANENT.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import duration_pb2

from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_sdk import errors
from agentrt_sdk.attempt import ApprovalPending, Attempt, AttemptStopped
from agentrt_sdk.client import AgentrtClient
from agentrt_sdk.models.base import ModelAdapter, ModelError
from agentrt_sdk.retry import ModelRetryPolicy
from agentrt_sdk.tracing import TracerProvider, attempt_span, tracer_for

__all__ = ["AgentFunction", "Result", "ToolFunction", "Worker"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What the agent logic hands back when the run's work is done.

    Attributes:
        summary: short, for humans (``Run.result_summary``).
        output: the result, JSON-serialisable; stored as a blob (``Run.output_ref``).
    """

    summary: str = ""
    output: Any = None


AgentFunction = Callable[[Attempt], Coroutine[Any, Any, "Result | str | None"]]
ToolFunction = Callable[[dict[str, Any]], Awaitable[Any]]

_CANCEL, _PAUSE, _LEASE_LOST = "cancel requested", "pause requested", "lease lost"


def _duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


class Worker:
    """Runs ``agent`` for every run it acquires.

    Args:
        client: the connection (its credentials are the worker's principal).
        agent: the agent logic.
        model: the model adapter model calls go to (``ProviderRouter`` for several providers).
        tools: the function for each tool name the logic calls with ``attempt.tool``.
        worker_id: a label for this process (default ``host/pid``).
        concurrency: runs worked on at once.
        lease_ttl: seconds a lease lasts without a heartbeat (heartbeats every third).
        poll_wait: seconds one AcquireRun waits for work.
        agent_ids: only runs of these agents (default: any the caller may work on).
        labels: only runs with these labels.
        retry: how a failed model call is retried, and when the worker gives up on it
            (default :class:`~agentrt_sdk.retry.ModelRetryPolicy`'s).
        tracer_provider: the OpenTelemetry tracer provider of the worker's spans (default
            the global one; without an OpenTelemetry SDK they are no-ops). Each attempt's
            span is a child of the span the server gave the attempt (``agentrt_sdk.tracing``).
    """

    def __init__(
        self,
        client: AgentrtClient,
        agent: AgentFunction,
        *,
        model: ModelAdapter | None = None,
        tools: Mapping[str, ToolFunction] | None = None,
        worker_id: str | None = None,
        concurrency: int = 1,
        lease_ttl: float = 30.0,
        poll_wait: float = 20.0,
        agent_ids: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        retry: ModelRetryPolicy | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.agent = agent
        self.model = model
        self.tools = dict(tools or {})
        self.worker_id = worker_id or f"{socket.gethostname()}/{os.getpid()}"
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_wait = poll_wait
        self.filter = message_pb2.AcquireFilter(agent_ids=list(agent_ids), labels=labels)
        self.retry = retry or ModelRetryPolicy()
        self.tracer = tracer_for(tracer_provider)
        self._handled = 0

    async def run(self, stop: asyncio.Event | None = None, max_runs: int | None = None) -> None:
        """Work until ``stop`` is set (or ``max_runs`` attempts were handled): each of
        ``concurrency`` slots acquires a run, works on it, and acquires the next."""
        stop = stop or asyncio.Event()

        async def slot() -> None:
            while not stop.is_set() and (max_runs is None or self._handled < max_runs):
                acquired = await self._acquire(stop)
                if acquired is not None:
                    self._handled += 1
                    await self.work(acquired)
            stop.set()  # one slot reaching max_runs stops the others' polling too

        await asyncio.gather(*(slot() for _ in range(self.concurrency)))

    async def _acquire(self, stop: asyncio.Event) -> wpb.AcquireRunResponse | None:
        request = wpb.AcquireRunRequest(
            worker_id=self.worker_id,
            filter=self.filter,
            lease_ttl=_duration(self.lease_ttl),
            wait=_duration(self.poll_wait),
        )
        poll = asyncio.ensure_future(
            self.client.connection.unary(
                "worker",
                "AcquireRun",
                request,
                wpb.AcquireRunResponse,
                call_timeout=self.poll_wait + 10,
            )
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The worker itself is cancelled (Ctrl-C): the poll goes with it now, while its
            # channel is open. Left to asyncio.run's final sweep, it would meet the channel
            # already closed, and could take that for an outage to retry with backoff.
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, errors.AgentrtError):
                await poll
            raise
        finally:
            stopped.cancel()
        if not poll.done():
            # Stopping: a run the server hands out now simply goes back to the queue when
            # its lease expires.
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, errors.AgentrtError):
                await poll
            return None
        try:
            response = poll.result()
        except (errors.UnavailableError, errors.RateLimitedError, errors.DeadlineExceededError):
            _log.info("acquire failed; polling again soon", exc_info=True)
            await asyncio.sleep(0.5)
            return None
        return response if response.HasField("run") else None

    async def work(self, acquired: wpb.AcquireRunResponse) -> None:
        """Run the agent logic for one acquired attempt and finish it."""
        attempt = Attempt(
            client=self.client,
            run=acquired.run,
            attempt=acquired.attempt,
            fence=acquired.fence,
            agent=acquired.agent,
            resume_from=acquired.resume_from if acquired.HasField("resume_from") else None,
            model=self.model,
            tools=self.tools,
            retry=self.retry,
            tracer=self.tracer,
        )
        label = f"run {acquired.run.id} attempt {acquired.attempt.number}"
        logic: asyncio.Task[Any] | None = None

        def stop(why: str) -> None:
            if not attempt.stop_reason:
                attempt.stop_reason = why
                _log.info("%s: %s", label, why)
            if logic is not None:
                logic.cancel()

        beat = asyncio.create_task(self._heartbeat(attempt, stop))
        # The attempt's work is a span of the run's trace (the heartbeat, started before it,
        # is not: a span per heartbeat would bury the steps).
        with attempt_span(self.tracer, acquired.run, acquired.attempt):
            try:
                await attempt._restore()
                begun = await attempt._worker(
                    "BeginTurn",
                    wpb.BeginTurnRequest(
                        fence=attempt.fence, request_id=f"{attempt.attempt.id}:turn"
                    ),
                    wpb.BeginTurnResponse,
                )
                attempt.turn_id, attempt.inputs = begun.turn.id, list(begun.delivered_inputs)
                while True:
                    logic = asyncio.create_task(self.agent(attempt))
                    outcome = await self._outcome(logic, attempt)
                    if outcome is not None:
                        await self._finish(attempt, *outcome)
                        return
                    result = logic.result()
                    ended = await attempt._worker(
                        "EndTurn",
                        wpb.EndTurnRequest(fence=attempt.fence, turn_id=attempt.turn_id),
                        wpb.EndTurnResponse,
                    )
                    if not ended.HasField("next_turn"):
                        await self._complete(attempt, result)
                        return
                    attempt.turn_id = ended.next_turn.id
                    attempt.inputs = list(ended.delivered_inputs)
            except errors.LeaseLostError as exc:
                _log.warning("%s: lease lost (%s); stopping without another write", label, exc)
            except errors.BudgetExceededError as exc:
                _log.warning("%s: budget exceeded (%s); the run has ended", label, exc)
            except errors.FailedStepLimitError as exc:
                _log.warning("%s: the runtime ended the attempt: %s", label, exc.message)
            except AttemptStopped as exc:
                if attempt.stop_reason != _LEASE_LOST:
                    _log.warning("%s: stopped: %s", label, exc)
            except errors.AgentrtError as exc:
                # The server refused or could not take a call of the protocol itself (after
                # the transport's retries): this attempt is left to its lease, which expires,
                # and the worker goes on with the next run.
                _log.error("%s: abandoned: %s", label, exc)
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _outcome(
        self, logic: asyncio.Task[Any], attempt: Attempt
    ) -> tuple[int, message_pb2.AttemptError | None] | None:
        """None when the logic returned; else the outcome to finish the attempt with."""
        try:
            await asyncio.wait({logic})  # never raises the task's own exception
        except asyncio.CancelledError:
            logic.cancel()  # the worker itself is stopping
            raise
        exc = None if logic.cancelled() else logic.exception()
        if exc is None and not logic.cancelled():
            return None
        why = attempt.stop_reason
        if why == _LEASE_LOST or isinstance(exc, errors.LeaseLostError):
            raise AttemptStopped(_LEASE_LOST)
        if why == _CANCEL:
            return enum_pb2.ATTEMPT_OUTCOME_CANCELLED, None
        # A pause or an approval wait writes no checkpoint of its own: the next attempt
        # replays from the last one the logic wrote (see agentrt_sdk.attempt).
        if why == _PAUSE:
            return enum_pb2.ATTEMPT_OUTCOME_PAUSED, None
        if isinstance(exc, ApprovalPending):
            return enum_pb2.ATTEMPT_OUTCOME_WAITING_APPROVAL, None
        if isinstance(exc, errors.BudgetExceededError | errors.FailedStepLimitError):
            raise exc  # the runtime has ended the run or the attempt: nothing to finish
        assert exc is not None, "a cancelled logic task always has a stop reason"
        return self._failure(exc)

    @staticmethod
    def _failure(exc: BaseException) -> tuple[int, message_pb2.AttemptError]:
        _log.error("the agent logic failed: %r", exc)
        permanent = (isinstance(exc, ModelError) and not exc.retryable) or isinstance(
            exc, errors.FailedPreconditionError | errors.InvalidArgumentError
        )
        error_class = (
            exc.error_class if isinstance(exc, ModelError) else enum_pb2.ERROR_CLASS_WORKER_ERROR
        )
        error = message_pb2.AttemptError(
            error_class=error_class,
            message=f"{type(exc).__name__}: {exc}"[:1000],
            retryable=not permanent,
        )
        outcome = (
            enum_pb2.ATTEMPT_OUTCOME_FAILED_PERMANENT
            if permanent
            else enum_pb2.ATTEMPT_OUTCOME_FAILED_RETRYABLE
        )
        return outcome, error

    async def _complete(self, attempt: Attempt, result: Result | str | None) -> None:
        if not isinstance(result, Result):
            result = Result(summary=result or "")
        output_ref = ""
        if result.output is not None:
            blob = await attempt.client.blobs.put(
                json.dumps(result.output, sort_keys=True).encode(),
                media_type="application/json",
                namespace=attempt.run.namespace,
            )
            output_ref = blob.digest
        await self._finish(
            attempt,
            enum_pb2.ATTEMPT_OUTCOME_SUCCEEDED_COMPLETE_RUN,
            None,
            summary=result.summary,
            output_ref=output_ref,
        )

    async def _finish(
        self,
        attempt: Attempt,
        outcome: int,
        error: message_pb2.AttemptError | None,
        *,
        summary: str = "",
        output_ref: str = "",
    ) -> None:
        request = wpb.FinishAttemptRequest(
            fence=attempt.fence,
            outcome=outcome,  # type: ignore[arg-type]
            error=error,
            result_summary=summary,
            output_ref=output_ref,
        )
        # Finishing with the same outcome is idempotent: the transport retries it.
        await attempt.client.connection.unary(
            "worker", "FinishAttempt", request, wpb.FinishAttemptResponse
        )

    async def _heartbeat(self, attempt: Attempt, stop: Callable[[str], None]) -> None:
        interval = self.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                beat = await attempt.client.connection.unary(
                    "worker",
                    "Heartbeat",
                    wpb.HeartbeatRequest(fence=attempt.fence),
                    wpb.HeartbeatResponse,
                    call_timeout=interval,
                )
            except errors.LeaseLostError:
                stop(_LEASE_LOST)
                return
            except errors.AgentrtError as exc:
                # Not an answer about the lease: try again at the next beat, while it lasts.
                _log.warning("heartbeat failed: %s", exc)
                continue
            if beat.cancel_requested:
                stop(_CANCEL)
            elif beat.pause_requested:
                stop(_PAUSE)
