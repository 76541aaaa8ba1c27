"""The web console (issue 30) over HTTP, against a real server on both engines: sign-in and
its cookie, the headers every page carries, forms only from the console's own pages, what
each principal sees and may do (the API's permission table, asked through the API), caller
strings rendered inert, the live event stream.

A run in namespace ``team-a`` is made by an admin with hostile strings in its goal and in a
step's summary; principals: ``admin`` (everything), ``auditor`` (reads team-a), ``outsider``
(a client and auditor of team-b). The browser here is ``urllib`` with a cookie jar; the tests
in a real browser are ``tests/e2e/test_console_browser.py``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.cookiejar
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from markupsafe import escape

from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.auth import new_token, token_entry
from runtime_service.console.web import (
    CONTENT_SECURITY_POLICY,
    ConsoleExposureError,
    console_exposure,
)
from tests.runtime_support import Stubs
from tests.support import ServerThread, free_port, serving

#: What a hostile caller writes into the ledger: each must reach the page as text.
SCRIPT = "<script>document.title='owned'</script>"
ATTRIBUTE = '" onmouseover="document.title=\'owned\'" x="'
IMAGE = "<img src=x onerror=alert(1)>"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str
    cookies: list[str] = field(default_factory=list)


class Browser:
    """A cookie jar and the requests a browser makes: GETs, and POSTs of a page's forms
    with the page's ``Origin`` (or another one, for the refusals)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self._open = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect()
        ).open

    def _send(self, request: urllib.request.Request) -> Answer:
        try:
            response = self._open(request, timeout=10)
        except urllib.error.HTTPError as error:
            response = error
        body = response.read().decode()
        return Answer(
            response.status,
            {k.lower(): v for k, v in response.headers.items()},
            body,
            response.headers.get_all("Set-Cookie") or [],
        )

    def get(self, path: str) -> Answer:
        return self._send(urllib.request.Request(self.base + path))

    def post(
        self,
        path: str,
        form: dict[str, str] | list[tuple[str, str]],
        origin: str | None = "",
    ) -> Answer:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if origin is not None:
            headers["Origin"] = origin or self.base
        data = urllib.parse.urlencode(form).encode()
        return self._send(urllib.request.Request(self.base + path, data, headers, method="POST"))

    def sign_in(self, token: str) -> Answer:
        page = self.get("/sign-in")
        return self.post("/sign-in", {"csrf": form_token(page.body), "token": token})

    def csrf(self, path: str) -> str:
        return form_token(self.get(path).body)


