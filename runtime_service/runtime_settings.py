"""The runtime's settings: leases, waits, attempts, blob limits. Plain values with their
defaults, apart from the services that use them (``runtime_service.services.context``) so
that ``agentrt serve --help`` can show the defaults without loading the database layer."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeSettings:
    default_lease_ttl: dt.timedelta = dt.timedelta(seconds=30)
    max_lease_ttl: dt.timedelta = dt.timedelta(minutes=10)
    min_lease_ttl: dt.timedelta = dt.timedelta(seconds=1)
    default_wait: dt.timedelta = dt.timedelta(seconds=30)
    max_wait: dt.timedelta = dt.timedelta(seconds=60)
    #: How long a worker has to acknowledge a cancel or pause before the runtime ends the
    #: attempt itself (and bumps the epoch so late writes bounce).
    stop_grace: dt.timedelta = dt.timedelta(seconds=10)
    #: How often the reaper looks for expired leases, stop deadlines and run deadlines.
    reaper_interval: float = 1.0
    default_max_attempts: int = 3
    #: PutBlob limits (``agentrt serve --max-blob-bytes / --blob-quota-bytes``): the largest
    #: blob, and the total size of every stored blob together (content stored once counts once).
    max_blob_bytes: int = 64 * 1024 * 1024
    blob_quota_bytes: int = 10 * 1024 * 1024 * 1024
    #: The blob bytes one namespace may hold (``--namespace-blob-quota-bytes``): every blob
    #: uploaded to it counts once, even if other namespaces hold the same content.
    namespace_blob_quota_bytes: int = 2 * 1024 * 1024 * 1024
    #: The bytes per second all uploads together may take (``--blob-upload-rate``; 0: no
    #: limit). Receiving costs the server CPU per MiB whatever else it does: unpaced, two
    #: uploads took most of it and step pairs/s fell to 0.36-0.49x on an idle 2-core machine
    #: (``bench/results/blob_fairness.md``).
    blob_upload_rate: int = 32 * 1024 * 1024
