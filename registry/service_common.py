"""What the registry's use cases share: pages, who publishes, the checks of a request's
common fields, and a write retried after a lost unique-key race."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.orm import Session

from agentrt_base.auth import CALLER, caller_name
from agentrt_base.db import Database
from agentrt_core import content_limits, refs
from agentrt_core.errors import Aborted, ViolationCollector
from agentrt_core.model import Provenance, VerifiedProvenance
from registry import store

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


@dataclass(frozen=True)
class Publisher:
    """Who a publish is recorded as: the authenticated principal, and what its OIDC token
    proved (None unless it authenticated with one)."""

    principal: str
    verified: VerifiedProvenance | None

    @classmethod
    def of_caller(cls) -> Publisher:
        """The caller of the call being served; read on the loop, before the write runs on
        the writer's thread (which does not see the call's context)."""
        caller = CALLER.get()
        verified = (
            VerifiedProvenance(caller.claims)
            if caller is not None and caller.method == "oidc"
            else None
        )
        return cls(caller_name(), verified)


def check_provenance(provenance: Provenance, problems: ViolationCollector) -> None:
    for key in ("publisher", "source_repo", "commit", "pipeline_url"):
        if len(getattr(provenance, key)) > content_limits.MAX_PROVENANCE_FIELD_CHARS:
            problems.add(f"provenance.{key}", "too long")
    if len(provenance.labels) > content_limits.MAX_PROVENANCE_LABELS:
        problems.add(
            "provenance.labels", f"more than {content_limits.MAX_PROVENANCE_LABELS} labels"
        )
    for key, value in provenance.labels.items():
        if len(key) > 256 or len(value) > content_limits.MAX_PROVENANCE_FIELD_CHARS:
            problems.add(f"provenance.labels[{key[:40]}]", "too long")


def check_request_id(request_id: str, problems: ViolationCollector) -> None:
    if len(request_id) > 128:
        problems.add("request_id", "at most 128 characters")


def digest_field(value: str, field_path: str, problems: ViolationCollector) -> None:
    if not refs.is_digest(value):
        problems.add(
            field_path, f"{value!r} is not a digest: expected 'sha256:' and 64 lowercase hex digits"
        )


#: How many unique-key races one write may lose before its last try (see write_retrying).
_PUBLISH_RACES = 3


async def write_retrying(
    database: Database, fn: Callable[[Session], T], *, conflict_is_abort: bool = False
) -> T:
    """Run a write; on a unique-key race (two replicas inserting the same key at once on
    PostgreSQL) run it again, when it will see the winner's row. Tag moves instead answer
    ABORTED, so the caller re-reads before deciding again.

    A publish inserts up to three keys others may insert too (the agent row, an inline
    prompt, the version), and each lost race is to a committed row the next run sees, so it
    can lose at most that many times in a row; a fourth loss is a bug (INTERNAL)."""
    for _ in range(_PUBLISH_RACES):
        try:
            result: T = await database.write(fn)
            return result
        except store.KeyRace as exc:
            if conflict_is_abort:
                raise Aborted("a concurrent change won the race; re-read and retry") from exc
    retried: T = await database.write(fn)
    return retried
