"""Which bucket of a histogram a value is counted in: the one rule for the Prometheus
histograms (``agentrt_base.metrics``) and the OTLP ones (``agentrt_base.span_export``).

Both formats mean the same by a bucket's bound: bucket ``i`` holds the values above
``bounds[i - 1]`` up to and including ``bounds[i]`` (Prometheus's ``le``; OTLP's
``explicit_bounds``), and one bucket past the last bound holds the rest.
"""

from __future__ import annotations

import bisect


def bucket_of(bounds: tuple[float, ...], value: float) -> int:
    """The index of the bucket ``value`` is counted in, for the sorted ``bounds``."""
    return bisect.bisect_left(bounds, value)
