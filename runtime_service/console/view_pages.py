"""The console's saved views: a runs list's filters kept under a name by the signed-in
principal (SaveView, ListViews, DeleteView, as that principal: the server keeps them, one
principal's never shown to another, as many as it saves)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web
from multidict import MultiDict

from agentrt.runtime.v1 import message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from runtime_service.console import views
from runtime_service.console.sessions import FORM, SESSION, Session

if TYPE_CHECKING:
    from runtime_service.console.web import Console

#: Views the runs list shows beside its filters (the rest on /views, a page at a time).
SHOWN: Final = 20
#: Views a page of /views shows.
PAGE_SIZE: Final = 100


class ViewPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/views", self.all),
            web.post("/views", self.save),
            web.post("/views/delete", self.delete),
        ]

    async def listed(
        self, session: Session, size: int, token: str = ""
    ) -> tuple[list[tuple[str, str]], str] | None:
        """A page of the principal's views as (name, the runs list's query string), and the
        next page's token; None when its roles keep no views."""
        asked = pb.ListViewsRequest(page_size=size, page_token=token)
        if not await self.c.may(session, views.LIST_VIEWS, asked):
            return None
        found = await self.c.api.call(session, self.c.api.runtime.ListViews, asked)
        shown = [(v.name, views.RunFilter.of_saved(v.query).query_string()) for v in found.views]
        return shown, found.next_page_token

    async def all(self, request: web.Request) -> web.StreamResponse:
        listed = await self.listed(request[SESSION], PAGE_SIZE, request.query.get("page", ""))
        saved, next_page = listed if listed is not None else ([], "")
        return self.c.render(
            request, "views.html", views=saved, next_page=next_page, keeps=listed is not None
        )

    async def save(self, request: web.Request) -> web.StreamResponse:
        """Save the filters the form carries (the list's own, as hidden fields) under the
        name typed; back to that list."""
        form = request[FORM]
        where = views.RunFilter.of(MultiDict((k, v) for k, v in form.items() if isinstance(v, str)))
        view = message_pb2.SavedView(name=str(form.get("name", "")), query=where.query())
        await self.c.api.call(
            request[SESSION], self.c.api.runtime.SaveView, pb.SaveViewRequest(view=view)
        )
        raise web.HTTPSeeOther("/runs?" + where.query_string())

    async def delete(self, request: web.Request) -> web.StreamResponse:
        name = str(request[FORM].get("name", ""))
        await self.c.api.call(
            request[SESSION], self.c.api.runtime.DeleteView, pb.DeleteViewRequest(name=name)
        )
        raise web.HTTPSeeOther("/views")
