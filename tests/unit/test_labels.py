"""The one rule for a label map (runtime_service/labels.py)."""

from __future__ import annotations

import pytest

from agentrt_core.errors import InvalidArgument, ViolationCollector
from runtime_service import labels


def violations(value: dict[str, str]) -> list[str]:
    problems = ViolationCollector()
    labels.check("labels", value, problems)
    with pytest.raises(InvalidArgument) as raised:
        problems.raise_if_any("invalid")
    return [v.field for v in raised.value.violations]


def test_words_and_any_unicode_are_labels() -> None:
    problems = ViolationCollector()
    labels.check("labels", {"kind": "src", "Language": "python", "étape": "2 of 3"}, problems)
    problems.raise_if_any("invalid")  # nothing to raise


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"": "x"}, 'labels[""]'),
        ({"a b": "x"}, 'labels["a b"]'),
        ({"a\nb": "x"}, 'labels["a\\nb"]'),
        ({"a\tb": "x"}, 'labels["a\\tb"]'),
        ({"k" * 129: "x"}, f'labels["{"k" * 129}"]'),
        ({"k": "one\ntwo"}, 'labels["k"]'),
        ({"k": "nul\x00"}, 'labels["k"]'),
        ({"k": "v" * 1025}, 'labels["k"]'),
    ],
)
def test_a_bad_key_or_value_is_named(value: dict[str, str], field: str) -> None:
    assert violations(value) == [field]


def test_too_many_entries_or_bytes() -> None:
    assert violations({f"k{i}": "v" for i in range(65)}) == ["labels"]
    # 64 entries within the per-key and per-value limits, in 4-byte characters: 288 KB.
    wide = {"\U0001f600" * 100 + str(i): "\U0001f600" * 1024 for i in range(64)}
    assert violations(wide) == ["labels"]
