"""The lookup the permission check uses (``agentrt_base.access.Authorizer``): which namespace
(and agent) a thread, run, step, artifact or attempt belongs to.

Those facts never change once the row exists (a thread's namespace is set at creation, a run
copies it and is bound to one agent for good), so answers are kept: a worker's every fenced
call asks about the same attempt, and after the first time it costs no read. An id that is
not found is not kept (it may be created the next moment)."""

from __future__ import annotations

from agentrt_base.access import Kind, Resource
from agentrt_core.lru import LruCache
from runtime_service.services.context import Runtime
from runtime_service.store import resources


class ResourceLookup:
    def __init__(self, runtime: Runtime, size: int = 65536) -> None:
        self._rt = runtime
        self._known: LruCache[tuple[Kind, str], Resource] = LruCache(size)

    async def __call__(self, kind: Kind, id_: str) -> Resource | None:
        key = (kind, id_)
        found = self._known.get(key)
        if found is None:
            found = await self._rt.read(lambda session: resources.find(session, kind, id_))
            if found is not None:
                self._known.put(key, found)
        return found
