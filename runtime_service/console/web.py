"""The console's HTTP side: pages rendered on the server, the security every page gets.

Served by ``agentrt serve --console-listen HOST:PORT`` on the server's own event loop
(aiohttp). Pages are Jinja2 templates with autoescaping on for every template, so whatever a
caller wrote into the ledger (a goal, a summary, a tool's arguments) is text on the page,
never markup. No page has inline script: the Content-Security-Policy allows scripts, styles
and connections from the console's own origin only. The console's script (``static/console.js``)
only enhances pages that work without it; the offline bundle viewer (``static/bundle.html``
and ``bundle.js``) is a static page that reads a file in the browser and calls no server.

Sign-in (with an auth config) takes an API token; the session it opens is an ``HttpOnly;
SameSite=Strict`` cookie (``sessions``). Every POST must come from a page of this console:
its ``Origin`` must be the console's, and its form must carry the session's CSRF token.
Without an auth config the console, like the API, listens on loopback only, and every
browser there is the operator's (a session is opened for it without sign-in, so its forms
still carry a CSRF token).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

import grpc
import jinja2
from aiohttp import web

from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.registry.v1.message_pb2 import CompletionPolicySpec
from agentrt_base.auth import Principal
from agentrt_base.sign_in_config import ConsoleSignIn
from agentrt_base.tls import ServerTls, is_loopback
from agentrt_core.lru import LruCache
from agentrt_sdk.errors import AgentrtError
from runtime_service.console import views
from runtime_service.console.api import Api
from runtime_service.console.audit_pages import AuditPages
from runtime_service.console.audit_pages import register_filters as register_audit_filters
from runtime_service.console.oidc_sign_in import OidcSignIn
from runtime_service.console.registry_pages import RegistryPages, register_filters
from runtime_service.console.sessions import (
    FORM,
    SESSION,
    SESSION_COOKIE,
    SIGN_IN_COOKIE,
    Session,
    Sessions,
    cookie_flags,
    next_path,
    same_token,
    set_session_cookie,
)
from runtime_service.console.view_pages import SHOWN as SHOWN_VIEWS
from runtime_service.console.view_pages import ViewPages

log = logging.getLogger("agentrt.console")

HERE: Final = Path(__file__).parent

#: Every response's: scripts, styles, images and connections (the live updates' event
#: stream) from this origin only, no inline script or style, no framing, forms posted here.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it a browser sends ``Origin: null`` with a form's POST (the
    # Fetch standard's origin serialisation), and the POST check needs the real origin.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}

#: Runs a list page shows.
PAGE_SIZE: Final = 50
#: Steps the run page shows at once (the rest a page further: a run of 20,000 steps opens
#: as fast as one of 200).
STEPS_PAGE: Final = 200

#: Who signs a browser in: the server's authenticator, given a token; the principal it
#: proves, or None for a token it does not accept.
SignIn = Callable[[str], Awaitable[Principal | None]]
#: Whether the principal may make the call (gRPC method name, request): the server's
#: permission table, asked without making it, so a page shows only the controls that work.
Permits = Callable[[Principal, str, Any], Awaitable[bool]]


class ConsoleExposureError(ValueError):
    """The console may not listen where it was asked to; the message is one line."""


def console_exposure(listen: str, tls: ServerTls | None, signs_in: bool, insecure: bool) -> str:
    """How the console at ``listen`` is reached (for the log line), or ConsoleExposureError.

    Without sign-in (no auth config) only loopback, as for the API. With sign-in, a token
    typed into the page would cross the network in clear over plain HTTP: loopback, or
    ``--insecure``."""
    if is_loopback(listen):
        return "HTTP, loopback only" + ("; sign-in with an API token" if signs_in else "")
    if insecure:
        return "HTTP with --insecure: anyone who can reach it can " + (
            "read the tokens typed into it" if signs_in else "use it"
        )
    raise ConsoleExposureError(
        f"refusing to serve the console on {listen}: it speaks plain HTTP, so only a loopback"
        " address is allowed (use 127.0.0.1 behind a TLS proxy, or accept the risk with"
        " --insecure)"
    )


@dataclass
class Console:
    """What the pages need: the API as the signed-in principal, the sessions, sign-in."""

    api: Api
    sessions: Sessions
    #: None: the server authenticates nobody (loopback only; no sign-in).
    sign_in: SignIn | None
    permits: Permits | None
    templates: jinja2.Environment
    #: The console's OpenID Provider as configured now (``[console_sign_in]``; None: none).
    provider: Callable[[], ConsoleSignIn | None] = lambda: None

    @classmethod
    def make(
        cls,
        api: Api,
        sign_in: SignIn | None,
        permits: Permits | None,
        provider: Callable[[], ConsoleSignIn | None] | None = None,
    ) -> Console:
        environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name
            undefined=jinja2.StrictUndefined,
        )
        views.register(environment)
        register_filters(environment.filters)
        register_audit_filters(environment.filters)
        return cls(api, Sessions(), sign_in, permits, environment, provider or (lambda: None))

    async def may(self, session: Session, method: str, request: Any) -> bool:
        if self.permits is None or session.principal is None:
            return True  # nobody is authenticated: every local caller may do everything
        return await self.permits(session.principal, method, request)

    def render(
        self, request: web.Request, template: str, status: int = 200, **values: Any
    ) -> web.Response:
        session: Session | None = request.get(SESSION)
        page = self.templates.get_template(template).render(
            session=session,
            signs_in=self.sign_in is not None,
            path=request.path,
            **values,
        )
        return web.Response(text=page, status=status, content_type="text/html")


def application(console: Console) -> web.Application:
    app = web.Application(
        middlewares=[_errors, _signed_in, _forms_from_here],
        client_max_size=64 * 1024,  # forms only: a token, a comment, a filter
    )
    app[CONSOLE] = console
    app.on_response_prepare.append(_security_headers)
    pages = Pages(console)
    app.add_routes(
        [
            web.get("/", pages.home),
            web.get("/sign-in", pages.sign_in_form),
            web.post("/sign-in", pages.sign_in),
            web.post("/sign-out", pages.sign_out),
            web.get("/runs", pages.runs),
            web.get("/runs/{run_id}", pages.run),
            web.get("/approvals", pages.approvals),
            web.get("/runs/{run_id}/events", pages.run_events),
            web.get("/runs/{run_id}/verify", pages.verify),
            web.post("/runs/{run_id}/{action:cancel|pause|resume}", pages.control),
            web.post("/runs/{run_id}/approvals/{step_id}", pages.decide),
            web.post("/runs/{run_id}/input", pages.send_input),
            *RegistryPages(console).routes(),
            *AuditPages(console).routes(),
            *ViewPages(console).routes(),
            *OidcSignIn(console, console.provider).routes(),
            web.static("/static", HERE / "static", append_version=False),
        ]
    )
    return app


CONSOLE: Final = web.AppKey("console", Console)

#: What a form token looks like (``secrets.token_urlsafe(32)``).
_FORM_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: Paths reachable without a session (the sign-in form and what it is drawn with).
_OPEN: Final = ("/sign-in", "/static/")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response's headers, set as it is prepared: pages, errors, refusals, static files
    and event streams alike."""
    response.headers.update(SECURITY_HEADERS)
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A call the API refused is a page saying why, with the HTTP status that means it."""
    try:
        return await handler(request)
    except AgentrtError as error:
        if error.code is grpc.StatusCode.UNAUTHENTICATED:
            raise _to_sign_in(request) from None
        console = request.app[CONSOLE]
        return console.render(
            request, "error.html", status=_HTTP_STATUS.get(error.code, 500), error=error
        )


_HTTP_STATUS: Final[Mapping[grpc.StatusCode, int]] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


@web.middleware
async def _signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Put the browser's session on the request; send one without a session to sign in
    (or, on a server that authenticates nobody, open one for it)."""
    console = request.app[CONSOLE]
    session = console.sessions.get(request.cookies.get(SESSION_COOKIE))
    opened = None
    if session is None and console.sign_in is None:
        session = opened = console.sessions.open(None, "")
    if session is not None:
        request[SESSION] = session
    elif not request.path.startswith(_OPEN):
        raise _to_sign_in(request)
    response = await handler(request)
    if opened is not None:
        set_session_cookie(request, response, opened)
    return response


