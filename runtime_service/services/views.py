"""Saved views (SaveView, ListViews, DeleteView): a runs list's filters kept under a name by
the calling principal, for itself alone. Console state, not ledger: no event records them,
and the filters are checked as ListRuns checks them (:func:`check_run_filter`), so a view
saved is a list that can be asked for."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import unicodedata
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.orm import Session

from agentrt_base.auth import caller_name
from agentrt_base.db import utcnow
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.paging import cut_page, page_request
from runtime_service.services.context import Runtime
from runtime_service.services.run_filters import RunFilter, check_run_filter
from runtime_service.store import views
from runtime_service.store.tables import SavedViewRow

#: A view's name: what a person types into a form, short enough for a menu.
NAME_MAX: Final = 100


@dataclass(frozen=True)
class SavedView:
    name: str
    where: RunFilter
    principal: str
    create_time: dt.datetime
    update_time: dt.datetime


class ViewsService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def save(self, name: str, where: RunFilter) -> tuple[SavedView, bool]:
        """Keep ``where`` as the caller's view ``name`` (replacing one of that name); return
        it and whether it is new."""
        _check_name(name, "view.name")
        check_run_filter(where, "view.query.")
        principal = caller_name()
        text = _dumps(where)

        def write(session: Session) -> tuple[SavedView, bool]:
            row, created = views.save(session, principal, name, text, utcnow())
            return _view_of(row), created

        return await self._rt.write(write)

    async def list(self, page_size: int, page_token: str) -> tuple[list[SavedView], str]:
        """The caller's views by name."""
        principal = caller_name()
        page = page_request(page_size, page_token, {"principal": principal}, key=(str,))

        def read(session: Session) -> tuple[list[SavedViewRow], str]:
            after = page.after[0] if page.after is not None else None
            rows = views.page(session, principal, after, page.size + 1)
            return cut_page(rows, page.size, {"principal": principal}, lambda r: [r.name])

        rows, token = await self._rt.read(read)
        return [_view_of(r) for r in rows], token

    async def delete(self, name: str) -> None:
        """Delete the caller's view ``name``; NotFound if it has none of that name."""
        _check_name(name, "name")
        principal = caller_name()

        def write(session: Session) -> bool:
            return views.delete(session, principal, name)

        if not await self._rt.write(write):
            raise NotFound("saved view", name)


def _check_name(name: str, field: str) -> None:
    if not name.strip():
        raise InvalidArgument.for_field(field, "required")
    if len(name) > NAME_MAX:
        raise InvalidArgument.for_field(field, f"at most {NAME_MAX} characters")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise InvalidArgument.for_field(field, "no control or unassigned characters")


def _dumps(where: RunFilter) -> str:
    document: dict[str, Any] = dataclasses.asdict(where)
    document["statuses"] = list(where.statuses)
    for key in ("created_from", "created_before"):
        value = getattr(where, key)
        document[key] = value.isoformat() if value is not None else None
    return json.dumps(document, sort_keys=True)


def _loads(text: str) -> RunFilter:
    document = json.loads(text)
    for key in ("created_from", "created_before"):
        if document.get(key) is not None:
            document[key] = dt.datetime.fromisoformat(document[key])
    document["statuses"] = tuple(document.get("statuses", ()))
    known = {f.name for f in dataclasses.fields(RunFilter)}
    return RunFilter(**{k: v for k, v in document.items() if k in known})


def _view_of(row: SavedViewRow) -> SavedView:
    return SavedView(
        row.name, _loads(row.query_json), row.principal, row.create_time, row.update_time
    )
