"""A thin synchronous facade over :class:`AgentrtClient` for scripts and REPLs.

It runs one private event loop on a background thread and forwards every call to the async
client there, so the two cannot drift: there is one implementation of each call. Iterators
(watching) are forwarded one item at a time.

    with Client() as client:
        run = client.runs.get("run_...")
        for event in client.watch_run(run.id):
            ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from agentrt_sdk.client import AgentrtClient

T = TypeVar("T")


class _Loop:
    """An event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _Group:
    """Forwards attribute access to an async API group, running each coroutine on the loop."""

    def __init__(self, loop: _Loop, target: Any) -> None:
        self._loop = loop
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(attribute(*args, **kwargs))

        return call


class Client:
    """The synchronous client: the same groups and arguments as :class:`AgentrtClient`
    (``registry``, ``threads``, ``runs``, ``blobs``, ``audit``), answering plainly instead
    of with awaitables."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = _Loop()

        async def make() -> AgentrtClient:
            return AgentrtClient(*args, **kwargs)

        self.aio = self._loop.run(make())
        self.registry: Any = _Group(self._loop, self.aio.registry)
        self.threads: Any = _Group(self._loop, self.aio.threads)
        self.runs: Any = _Group(self._loop, self.aio.runs)
        self.blobs: Any = _Group(self._loop, self.aio.blobs)
        self.audit: Any = _Group(self._loop, self.aio.audit)

    def _iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make()
        try:
            while True:
                try:
                    yield self._loop.run(iterator.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._loop.run(iterator.aclose())  # type: ignore[attr-defined]

    def watch_run(self, run_id: str, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(lambda: self.aio.watch_run(run_id, **kwargs))

    def watch_thread(self, thread_id: str, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(lambda: self.aio.watch_thread(thread_id, **kwargs))

    def close(self) -> None:
        self._loop.run(self.aio.close())
        self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
