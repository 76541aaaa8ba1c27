"""The event hash chain of a thread or a run, verified link by link; pure.

Every event's hash covers the previous event's hash (:func:`runtime_service.events.event_hash`),
so a chain verifies when each link recomputes, follows its predecessor and the last one is
the head its owner (the run or thread row) records. ``VerifyRun`` calls :func:`verify_chain`
on the stored events, and the offline bundle verifier (:mod:`agentrt_core.audit_bundle`)
on a bundle's, so both answer with the same code. ``docs/audit.md`` describes the checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentrt_core.event_chain import StoredEvent, event_hash, format_time

__all__ = ["ChainBreak", "ChainReport", "Link", "verify_chain"]


@dataclass(frozen=True)
class Link:
    """One event as its hash covers it (``event_time`` already in its hashed spelling).

    ``problem`` is set when the stored row could not even be read as an event (attributes
    that are not JSON); such a link is reported as the break without hashing it.
    """

    id: str
    thread_id: str
    run_id: str
    sequence: int
    event_type: str
    event_time: str
    attributes: Any
    prev_hash: str
    hash: str
    problem: str = ""

    @classmethod
    def from_stored(cls, event: StoredEvent) -> Link:
        return cls(
            event.id,
            event.thread_id,
            event.run_id,
            event.sequence,
            event.event_type,
            format_time(event.event_time),
            event.attributes,
            event.prev_hash,
            event.hash,
        )

    def recomputed_hash(self) -> str:
        return event_hash(
            event_id=self.id,
            thread_id=self.thread_id,
            run_id=self.run_id,
            sequence=self.sequence,
            event_type=self.event_type,
            event_time=self.event_time,
            attributes=self.attributes,
            prev_hash=self.prev_hash,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "sequence": self.sequence,
            "event_type": self.event_type,
            "event_time": self.event_time,
            "attributes": self.attributes,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


@dataclass(frozen=True)
class ChainBreak:
    """The first link that does not verify (see ``agentrt.audit.v1.ChainBreak``)."""

    sequence: int
    expected_hash: str
    found_hash: str
    reason: str


@dataclass(frozen=True)
class ChainReport:
    intact: bool
    event_count: int
    #: Hash of the last event that verified (the head when intact).
    head_hash: str
    first_break: ChainBreak | None = None


def verify_chain(
    links: Iterable[Link],
    *,
    head: tuple[int, str] | None = None,
    chain: tuple[str, str] | None = None,
) -> ChainReport:
    """Recompute a chain link by link and stop at the first that does not verify.

    Args:
        links: The chain's events, in stored sequence order.
        head: ``(last_sequence, last_hash)`` as the chain's owner recorded it. Deleting events
            at the end of a chain leaves every remaining link valid; only the owner's record
            of its head shows they are gone.
        chain: ``(thread_id, run_id)`` every event must belong to (events copied in from
            another run hash correctly on their own, so this is checked separately).

    Returns:
        The report; ``first_break`` names the sequence, the expected and the found hash, and
        why: a changed event (hash mismatch), a replaced or reordered one (prev_hash does not
        match), a deleted one (sequence gap), or a truncated chain (head not reached).
    """
    last_sequence, last_hash, count = 0, "", 0

    def broken(sequence: int, expected: str, found: str, reason: str) -> ChainReport:
        return ChainReport(False, count, last_hash, ChainBreak(sequence, expected, found, reason))

    for link in links:
        if link.problem:
            return broken(link.sequence, "", link.hash, link.problem)
        if chain is not None and (link.thread_id, link.run_id) != chain:
            return broken(
                link.sequence,
                "",
                link.hash,
                f"event {link.id} belongs to chain {link.thread_id}/{link.run_id or '-'}, "
                f"not {chain[0]}/{chain[1] or '-'}",
            )
        if link.sequence != last_sequence + 1:
            if link.sequence > last_sequence + 1:
                reason = (
                    f"sequence gap after {last_sequence}: the next event is {link.sequence}"
                    if last_sequence
                    else f"the chain starts at sequence {link.sequence}, not 1"
                )
            else:
                reason = f"sequence {link.sequence} repeats or goes back after {last_sequence}"
            return broken(link.sequence, last_hash, link.prev_hash, reason)
        if link.prev_hash != last_hash:
            return broken(
                link.sequence,
                last_hash,
                link.prev_hash,
                "prev_hash does not match the previous event's hash "
                "(an event before it was replaced or rewritten)",
            )
        recomputed = link.recomputed_hash()
        if recomputed != link.hash:
            return broken(
                link.sequence,
                recomputed,
                link.hash,
                f"hash mismatch: event {link.id} ({link.event_type}) was changed after it was "
                "written",
            )
        last_sequence, last_hash, count = link.sequence, link.hash, count + 1
    if head is not None:
        head_sequence, head_hash = head
        if last_sequence < head_sequence:
            return broken(
                last_sequence + 1,
                head_hash if last_sequence + 1 == head_sequence else "",
                "",
                f"the chain ends at sequence {last_sequence} but its owner records "
                f"{head_sequence} events: events are missing at the end",
            )
        if last_sequence > head_sequence:
            return broken(
                head_sequence + 1,
                "",
                "",
                f"the chain goes on past sequence {head_sequence}, the head its owner records",
            )
        if last_hash != head_hash:
            return broken(
                last_sequence,
                head_hash,
                last_hash,
                "the last event's hash is not the head hash its owner records",
            )
    return ChainReport(True, count, last_hash)
