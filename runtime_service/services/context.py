"""What every runtime use case needs: the database, the notifier, the runtime's settings,
and the one way to write (commit, then wake whoever waits on what changed)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.orm import Session

from agentrt_base.db import Database
from agentrt_base.raw import RawTx
from runtime_service import notify
from runtime_service.notify import Notifier
from runtime_service.observations import OBSERVED, Observation, Observer, RunMoved
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.store.blobs import Upload

T = TypeVar("T")


@dataclass
class Runtime:
    database: Database
    notifier: Notifier
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Told what each committed write did (``runtime_service.observations``); None: nobody.
    observer: Observer | None = None
    #: Told the id of each run a committed write ended (the run attester), apart from the
    #: observer: a step's write tells the observer of the step, which this needs not.
    run_ended: Callable[[str], None] | None = None
    #: The uploads this server is receiving (PutBlob), not yet stored: the metrics' staged
    #: bytes.
    uploads: set[Upload] = field(default_factory=set)
    #: The server emits spans (``agentrt_base.tracing``): an attempt of a run created outside
    #: any trace starts a trace of its own.
    traces: bool = False

    async def write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one write transaction; after it commits, wake the keys it touched.

        The wake-up happens only after commit, so a woken waiter always finds what woke it.
        """
        keys: list[str] = []
        observed: list[Observation] = []

        def run(session: Session) -> T:
            session.info[notify.WAKE] = keys
            if self.observer is not None or self.run_ended is not None:
                session.info[OBSERVED] = observed
            result = fn(session)
            notify.notify_in_transaction(session.connection(), keys, self.notifier.origin)
            return result

        result = await self.database.write(run)
        self.notifier.wake(keys)
        if observed:
            if self.observer is not None:
                self.observer.observed(observed)
            if self.run_ended is not None:
                for o in observed:
                    if isinstance(o, RunMoved) and o.ended:
                        self.run_ended(o.run_id)
        return result

    async def write_raw(self, fn: Callable[[RawTx], T]) -> T:
        """:meth:`write` for a job written in plain SQL (the step path); ``fn`` names what to
        wake in ``tx.wake``."""

        keys: list[str] = []

        def run(tx: RawTx) -> T:
            result = fn(tx)
            notify.notify_raw(tx, tx.wake, self.notifier.origin)
            keys.extend(tx.wake)
            return result

        result = await self.database.write_raw(run)
        self.notifier.wake(keys)
        return result

    async def read(self, fn: Callable[[Session], T]) -> T:
        return await self.database.read(fn)


def scoped_request_id(scope: str, request_id: str) -> str | None:
    """How a ``request_id`` is stored: hashed together with what it is scoped to (a thread,
    run or attempt), because the stored column is unique over the whole table while the
    contract makes a request id unique only within its parent (AIP-155)."""
    if not request_id:
        return None
    return "sha256:" + hashlib.sha256(f"{scope}\0{request_id}".encode()).hexdigest()
