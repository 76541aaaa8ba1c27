"""The health watcher's probe (runtime_service/health.py): a probe that fails after its wait
timed out is the watcher's answer, never an exception asyncio logs as "never retrieved" (CI
under load once failed on that log line, in test_a_frozen_database_bounds_step_calls_too)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Any

import pytest
from grpc_health.v1 import health

from runtime_service.health import DatabaseHealth


class _SlowFailingDatabase:
    """A probe that outlives the watcher's wait, then fails."""

    def __init__(self) -> None:
        self.on_failure: Any = None
        self.release = threading.Event()

    def probe(self) -> None:
        self.release.wait(5)
        raise OSError("database is locked")


def test_a_probe_that_fails_after_its_wait_is_retrieved(caplog: pytest.LogCaptureFixture) -> None:
    database = _SlowFailingDatabase()

    async def scenario() -> bool:
        watcher = DatabaseHealth(
            database,  # type: ignore[arg-type]
            health.aio.HealthServicer(),
            ["agentrt.test.v1.Service"],
            interval=60,
            timeout=0.05,
        )
        await watcher._check()  # the wait times out: NOT_SERVING
        serving = watcher.serving
        database.release.set()  # now the probe fails, with nobody awaiting it
        probe = watcher._probe
        assert probe is not None
        # Wait for it to end without awaiting it (awaiting would retrieve its exception).
        await asyncio.wait([probe])
        watcher._probe = None  # what the next check does: start another, drop this one
        del probe
        return serving

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert asyncio.run(scenario()) is False
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