def form_token(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form token"
    return found.group(1)


@dataclass
class Site:
    base: str
    server: ServerThread
    tokens: dict[str, str]
    run_id: str
    lease_token: str
    admin: Stubs

    def browser(self, who: str | None = None) -> Browser:
        browser = Browser(self.base)
        if who is not None:
            assert browser.sign_in(self.tokens[who]).status == 303
        return browser

    def run(self) -> message_pb2.Run:
        return self.admin.runtime.GetRun(pb.GetRunRequest(run_id=self.run_id), timeout=10).run


@pytest.fixture(scope="module")
def site(shared_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tokens = {name: new_token() for name in ("admin", "auditor", "outsider")}
    config = tmp_path_factory.mktemp("console") / "auth.toml"
    config.write_text(
        token_entry("admin-1", tokens["admin"], ["admin"], [], [])
        + token_entry("auditor-1", tokens["auditor"], ["auditor"], [], ["team-a"])
        + token_entry("outsider-1", tokens["outsider"], ["client", "auditor"], [], ["team-b"])
    )
    port = free_port()
    with serving(
        shared_database_url, auth_config=str(config), console_listen=f"127.0.0.1:{port}"
    ) as server:
        admin = Stubs.open(server.address, tokens["admin"])
        try:
            admin.publish_plain_agent()  # coding_agent:prod and plain_agent:prod
            thread = admin.thread(namespace="team-a")
            run = admin.runtime.CreateRun(
                pb.CreateRunRequest(
                    thread_id=thread.id,
                    agent_ref="coding_agent:prod",
                    goal=message_pb2.Goal(objective=f"fix the login {SCRIPT} {ATTRIBUTE}"),
                ),
                timeout=10,
            ).run
            got = admin.acquire()
            turn = admin.worker.BeginTurn(wpb.BeginTurnRequest(fence=got.fence), timeout=10).turn
            step = admin.worker.BeginStep(
                wpb.BeginStepRequest(
                    fence=got.fence,
                    turn_id=turn.id,
                    type=enum_pb2.STEP_TYPE_MODEL_CALL,
                    model_call=message_pb2.ModelCallSpec(estimated_input_tokens=10),
                ),
                timeout=10,
            ).step
            admin.worker.EndStep(
                wpb.EndStepRequest(
                    fence=got.fence,
                    step_id=step.id,
                    status=enum_pb2.STEP_STATUS_SUCCEEDED,
                    summary=f"read the code {IMAGE} {ATTRIBUTE}",
                    usage=message_pb2.Usage(input_tokens=12, output_tokens=3),
                ),
                timeout=10,
            )
            yield Site(
                f"http://127.0.0.1:{port}",
                server,
                tokens,
                run.id,
                got.fence.lease_token,
                admin,
            )
        finally:
            admin.close()


def test_a_page_asks_who_you_are_first_and_an_unknown_token_opens_nothing(site: Site) -> None:
    browser = site.browser()
    answer = browser.get("/runs?status=RUNNING")
    assert answer.status == 303
    location = urllib.parse.urlsplit(answer.headers["location"])
    assert location.path == "/sign-in"
    assert urllib.parse.parse_qs(location.query) == {"next": ["/runs?status=RUNNING"]}
    refused = browser.sign_in("not-a-token")
    assert refused.status == 401
    assert "not one this server knows" in refused.body
    assert not any(c.startswith("agentrt_console=") for c in refused.cookies)
    assert browser.get("/runs").status == 303


def test_signing_in_sets_a_strict_http_only_session_cookie_and_signing_out_ends_it(
    site: Site,
) -> None:
    browser = site.browser()
    answer = browser.sign_in(site.tokens["auditor"])
    assert answer.status == 303 and answer.headers["location"] == "/runs"
    session = next(c for c in answer.cookies if c.startswith("agentrt_console="))
    flags = {part.strip().lower() for part in session.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    assert browser.get("/runs").status == 200
    assert browser.post("/sign-out", {"csrf": browser.csrf("/runs")}).status == 303
    assert browser.get("/runs").status == 303


def test_sign_in_needs_the_forms_own_token(site: Site) -> None:
    """A page elsewhere cannot sign a browser in as somebody else (login CSRF): the sign-in
    form's token must match the cookie set with the form."""
    browser = site.browser()
    browser.get("/sign-in")
    forged = browser.post("/sign-in", {"csrf": "made-up", "token": site.tokens["admin"]})
    assert forged.status == 403
    assert browser.get("/runs").status == 303


@pytest.mark.parametrize("path", ["/sign-in", "/runs", "/runs/{run}"])
def test_every_page_has_the_policy_and_no_inline_script(site: Site, path: str) -> None:
    browser = site.browser(None if path == "/sign-in" else "admin")
    answer = browser.get(path.format(run=site.run_id))
    assert answer.status == 200
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["cache-control"] == "no-store"
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", answer.body, re.S)
    assert scripts and all('src="/static/' in attrs and not body for attrs, body in scripts)
    assert not re.search(r"<[^>]+\son\w+\s*=", answer.body), "an inline event handler"
    assert not re.search(r"<[^>]+\sstyle\s*=", answer.body), "an inline style"


def test_the_runs_list_filters_by_tag_digest_and_creation_time(site: Site) -> None:
    browser = site.browser("admin")
    run = site.run()
    created = run.create_time.ToDatetime()
    before, after = (
        (created + dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M") for m in (-1, 2)
    )

    def lists(**query: str) -> bool:
        page = browser.get("/runs?" + urllib.parse.urlencode(query))
        assert page.status == 200, page.body
        return site.run_id in page.body

    assert lists(tag="prod") and not lists(tag="canary")
    assert lists(digest=run.agent.agent_digest) and not lists(digest="sha256:" + "0" * 64)
    assert lists(**{"from": before, "before": after})
    assert not lists(**{"from": after}) and not lists(before=before)
    # A time that is not one, and a digest the API refuses, are said, not ignored.
    bad_time = browser.get("/runs?from=yesterday")
    assert bad_time.status == 400 and "from: &#39;yesterday&#39; is not a time" in bad_time.body
    bad_digest = browser.get("/runs?digest=sha256:abc")
    assert bad_digest.status == 400 and "INVALID_ARGUMENT" in bad_digest.body


def test_a_saved_view_is_the_principals_own_and_opens_its_list(site: Site) -> None:
    admin, auditor = site.browser("admin"), site.browser("auditor")
    token = admin.csrf("/runs?tag=prod")
    saved = admin.post(
        "/views",
        [
            ("csrf", token),
            ("name", f"prod runs {SCRIPT}"),
            ("tag", "prod"),
            ("status", "RUNNING"),
            ("status", "QUEUED"),
        ],
    )
    assert saved.status == 303
    assert saved.headers["location"] == "/runs?status=RUNNING&status=QUEUED&tag=prod"
    listed = admin.get("/runs").body
    assert 'href="/runs?status=RUNNING&amp;status=QUEUED&amp;tag=prod">prod runs' in listed
    assert SCRIPT not in listed and str(escape(SCRIPT)) in listed
    opened = admin.get("/runs?status=RUNNING&status=QUEUED&tag=prod").body
    assert site.run_id in opened
    # Another principal's console shows none of it, on either page.
    assert "prod runs" not in auditor.get("/runs").body
    assert "prod runs" not in auditor.get("/views").body
    # Deleted from /views by its owner; the same request by another principal finds nothing.
    name = f"prod runs {SCRIPT}"
    refused = auditor.post("/views/delete", {"csrf": auditor.csrf("/views"), "name": name})
    assert refused.status == 404
    deleted = admin.post("/views/delete", {"csrf": admin.csrf("/views"), "name": name})
    assert deleted.status == 303 and deleted.headers["location"] == "/views"
    assert "prod runs" not in admin.get("/views").body


def test_what_callers_wrote_is_shown_as_text(site: Site) -> None:
    run_page = site.browser("admin").get(f"/runs/{site.run_id}").body
    listed = site.browser("admin").get("/runs").body
    for page, planted in ((run_page, SCRIPT), (run_page, IMAGE), (listed, SCRIPT)):
        assert planted not in page
        assert str(escape(planted)) in page
    assert ATTRIBUTE not in run_page and str(escape(ATTRIBUTE)) in run_page
    assert "<script>document" not in run_page and "<img src=x" not in run_page


def test_no_page_shows_a_token(site: Site) -> None:
    browser = site.browser("admin")
    pages = [browser.get(p).body for p in ("/runs", f"/runs/{site.run_id}")]
    for page in pages:
        assert site.lease_token not in page
        for token in site.tokens.values():
            assert token not in page


def test_a_form_from_elsewhere_or_without_its_token_changes_nothing(site: Site) -> None:
    browser = site.browser("admin")
    token = browser.csrf(f"/runs/{site.run_id}")
    cancel = f"/runs/{site.run_id}/cancel"
    assert browser.post(cancel, {"csrf": token}, origin="http://evil.example").status == 403
    assert browser.post(cancel, {"csrf": token}, origin=None).status == 403
    assert browser.post(cancel, {}).status == 403
    assert browser.post(cancel, {"csrf": "x" + token}).status == 403
    run = site.run()
    assert not run.cancel_requested and run.status == enum_pb2.RUN_STATUS_RUNNING


def test_an_auditor_sees_no_controls_and_a_forged_one_is_refused_by_the_api(site: Site) -> None:
    browser = site.browser("auditor")
    page = browser.get(f"/runs/{site.run_id}")
    assert page.status == 200 and "fix the login" in page.body
    assert "/cancel" not in page.body and "/pause" not in page.body
    admin_page = site.browser("admin").get(f"/runs/{site.run_id}").body
    assert f"/runs/{site.run_id}/cancel" in admin_page
    forged = browser.post(f"/runs/{site.run_id}/cancel", {"csrf": form_token(page.body)})
    assert forged.status == 403
    assert "PERMISSION_DENIED" in forged.body
    assert not site.run().cancel_requested


def test_a_principal_of_another_namespace_sees_nothing_of_the_run(site: Site) -> None:
    browser = site.browser("outsider")
    listed = browser.get("/runs")
    assert listed.status == 200 and site.run_id not in listed.body
    page = browser.get(f"/runs/{site.run_id}")
    assert page.status == 403 and "fix the login" not in page.body
    events = browser.get(f"/runs/{site.run_id}/events")
    assert events.status == 403


def test_the_run_page_follows_the_ledger_as_server_sent_events(site: Site) -> None:
    browser = site.browser("admin")
    browser.get("/runs")
    cookie = "; ".join(f"{c.name}={c.value}" for c in browser.jar)
    host, port = site.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"GET /runs/{site.run_id}/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Cookie: {cookie}\r\nLast-Event-ID: 1\r\n\r\n".encode()
        )
        received = b""
        while len(re.findall(rb"id: \d+\n", received)) < 3 and len(received) < 100_000:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"200 OK" in head.split(b"\r\n")[0]
    assert b"content-type: text/event-stream" in head.lower()
    assert b"content-security-policy" in head.lower()
    sequences = [int(s) for s in re.findall(rb"id: (\d+)", body)]
    assert sequences[:3] == [2, 3, 4], "resumed after Last-Event-ID 1, in order"
    assert b"event: ledger" in body
    assert SCRIPT.encode() not in body


def test_an_input_sent_from_the_console_is_recorded_once_as_the_principal(site: Site) -> None:
    browser = site.browser("admin")
    page = browser.get(f"/runs/{site.run_id}")
    assert 'action="/runs/' + site.run_id + '/input"' in page.body
    request_id = re.search(r'name="request_id" value="([^"]+:input)"', page.body)
    assert request_id
    form = {
        "csrf": form_token(page.body),
        "request_id": request_id.group(1),
        "kind": "steer",
        "content": f"also check {SCRIPT}",
    }
    assert browser.post(f"/runs/{site.run_id}/input", form).status == 303
    assert browser.post(f"/runs/{site.run_id}/input", form).status == 303  # sent twice
    assert browser.post(f"/runs/{site.run_id}/input", {**form, "kind": "x"}).status == 400
    watch = site.admin.runtime.WatchRun(pb.WatchRunRequest(run_id=site.run_id), timeout=10)
    received = []
    try:
        for reply in watch:
            if reply.event.HasField("input_received_attributes"):
                received.append(reply.event.input_received_attributes)
            if reply.event.sequence >= site.run().last_event_sequence:
                break
    finally:
        watch.cancel()
    assert len(received) == 1, "the same form twice records one input"
    assert received[0].sender_principal == "admin-1"
    assert "/input" not in site.browser("auditor").get(f"/runs/{site.run_id}").body


def test_an_admin_cancels_from_the_console_as_itself(site: Site) -> None:
    """Last: the run ends here."""
    browser = site.browser("admin")
    token = browser.csrf(f"/runs/{site.run_id}")
    answer = browser.post(f"/runs/{site.run_id}/cancel", {"csrf": token, "reason": "from the web"})
    assert answer.status == 303 and answer.headers["location"] == f"/runs/{site.run_id}"
    run = site.run()
    assert run.cancel_requested or run.status == enum_pb2.RUN_STATUS_CANCELLED
    watch = site.admin.runtime.WatchRun(pb.WatchRunRequest(run_id=site.run_id), timeout=10)
    try:
        asked = next(
            reply.event.run_cancel_requested_attributes
            for reply in watch
            if reply.event.HasField("run_cancel_requested_attributes")
        )
    finally:
        watch.cancel()
    assert (asked.actor_principal, asked.reason) == ("admin-1", "from the web")


def test_the_registry_shows_versions_tags_their_moves_and_what_a_version_pins(
    site: Site,
) -> None:
    browser = site.browser("auditor")
    listed = browser.get("/registry")
    assert listed.status == 200
    assert "/registry/agents/coding_agent/tags/prod" in listed.body
    assert "plain_agent" in listed.body and "unverified" in listed.body
    version = browser.get("/registry/versions/coding_agent:prod")
    assert version.status == 200
    digest = site.admin.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref="coding_agent:prod"), timeout=10
    ).agent_version
    for component in (digest.closure.model_policy, *digest.closure.tools):
        assert component.name in version.body and component.digest[:19] in version.body
    assert digest.digest in version.body
    history = browser.get("/registry/agents/coding_agent/tags/prod")
    assert history.status == 200 and "SET" in history.body and "admin-1" in history.body
    missing = browser.get("/registry/versions/coding_agent@no-such-version")
    assert missing.status == 404 and "NOT_FOUND" in missing.body


def test_the_diff_puts_two_versions_side_by_side(site: Site) -> None:
    browser = site.browser("auditor")
    page = browser.get("/registry/diff?base=coding_agent:prod&target=plain_agent:prod")
    assert page.status == 200
    assert "completion_policy" in page.body and "REMOVED" in page.body
    same = browser.get("/registry/diff?base=coding_agent:prod&target=coding_agent:prod")
    assert "the same version" in same.body
    bad = browser.get("/registry/diff?base=coding_agent&target=plain_agent:prod")
    assert bad.status == 400 and "INVALID_ARGUMENT" in bad.body


def test_the_approvals_inbox_says_who_may_decide(site: Site) -> None:
    auditor = site.browser("auditor").get("/approvals")
    assert auditor.status == 200 and "may read these runs but not decide" in auditor.body
    admin = site.browser("admin").get("/approvals")
    assert admin.status == 200 and "may read these runs but not decide" not in admin.body


def test_a_run_page_says_whether_its_record_verifies(site: Site) -> None:
    browser = site.browser("auditor")
    page = browser.get(f"/runs/{site.run_id}")
    assert page.status == 200 and f'data-verdict-src="/runs/{site.run_id}/verify"' in page.body
    verdict = browser.get(f"/runs/{site.run_id}/verify")
    assert verdict.status == 200
    assert re.search(r'class="badge verified">intact</span> \d+ events', verdict.body)
    assert site.browser("outsider").get(f"/runs/{site.run_id}/verify").status == 403


def test_provenance_draws_the_chain_from_the_record_to_the_versions(site: Site) -> None:
    browser = site.browser("auditor")
    page = browser.get(f"/audit/provenance?run={site.run_id}")
    assert page.status == 200
    version = site.admin.registry.GetAgentVersion(
        rpb.GetAgentVersionRequest(ref="coding_agent:prod"), timeout=10
    ).agent_version
    chain = page.body[page.body.index('<ol class="chain"') :]
    for part in (site.run_id, version.digest[:19], "repo-debug@2.1.0", "coding-balanced@3"):
        assert part in chain, part
    assert str(escape(SCRIPT)) in chain and SCRIPT not in chain
    step = site.admin.runtime.ListSteps(pb.ListStepsRequest(run_id=site.run_id), timeout=10).steps[
        0
    ]
    by_step = browser.get(f"/audit/provenance?step={step.id}")
    assert by_step.status == 200 and "MODEL_CALL" in by_step.body
    missing = browser.get("/audit/provenance?run=run_nothing")
    assert missing.status == 404


def test_usage_search_finds_the_runs_that_used_a_version(site: Site) -> None:
    browser = site.browser("auditor")
    page = browser.get("/audit/usages?component=repo-debug%402.1.0")
    assert page.status == 200 and f"/runs/{site.run_id}" in page.body
    nothing = browser.get("/audit/usages?model=no-such-model")
    assert nothing.status == 200 and "No step used it" in nothing.body
    outsider = site.browser("outsider").get("/audit/usages?component=repo-debug%402.1.0")
    assert site.run_id not in outsider.body


def test_the_audit_bundle_downloads_whole_and_only_for_who_may_read_it(site: Site) -> None:
    answer = site.browser("auditor").get(f"/runs/{site.run_id}/bundle")
    assert answer.status == 200
    assert answer.headers["content-disposition"].startswith("attachment;")
    assert answer.headers["content-type"].startswith("application/json")
    digest = "sha256:" + hashlib.sha256(answer.body.encode()).hexdigest()
    assert answer.headers["x-agentrt-bundle-digest"] == digest
    assert json.loads(answer.body)["run"]["id"] == site.run_id
    lines = site.browser("auditor").get(f"/runs/{site.run_id}/bundle?format=jsonl")
    assert lines.status == 200 and len(lines.body.splitlines()) > 1
    assert site.browser("outsider").get(f"/runs/{site.run_id}/bundle").status == 403
    assert site.browser("auditor").get(f"/runs/{site.run_id}/bundle?format=xml").status == 400


def test_the_console_listens_only_where_its_users_are_safe() -> None:
    assert console_exposure("127.0.0.1:8080", None, True, False).startswith("HTTP, loopback")
    with pytest.raises(ConsoleExposureError, match="--insecure"):
        console_exposure("0.0.0.0:8080", None, True, False)
    assert "--insecure" in console_exposure("0.0.0.0:8080", None, False, True)


def test_without_an_auth_config_the_operators_browser_needs_no_sign_in(
    sqlite_url: str, tmp_path: Path
) -> None:
    port = free_port()
    with serving(sqlite_url, console_listen=f"127.0.0.1:{port}"):
        browser = Browser(f"http://127.0.0.1:{port}")
        answer = browser.get("/runs")
        assert answer.status == 200 and "Signed in as <strong>anonymous</strong>" in answer.body
        assert "Sign out" not in answer.body
        assert browser.post("/runs/none/cancel", {}).status == 403
        assert browser.post("/runs/none/cancel", {"csrf": form_token(answer.body)}).status == 404
