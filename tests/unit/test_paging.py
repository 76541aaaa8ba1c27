"""Keyset page tokens (AIP-158): a page cut from ``size + 1`` rows, and its token round trip."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrt_core.errors import InvalidArgument
from agentrt_core.paging import cut_page, next_page_token, page_request

FILTERS = {"run_id": "run_1"}


def test_a_short_read_is_the_last_page() -> None:
    assert cut_page([1, 2, 3], 3, FILTERS, lambda r: [r]) == ([1, 2, 3], "")
    assert cut_page([], 3, FILTERS, lambda r: [r]) == ([], "")


def test_one_row_more_than_the_page_gives_a_token_after_the_last_row_kept() -> None:
    rows, token = cut_page([10, 20, 30, 40], 3, FILTERS, lambda r: [r, f"k{r}"])
    assert rows == [10, 20, 30] and token
    assert page_request(0, token, FILTERS, key=(int, str)).after == [30, "k30"]


def test_a_token_is_refused_for_other_filters_or_when_forged() -> None:
    _, token = cut_page([1, 2], 1, FILTERS, lambda r: [r])
    with pytest.raises(InvalidArgument):
        page_request(0, token, {"run_id": "run_2"}, key=(int,))
    with pytest.raises(InvalidArgument):
        page_request(0, "not-a-token", FILTERS, key=(int,))


def test_a_position_must_have_the_lists_key_shape() -> None:
    moment = dt.datetime(2026, 12, 1, 13, 0, tzinfo=dt.UTC)
    _, token = cut_page([1, 2], 1, FILTERS, lambda r: [moment, "id", r])
    shape = (dt.datetime, str, int)
    assert page_request(0, token, FILTERS, key=shape).after == [moment, "id", 1]
    for other in ((dt.datetime, str, str), (dt.datetime, str), (dt.datetime, str, int, int)):
        if other != shape:
            with pytest.raises(InvalidArgument):
                page_request(0, token, FILTERS, key=other)
    for position in ([True], [1 << 63], [-(1 << 63) - 1], [1.5], ["1"], [None]):
        with pytest.raises(InvalidArgument):
            page_request(0, next_page_token(position, FILTERS), FILTERS, key=(int,))
    for text in ("a\0b", "x" * 2000):
        with pytest.raises(InvalidArgument):
            page_request(0, next_page_token([text], FILTERS), FILTERS, key=(str,))
    with pytest.raises(InvalidArgument):
        page_request(0, next_page_token(["yesterday"], FILTERS), FILTERS, key=(dt.datetime,))
