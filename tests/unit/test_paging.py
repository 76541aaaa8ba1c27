"""Keyset page tokens (AIP-158): a page cut from ``size + 1`` rows, and its token round trip."""

from __future__ import annotations

import pytest

from agentrt_base.errors import InvalidArgument
from agentrt_base.paging import cut_page, page_request

FILTERS = {"run_id": "run_1"}


def test_a_short_read_is_the_last_page() -> None:
    assert cut_page([1, 2, 3], 3, FILTERS, lambda r: [r]) == ([1, 2, 3], "")
    assert cut_page([], 3, FILTERS, lambda r: [r]) == ([], "")


def test_one_row_more_than_the_page_gives_a_token_after_the_last_row_kept() -> None:
    rows, token = cut_page([10, 20, 30, 40], 3, FILTERS, lambda r: [r, f"k{r}"])
    assert rows == [10, 20, 30] and token
    assert page_request(0, token, FILTERS).after == [30, "k30"]


def test_a_token_is_refused_for_other_filters_or_when_forged() -> None:
    _, token = cut_page([1, 2], 1, FILTERS, lambda r: [r])
    with pytest.raises(InvalidArgument):
        page_request(0, token, {"run_id": "run_2"})
    with pytest.raises(InvalidArgument):
        page_request(0, "not-a-token", FILTERS)
