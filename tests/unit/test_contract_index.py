"""The contract tests are complete: every sentence of the protos' comments that states a
default, lists errors or says which status a run takes is checked by a test of
tests/service/test_contract_sentences.py, and every sentence those tests name is still in
the protos, word for word."""

from __future__ import annotations

import re

from tests import proto_comments
from tests.service.test_contract_sentences import INDEX

#: What makes a sentence a promise the tests must hold the server to.
_DEFAULT = re.compile(r"\bdefaults?\b", re.IGNORECASE)
_ERRORS = re.compile(r"\bErrors\b")
_STATE = re.compile(r"\b(?:becomes?|leaves|re-queued)\b")


def promises() -> set[tuple[str, str]]:
    """(proto file, sentence) for every sentence that states a default or errors (any
    comment), or a status a run or an attempt takes (an RPC's comment). A sentence a file
    says in several places (``Errors: NOT_FOUND.``) is one promise: its test checks each."""
    found = set()
    for element in proto_comments.elements():
        for text in proto_comments.sentences(element.comment):
            if (
                _DEFAULT.search(text)
                or _ERRORS.search(text)
                or (element.kind == "rpc" and _STATE.search(text))
            ):
                found.add((element.file, text))
    return found


def test_the_scan_finds_the_kinds_of_promise() -> None:
    texts = {text for _, text in promises()}
    assert "0 means the server default (3)." in texts
    assert "Errors: NOT_FOUND." in texts
    assert "A run without an active attempt becomes CANCELLED at once." in texts


def test_every_promise_has_a_contract_test() -> None:
    untested = sorted(promises() - set(INDEX.values()))
    assert untested == []


def test_every_contract_test_names_a_sentence_of_the_protos() -> None:
    stale = sorted(set(INDEX.values()) - promises())
    assert stale == []
