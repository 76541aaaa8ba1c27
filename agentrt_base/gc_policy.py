"""The garbage-collector policy of a long-running agentrt process (the server, its step writer).

Everything allocated at start-up (modules, protos, caches' scaffolding) lives for the process:
it is moved out of the collector's view, and the young generation is collected less eagerly.
A request allocates many short-lived objects (messages, rows, dicts) and frees nearly all of
them by reference counting; with CPython's default threshold (700 allocations) the collector
ran several times per request. Measured: a large answer (an audit provenance of thousands of
objects) no longer triggers full collections mid-request, and the step writer's CPU per step
fell by ~14% (``bench/results/steps.md``).
"""

from __future__ import annotations

import gc


def settle_long_lived() -> None:
    """Call once start-up is done."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
