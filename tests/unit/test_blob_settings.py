"""The blob limits an operator sets: flag over environment over the runtime's defaults."""

from __future__ import annotations

import pytest

from agentrt_base.settings import ServerSettings
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.server import runtime_settings
from runtime_service.services.blobs import UploadPace


def resolve(env: dict[str, str], **flags: int | None) -> ServerSettings:
    return ServerSettings.resolve(listen=None, database_url=None, environ=env, **flags)


def test_defaults_are_the_runtimes() -> None:
    runtime = runtime_settings(resolve({}))
    assert runtime.max_blob_bytes == RuntimeSettings().max_blob_bytes == 64 * 1024 * 1024
    assert runtime.blob_quota_bytes == RuntimeSettings().blob_quota_bytes == 10 * 1024**3


def test_the_environment_sets_them_and_a_flag_wins() -> None:
    env = {"AGENTRT_MAX_BLOB_BYTES": "1000", "AGENTRT_BLOB_QUOTA_BYTES": " 5000 "}
    runtime = runtime_settings(resolve(env))
    assert (runtime.max_blob_bytes, runtime.blob_quota_bytes) == (1000, 5000)
    runtime = runtime_settings(resolve(env, max_blob_bytes=7, blob_quota_bytes=0))
    assert (runtime.max_blob_bytes, runtime.blob_quota_bytes) == (7, 0)


@pytest.mark.parametrize("value", ["64MiB", "1e6", "-1"])
def test_a_malformed_value_is_one_line(value: str) -> None:
    with pytest.raises(ValueError, match="AGENTRT_BLOB_QUOTA_BYTES") as info:
        resolve({"AGENTRT_BLOB_QUOTA_BYTES": value})
    assert "\n" not in str(info.value)


def test_the_upload_rate_is_a_setting() -> None:
    assert runtime_settings(resolve({})).blob_upload_rate == 32 * 1024 * 1024
    env = {"AGENTRT_BLOB_UPLOAD_BYTES_PER_SECOND": "1000"}
    assert runtime_settings(resolve(env)).blob_upload_rate == 1000
    assert runtime_settings(resolve(env, blob_upload_rate=0)).blob_upload_rate == 0


def test_uploads_together_keep_to_the_pace_after_a_burst() -> None:
    now = [100.0]
    mib = 1024 * 1024
    pace = UploadPace(rate=10 * mib, burst=4 * mib, clock=lambda: now[0])
    # The first 4 MiB go at once, then each MiB waits its tenth of a second: two uploads
    # taking turns share one schedule.
    waits = [pace.delay(mib) for _ in range(8)]
    assert waits[:4] == [0.0] * 4
    assert waits[4:] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    now[0] += 60  # idle: the credit refills, but only to a burst
    assert [pace.delay(mib) for _ in range(5)] == pytest.approx([0, 0, 0, 0, 0.1])
    assert UploadPace(rate=0).delay(10**9) == 0.0  # no limit