@web.middleware
async def _forms_from_here(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every POST: from a page of this console (its Origin), with the form's token."""
    if request.method == "GET" or request.method == "HEAD":
        return await handler(request)
    if request.method != "POST":
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    origin = request.headers.get("Origin")
    if origin != f"{request.scheme}://{request.host}":
        raise web.HTTPForbidden(text="refused: the form was not sent from this console's page")
    form = await request.post()
    request[FORM] = form
    given = form.get("csrf")
    session: Session | None = request.get(SESSION)
    if request.path == "/sign-in":
        expected = request.cookies.get(SIGN_IN_COOKIE, "")
    else:
        expected = session.csrf if session is not None else ""
    if not same_token(expected, given if isinstance(given, str) else None):
        raise web.HTTPForbidden(text="refused: the form's token is missing or stale; reload")
    return await handler(request)


def _to_sign_in(request: web.Request) -> web.HTTPException:
    if request.method == "GET" and request.path != "/sign-in":
        return web.HTTPSeeOther("/sign-in?" + urlencode({"next": request.path_qs}))
    return web.HTTPSeeOther("/sign-in")


class Pages:
    def __init__(self, console: Console) -> None:
        self.c = console
        # A version's completion policy, by the version's digest: what a digest pins never
        # changes, and a live run page is fetched again on every batch of its events.
        self._policies: LruCache[str, CompletionPolicySpec] = LruCache(256)

    async def home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/runs")

    # ------------------------------------------------------------------ sign-in

    async def sign_in_form(self, request: web.Request) -> web.StreamResponse:
        if self.c.sign_in is None or request.get(SESSION) is not None:
            raise web.HTTPSeeOther("/runs")
        return self._sign_in_page(request, next_path(request.query.get("next")), "", 200)

    def _sign_in_page(
        self, request: web.Request, going: str, error: str, status: int
    ) -> web.Response:
        # The browser's own token while it lasts: a sign-in page opened again (another tab, a
        # redirect) must not make the form already on screen stale.
        kept = request.cookies.get(SIGN_IN_COOKIE, "")
        form_token = kept if _FORM_TOKEN.fullmatch(kept) else secrets.token_urlsafe(32)
        response = self.c.render(
            request,
            "sign_in.html",
            status=status,
            form_token=form_token,
            next_path=going,
            error=error,
            oidc_label=self._oidc_label(),
        )
        response.set_cookie(SIGN_IN_COOKIE, form_token, max_age=600, **cookie_flags(request))
        return response

    def _oidc_label(self) -> str | None:
        provider = self.c.provider()
        return provider.label if provider is not None else None

    async def sign_in(self, request: web.Request) -> web.StreamResponse:
        if self.c.sign_in is None:
            raise web.HTTPSeeOther("/runs")
        form = request[FORM]
        token = str(form.get("token", "")).strip()
        going = next_path(form.get("next"))
        principal = await self.c.sign_in(token) if token else None
        if principal is None:
            log.info("console sign-in refused")
            return self._sign_in_page(
                request, going, "That token is not one this server knows.", 401
            )
        self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
        session = self.c.sessions.open(principal, token)
        log.info("console sign-in: %s", principal.name)
        response = web.HTTPSeeOther(going)
        set_session_cookie(request, response, session)
        response.del_cookie(SIGN_IN_COOKIE, path="/")
        raise response

    async def sign_out(self, request: web.Request) -> web.StreamResponse:
        self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = web.HTTPSeeOther("/sign-in" if self.c.sign_in is not None else "/runs")
        response.del_cookie(SESSION_COOKIE, path="/")
        raise response

    # ------------------------------------------------------------------ runs

    async def runs(self, request: web.Request) -> web.StreamResponse:
        query = views.RunFilter.of(request.query)
        listed = await self.c.api.call(
            request[SESSION], self.c.api.runtime.ListRuns, query.request(PAGE_SIZE)
        )
        saved = await ViewPages(self.c).listed(request[SESSION], SHOWN_VIEWS)
        return self.c.render(
            request,
            "runs.html",
            runs=list(listed.runs),
            filter=query,
            next_query=query.next_page(listed.next_page_token),
            statuses=views.RUN_STATUSES,
            keeps_views=saved is not None,
            views=saved[0] if saved is not None else [],
            more_views=bool(saved and saved[1]),
        )

    async def approvals(self, request: web.Request) -> web.StreamResponse:
        """The runs the principal may read that wait for an approval (each run's page has
        the decision's form)."""
        session = request[SESSION]
        query = views.RunFilter.of(request.query)
        waiting = dataclasses.replace(query, statuses=("WAITING_APPROVAL",))
        listed = await self.c.api.call(
            session, self.c.api.runtime.ListRuns, waiting.request(PAGE_SIZE)
        )
        return self.c.render(
            request,
            "approvals.html",
            runs=list(listed.runs),
            next_query=waiting.next_page(listed.next_page_token),
            may_decide=await self.c.may(
                session, views.RESOLVE_APPROVAL, views.resolve_approval("", "", "approve", "", "")
            ),
        )

    async def run(self, request: web.Request) -> web.StreamResponse:
        session = request[SESSION]
        run_id = request.match_info["run_id"]
        api = self.c.api
        run = (await api.call(session, api.runtime.GetRun, views.get_run(run_id))).run
        attempts = await api.call(session, api.runtime.ListAttempts, views.list_attempts(run_id))
        steps = await api.call(
            session,
            api.runtime.ListSteps,
            views.list_steps(run_id, STEPS_PAGE, request.query.get("steps", "")),
        )
        return self.c.render(
            request,
            "run.html",
            may_verify=await self.c.may(session, views.VERIFY_RUN, views.verify_run(run.id)),
            run=run,
            checks=await self._completion_checks(session, run, list(steps.steps)),
            attempts=list(attempts.attempts),
            bars=views.attempt_bars(run, list(attempts.attempts), dt.datetime.now(dt.UTC)),
            timeline_width=views.TIMELINE_WIDTH,
            timeline_row=views.TIMELINE_ROW,
            steps=list(steps.steps),
            next_steps=steps.next_page_token,
            live=views.live(run),
            may_decide=await self.c.may(
                session,
                views.RESOLVE_APPROVAL,
                views.resolve_approval(run.id, "", "approve", "", ""),
            ),
            may_send_input=views.live(run)
            and await self.c.may(
                session, views.SEND_INPUT, views.send_input(run.id, "steer", "", "", "")
            ),
            request_id=views.new_request_id(),
            controls=[
                action
                for action in views.controls(run)
                if await self.c.may(
                    session, views.control_method(action), views.control_request(action, run.id)
                )
            ],
        )

    async def _completion_checks(
        self, session: Session, run: Any, steps: list[Any]
    ) -> list[views.CheckShown]:
        """The checks of the completion policy the run's definition pins (from the registry:
        the version it is bound to, then the policy component that version resolved)."""
        digest = run.agent.agent_digest
        policy = self._policies.get(digest)
        if policy is None:
            api = self.c.api
            asked = rpb.GetAgentVersionRequest(ref=digest)
            version = (await api.call(session, api.registry.GetAgentVersion, asked)).agent_version
            policy = CompletionPolicySpec()
            if version.closure.HasField("completion_policy"):
                pinned = rpb.GetComponentRequest(ref=version.closure.completion_policy.digest)
                component = (await api.call(session, api.registry.GetComponent, pinned)).component
                policy = component.spec.completion_policy
            self._policies.put(digest, policy)
        return views.completion_checks(policy, steps)

    async def verify(self, request: web.Request) -> web.StreamResponse:
        """VerifyRun's verdict on the run's record. Its own page, which the run page loads
        after its first screen (a run of 20,000 events takes seconds to verify, and its page
        must not wait for that); a refused or failed verification is shown as what it is."""
        session = request[SESSION]
        run_id = request.match_info["run_id"]
        try:
            verdict: Any = await self.c.api.call(
                session, self.c.api.audit.VerifyRun, views.verify_run(run_id)
            )
        except AgentrtError as error:
            if error.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                raise
            verdict = error
        return self.c.render(request, "verify.html", run_id=run_id, verdict=verdict)

    async def control(self, request: web.Request) -> web.StreamResponse:
        session = request[SESSION]
        run_id = request.match_info["run_id"]
        action = request.match_info["action"]
        reason = str(request[FORM].get("reason", ""))[:1000]
        api = self.c.api
        request_message = views.control_request(action, run_id, reason)
        await api.call(session, views.control_stub(api, action), request_message)
        raise web.HTTPSeeOther(f"/runs/{quote(run_id, safe='')}")

    async def send_input(self, request: web.Request) -> web.StreamResponse:
        """Steer the run or queue a follow-up, as the signed-in principal."""
        session = request[SESSION]
        run_id = request.match_info["run_id"]
        form = request[FORM]
        kind = str(form.get("kind", ""))
        if kind not in views.INPUT_KINDS:
            raise web.HTTPBadRequest(text="kind: steer or follow_up")
        message = views.send_input(
            run_id,
            kind,
            str(form.get("content", "")),
            session.who,
            str(form.get("request_id", "")),
        )
        await self.c.api.call(session, self.c.api.runtime.SendInput, message)
        raise web.HTTPSeeOther(f"/runs/{quote(run_id, safe='')}")

    async def decide(self, request: web.Request) -> web.StreamResponse:
        """Approve or deny a step that waits for it, as the signed-in principal (the ledger
        records the principal; the page's label is the session's name)."""
        session = request[SESSION]
        run_id, step_id = request.match_info["run_id"], request.match_info["step_id"]
        form = request[FORM]
        decision = str(form.get("decision", ""))
        if decision not in views.DECISIONS:
            raise web.HTTPBadRequest(text="decision: approve or deny")
        api = self.c.api
        message = views.resolve_approval(
            run_id,
            step_id,
            decision,
            str(form.get("comment", ""))[:4000],
            session.who,
            str(form.get("request_id", "")),
        )
        await api.call(session, api.runtime.ResolveApproval, message)
        raise web.HTTPSeeOther(f"/runs/{quote(run_id, safe='')}")

    async def run_events(self, request: web.Request) -> web.StreamResponse:
        """The run's ledger events as they are committed (server-sent events, fed by
        WatchRun): each names its sequence and type, nothing a caller wrote. A browser that
        lost the stream reconnects with ``Last-Event-ID`` and the watch resumes after it."""
        session = request[SESSION]
        run_id = request.match_info["run_id"]
        after = _sequence(request.headers.get("Last-Event-ID") or request.query.get("after"))
        api = self.c.api
        # Refused (not found, not permitted) as a page would be, before the stream starts.
        await api.call(session, api.runtime.GetRun, views.get_run(run_id))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        try:
            async for event in api.watch(session, views.watch_run(run_id, after)):
                await response.write(views.server_sent(event))
        except (AgentrtError, ConnectionResetError):
            pass  # the browser reconnects and resumes after the last id it saw
        return response


def _sequence(value: str | None) -> int:
    """A ``Last-Event-ID`` or ``after``: a sequence number, else 0 (from the start)."""
    if value is None or not value.isdigit() or len(value) > 18:
        return 0
    return int(value)


@dataclass
class ConsoleEndpoint:
    """The console served on ``listen``, on the running event loop, until :meth:`stop`."""

    listen: str
    console: Console
    port: int = 0
    _runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Bind and serve; return the bound port. OSError when the address cannot be bound."""
        host, _, port_text = self.listen.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            raise ConsoleExposureError(
                f"--console-listen {self.listen}: expected HOST:PORT"
            ) from None
        runner = web.AppRunner(application(self.console), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        return self.port

    @property
    def url(self) -> str:
        host = self.listen.rpartition(":")[0] or "0.0.0.0"
        return f"http://{host}:{self.port}/"

    async def stop(self) -> None:
        """Close the pages and event streams, then the console's channel to the API."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.console.api.close()
