"""What a runs list may be narrowed to (ListRuns's filters, a saved view's query), and the one
check of them: both ask it, so a view saved is a list that can be asked for."""

from __future__ import annotations

from agentrt_core.errors import InvalidArgument
from agentrt_core.refs import is_digest, is_valid_tag
from runtime_service.store.runs import RunFilter

__all__ = ["RunFilter", "check_run_filter"]


def check_run_filter(where: RunFilter, prefix: str = "") -> None:
    """Refuse a runs filter no run could match (ListRuns's, and a saved view's query, whose
    fields are under ``prefix``): a digest or tag that is not one, a time range that ends
    before it starts."""
    if where.agent_digest and not is_digest(where.agent_digest):
        raise InvalidArgument.for_field(
            prefix + "agent_digest",
            f"{where.agent_digest!r} is not a digest: expected 'sha256:' and 64 lowercase"
            " hex digits",
        )
    if where.agent_tag and not is_valid_tag(where.agent_tag):
        raise InvalidArgument.for_field(prefix + "agent_tag", f"{where.agent_tag!r} is not a tag")
    start, end = where.created_from, where.created_before
    if start is not None and end is not None and start >= end:
        raise InvalidArgument.for_field(
            prefix + "create_time_end", "must be after create_time_start"
        )
