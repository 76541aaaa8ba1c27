"""``event_chain.event_hash`` writes the event document's JCS bytes itself (the attributes' JCS
bytes, then the other members in key order): it must be exactly SHA-256 of the document's
JCS form as ``agentrt_core.jcs`` makes it, whatever the strings hold."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt_core import event_chain, jcs

# Any text JSON can carry (no lone surrogates), with quotes, backslashes and controls likely.
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\/\b\f\n\r\t\x00\x1f\x7f é€😀'),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=20,
)
ATTRIBUTES = st.dictionaries(
    TEXT,
    st.one_of(TEXT, st.integers(-(2**53) + 1, 2**53 - 1), st.booleans(), st.none()),
    max_size=5,
)


def reference(**members: Any) -> str:
    document = {
        "attributes": members["attributes"],
        "event_time": members["event_time"],
        "event_type": members["event_type"],
        "id": members["event_id"],
        "prev_hash": members["prev_hash"],
        "run_id": members["run_id"],
        "sequence": members["sequence"],
        "thread_id": members["thread_id"],
        "type": "agentrt.event.v1",
    }
    return jcs.digest_bytes(jcs.canonical_bytes(document))


@given(
    attributes=ATTRIBUTES,
    strings=st.tuples(TEXT, TEXT, TEXT, TEXT, TEXT, TEXT),
    sequence=st.integers(0, 2**53 - 1),
)
def test_the_hash_is_the_jcs_documents(
    attributes: dict[str, Any], strings: tuple[str, ...], sequence: int
) -> None:
    event_id, thread_id, run_id, event_type, event_time, prev_hash = strings
    members = {
        "event_id": event_id,
        "thread_id": thread_id,
        "run_id": run_id,
        "sequence": sequence,
        "event_type": event_type,
        "event_time": event_time,
        "attributes": attributes,
        "prev_hash": prev_hash,
    }
    assert event_chain.event_hash(**members) == reference(**members)


def test_a_sequence_outside_the_exact_range_is_refused() -> None:
    with pytest.raises(ValueError, match="sequence"):
        event_chain.event_hash(
            event_id="evt_1",
            thread_id="thr_1",
            run_id="",
            sequence=2**53,
            event_type="run.created",
            event_time="2026-11-29T12:00:00.000000Z",
            attributes={},
            prev_hash="",
        )
