"""The web console in a real browser (issue 30, item 7): Debian's headless Chromium driven
over WebDriver (Selenium) against a real server on both engines, seeded by the login-fix case:
the demo's worker process (``agentrt_sdk.demo.worker_main``) works a run of the demo's agent
until its patch waits for approval, and the approval is given in the browser.

Every page is checked for what a person would notice: no console error, no failed request,
no serious or critical axe-core violation (the page is read by axe as the browser renders it),
and every screenshot is written (to ``AGENTRT_CONSOLE_SCREENSHOTS``, else a temporary
directory: docs/console.md's images are made with ``AGENTRT_CONSOLE_SCREENSHOTS=docs/console``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrt.audit.v1 import audit_service_pb2, audit_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_base.auth import new_token, token_entry
from agentrt_sdk.demo.login_fix import make_workspace
from agentrt_sdk.demo.play import FIX_OBJECTIVE, definition_file
from tests.e2e.cli_support import checkout_env
from tests.runtime_support import Stubs
from tests.support import ServerThread, free_port, serving

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("chromium") is None or shutil.which("chromedriver") is None,
        reason="no chromium and chromium-driver: .ci/run installs them",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
SCRIPT = "<script>document.title='owned'</script>"
ATTRIBUTE = '" autofocus onfocus="document.title=\'owned\'" x="'


@dataclass
class Seeded:
    base: str
    server: ServerThread
    tokens: dict[str, str]
    fix_run: str
    hostile_run: str
    admin: Stubs
    work: Path
    worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        """The demo's worker process, taking the login-fix run (and only it)."""
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrt_sdk.demo.worker_main",
                "--target",
                self.server.address,
                "--worker-id",
                "browser-worker",
                "--workspace",
                str(make_workspace(self.work / "workspace")),
                "--label",
                "browser=fix",
                "--lease-ttl",
                "10",
            ],
            env={**checkout_env(os.environ), "AGENTRT_TOKEN": self.tokens["worker"]},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def run(self, run_id: str) -> message_pb2.Run:
        return self.admin.runtime.GetRun(pb.GetRunRequest(run_id=run_id), timeout=10).run

    def steps(self, run_id: str) -> list[message_pb2.Step]:
        return list(
            self.admin.runtime.ListSteps(
                pb.ListStepsRequest(run_id=run_id, page_size=500), timeout=10
            ).steps
        )


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def seeded(shared_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    work = tmp_path_factory.mktemp("console-browser")
    tokens = {name: new_token() for name in ("admin", "operator", "auditor", "outsider", "worker")}
    config = work / "auth.toml"
    config.write_text(
        token_entry("admin-1", tokens["admin"], ["admin"], [], [])
        + token_entry(
            "operator-1", tokens["operator"], ["client", "approver", "auditor"], [], ["default"]
        )
        + token_entry("auditor-1", tokens["auditor"], ["auditor"], [], ["default"])
        + token_entry("outsider-1", tokens["outsider"], ["client", "auditor"], [], ["team-b"])
        + token_entry("demo-worker", tokens["worker"], ["worker"], ["*"], ["default"])
    )
    port = free_port()
    with serving(
        shared_database_url,
        auth_config=str(config),
        console_listen=f"127.0.0.1:{port}",
        step_process=True,
    ) as server:
        admin = Stubs.open(server.address, tokens["admin"])
        seeded: Seeded | None = None
        try:
            publish = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "runtime_service.cli.entry",
                    "publish",
                    str(definition_file()),
                    "--tag",
                    "prod",
                    "--target",
                    server.address,
                ],
                env={**checkout_env(os.environ), "AGENTRT_TOKEN": tokens["admin"]},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert publish.returncode == 0, publish.stderr
            thread = admin.runtime.CreateThread(
                pb.CreateThreadRequest(title="login returns 500"), timeout=10
            ).thread
            fix = admin.runtime.CreateRun(
                pb.CreateRunRequest(
                    thread_id=thread.id,
                    agent_ref="coding_agent:prod",
                    goal=message_pb2.Goal(objective=FIX_OBJECTIVE),
                    labels={"browser": "fix"},
                ),
                timeout=10,
            ).run
            hostile_thread = admin.runtime.CreateThread(
                pb.CreateThreadRequest(title="hostile"), timeout=10
            ).thread
            hostile = admin.runtime.CreateRun(
                pb.CreateRunRequest(
                    thread_id=hostile_thread.id,
                    agent_ref="coding_agent:prod",
                    goal=message_pb2.Goal(objective=f"{SCRIPT} {ATTRIBUTE}"),
                    labels={"browser": "nobody-takes-it"},
                ),
                timeout=10,
            ).run
            seeded = Seeded(
                f"http://127.0.0.1:{port}", server, tokens, fix.id, hostile.id, admin, work
            )
            yield seeded
        finally:
            if seeded is not None and seeded.worker is not None:
                seeded.worker.terminate()
                seeded.worker.wait(20)
            admin.close()


@pytest.fixture(scope="module")
def shots() -> Path:
    directory = Path(os.environ.get("AGENTRT_CONSOLE_SCREENSHOTS") or _temporary())
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _temporary() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="agentrt-console-shots-")


class Page:
    """One browser (its own cookies) and the checks every page it opens must pass."""

    def __init__(self, base: str, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(
            options=options, service=Service(shutil.which("chromedriver") or "chromedriver")
        )
        self.driver.set_page_load_timeout(30)
        self.base = base
        self.shots = shots

    def close(self) -> None:
        self.driver.quit()

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def sign_in(self, token: str) -> None:
        self.open("/sign-in")
        self.find("#token").send_keys(token)
        self.find("form.sign-in button[type=submit]").click()
        try:
            _wait("the runs list", lambda: self.driver.current_url.endswith("/runs"), 15)
        except AssertionError:
            raise AssertionError(self.driver.current_url + self.driver.page_source[:3000]) from None

    def checked(self, name: str) -> None:
        """The page as it is now: no console error or failed request, no serious or critical
        accessibility violation, and its screenshot."""
        errors = [
            entry
            for entry in self.driver.get_log("browser")
            if entry["level"] in ("SEVERE", "ERROR")
        ]
        assert not errors, f"{name}: {json.dumps(errors, indent=1)}"
        self.driver.execute_script(AXE.read_text(encoding="utf-8"))
        result = self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "axe.run(document).then(r => done(r.violations), e => done([{id: String(e)}]));"
        )
        serious = [
            {"id": v["id"], "impact": v.get("impact"), "nodes": len(v.get("nodes", []))}
            for v in result
            if v.get("impact") in ("serious", "critical") or "impact" not in v
        ]
        assert not serious, f"{name}: axe-core: {serious}"
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))


@pytest.fixture
def page(seeded: Seeded, shots: Path) -> Iterator[Page]:
    browser = Page(seeded.base, shots)
    try:
        yield browser
    finally:
        browser.close()


def _waiting_approval(seeded: Seeded) -> message_pb2.Step | None:
    for step in seeded.steps(seeded.fix_run):
        if step.status == enum_pb2.STEP_STATUS_WAITING_APPROVAL:
            return step
    return None


def test_the_run_page_follows_the_worker_and_the_approval_given_there_is_recorded(
    seeded: Seeded, page: Page
) -> None:
    page.sign_in(seeded.tokens["operator"])
    page.checked("runs")
    page.open(f"/runs/{seeded.fix_run}")
    assert "No steps yet" in page.find("main").text
    marker = page.driver.execute_script("return window.performance.timeOrigin")
    seeded.start_worker()
    # The worker writes steps: they appear without a reload (the same document).
    _wait(
        "the approval form, shown live",
        lambda: (
            page.all("form.approval")
            and page.driver.execute_script("return window.performance.timeOrigin") == marker
        ),
        90,
    )
    assert len(page.all("table.steps tbody tr")) >= 2
    page.checked("run-waiting-approval")
    waiting = _waiting_approval(seeded)
    assert waiting is not None
    page.open("/approvals")
    page.checked("approvals")
    page.find(f"a[href='/runs/{seeded.fix_run}#steps']").click()
    _wait("the run page from the inbox", lambda: page.all("form.approval"), 15)
    page.find(f"#comment-{waiting.id}").send_keys("patch reviewed in the browser")
    page.find("form.approval button.approve").click()
    run = _wait(
        "the run to complete",
        lambda: (r := seeded.run(seeded.fix_run)).status == enum_pb2.RUN_STATUS_COMPLETED and r,
        90,
    )
    assert run.status == enum_pb2.RUN_STATUS_COMPLETED
    decided = next(s for s in seeded.steps(seeded.fix_run) if s.id == waiting.id)
    assert decided.approval.decision == enum_pb2.APPROVAL_DECISION_APPROVE
    assert decided.approval.approver_principal == "operator-1"
    assert decided.approval.comment == "patch reviewed in the browser"
    page.open(f"/runs/{seeded.fix_run}")
    facts = page.find("dl.facts").text
    assert "COMPLETED" in facts
    # The completion policy the run's version pins, each check with the step that attested it.
    # Each attempt drawn on the timeline, as many bars as attempts listed.
    assert len(page.all("svg.timeline g.attempt-bar")) == len(page.all("ol.attempts > li")) >= 2
    checks = [li.text for li in page.all("ul.checks li")]
    assert sorted(c.split(" ")[0] for c in checks) == ["diff-produced", "tests-pass"], checks
    assert all("attested by the worker" in c and ": SUCCEEDED" in c for c in checks), checks
    verdict = _wait(
        "the verdict, put in after the first screen", lambda: page.all("dl.verdict"), 30
    )
    assert "intact" in verdict[0].text
    page.checked("run-completed")
    page.find("dl.verdict a[href^='/audit/provenance']").click()
    _wait("the provenance chain", lambda: page.all("ol.chain li.node"), 15)
    page.checked("provenance")
    page.open("/audit/usages?component=repo-debug%402.1.0")
    assert page.all(f"table.usages a[href='/runs/{seeded.fix_run}']")
    page.checked("usages")


def test_what_a_caller_wrote_stays_text_and_a_cancel_from_the_browser_lands(
    seeded: Seeded, page: Page
) -> None:
    page.sign_in(seeded.tokens["operator"])
    page.open(f"/runs/{seeded.hostile_run}")
    assert page.driver.title.endswith("agentrt console") and "owned" not in page.driver.title
    assert SCRIPT in page.find("dl.facts dd.goal").text
    page.checked("run-hostile")
    page.find("#reason-cancel").send_keys("not ours")
    page.find("button.control-cancel").click()
    _wait(
        "the cancel",
        lambda: seeded.run(seeded.hostile_run).status == enum_pb2.RUN_STATUS_CANCELLED,
        30,
    )
    assert "owned" not in page.driver.title


def test_an_auditor_has_no_controls_and_what_it_forges_is_refused(
    seeded: Seeded, page: Page
) -> None:
    page.sign_in(seeded.tokens["auditor"])
    page.open(f"/runs/{seeded.fix_run}")
    assert not page.all("section.controls") and not page.all("form.approval")
    page.checked("run-as-auditor")
    csrf = page.find("header form.who input[name=csrf]").get_attribute("value")
    status = page.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf: arguments[1]}),"
        " credentials: 'same-origin', redirect: 'manual'}).then(r => done(r.status));",
        f"/runs/{seeded.hostile_run}/pause",
        csrf,
    )
    assert status == 403
    page.driver.get_log("browser")  # (the refused fetch is logged; it was meant to be)


def test_a_principal_of_another_namespace_sees_none_of_it(seeded: Seeded, page: Page) -> None:
    page.sign_in(seeded.tokens["outsider"])
    assert seeded.fix_run not in page.driver.page_source
    assert seeded.hostile_run not in page.driver.page_source
    page.checked("runs-other-namespace")


def test_the_keyboard_reaches_sign_in_and_every_control_has_a_label(
    seeded: Seeded, page: Page
) -> None:
    from selenium.webdriver.common.keys import Keys

    page.open("/sign-in")
    page.checked("sign-in")
    body = page.find("body")
    body.send_keys(Keys.TAB)
    reached = []
    for _ in range(6):
        reached.append(page.driver.switch_to.active_element.get_attribute("id") or "")
        page.driver.switch_to.active_element.send_keys(Keys.TAB)
    assert "token" in reached
    page.find("#token").send_keys(seeded.tokens["auditor"] + Keys.ENTER)
    _wait("signed in by the keyboard", lambda: page.driver.current_url.endswith("/runs"), 15)


def test_the_registry_pages_and_the_diff_read_well(seeded: Seeded, page: Page) -> None:
    page.sign_in(seeded.tokens["auditor"])
    page.open("/registry")
    assert page.all("table.versions tbody tr") and page.all("table.tags tbody tr")
    page.checked("registry")
    page.find("table.versions tbody tr a[href^='/registry/versions/']").click()
    _wait("a version page", lambda: page.all("table.closure tbody tr"), 15)
    page.checked("registry-version")
    page.open("/registry/agents/coding_agent/tags/prod")
    assert page.all("table.tag-history tbody tr")
    page.checked("registry-tag-history")
    page.open("/registry/diff")
    page.find("#d-base").send_keys("coding_agent:prod")
    page.find("#d-target").send_keys("coding_agent:prod")
    page.find("form.filters button[type=submit]").click()
    _wait("the diff", lambda: "same version" in page.driver.page_source, 15)
    page.checked("registry-diff")


def test_a_view_saved_in_the_browser_opens_its_list_and_is_deleted_there(
    seeded: Seeded, page: Page
) -> None:
    page.sign_in(seeded.tokens["auditor"])
    page.open("/runs?status=COMPLETED&status=RUNNING&status=WAITING_APPROVAL")
    page.find("#view-name").send_keys("what moved")
    page.find("form.save-view button[type=submit]").click()
    _wait("the saved view", lambda: ">what moved</a>" in page.driver.page_source, 15)
    link = page.find("section.saved-views a[href^='/runs?status=']")
    assert link.text == "what moved"
    page.checked("runs-with-a-saved-view")
    page.open("/views")
    assert [a.text for a in page.all("table.views tbody a")] == ["what moved"]
    page.checked("views")
    page.find("table.views tbody button[type=submit]").click()
    _wait("the view deleted", lambda: "No saved views yet" in page.driver.page_source, 15)


def _bundle(seeded: Seeded, run_id: str, fmt: int) -> bytes:
    audit = audit_service_pb2_grpc.AuditServiceStub(seeded.admin.channel)
    chunks = audit.ExportBundle(
        audit_service_pb2.ExportBundleRequest(run_id=run_id, format=fmt), timeout=30
    )
    return b"".join(part.chunk for part in chunks if part.WhichOneof("part") == "chunk")


def test_the_offline_viewer_checks_a_bundles_chain_in_the_browser(
    seeded: Seeded, page: Page, tmp_path: Path
) -> None:
    """A bundle opened in the static viewer is drawn and its chain checked by the page alone
    (no request once the page is loaded), in both formats; a changed event is caught, naming
    it; what the run's callers wrote stays text. (The login-fix run is complete here when the
    module runs whole: its chain is every event of the case.)"""
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(_bundle(seeded, seeded.hostile_run, audit_service_pb2.BUNDLE_FORMAT_JSONL))
    fix = tmp_path / "login-fix.json"
    fix.write_bytes(_bundle(seeded, seeded.fix_run, audit_service_pb2.BUNDLE_FORMAT_JSON))
    document = json.loads(fix.read_text(encoding="utf-8"))
    document["events"][0]["attributes"]["goal"]["objective"] = "something else"
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(document), encoding="utf-8")

    page.open("/static/bundle.html")  # no sign-in: the page holds no data
    title = page.driver.title
    requests = "return performance.getEntriesByType('resource').length"
    loaded = page.driver.execute_script(requests)
    for path, run_id in ((hostile, seeded.hostile_run), (fix, seeded.fix_run)):
        page.find("#bundle-file").send_keys(str(path))
        verdict = _wait(
            f"the verdict on {path.name}",
            lambda path=path: (
                page.all("#bundle-verdict p.verified")
                and path.name in page.find("#bundle-view").text
            ),
            30,
        )
        assert "Chain verified" in page.find("#bundle-verdict p.verified").text, verdict
        view = page.find("#bundle-view").text
        assert run_id in view
        events = page.all("#bundle-view table:last-of-type tbody tr")
        assert len(events) == len(json.loads(_json_of(path))["events"])
    assert SCRIPT not in page.find("#bundle-view").text  # the last one drawn is the fix run
    page.checked("bundle-viewer")
    page.find("#bundle-file").send_keys(str(hostile))
    _wait("the hostile run drawn", lambda: SCRIPT in page.find("#bundle-view").text, 30)
    assert page.driver.title == title  # the planted script is text, never run
    page.find("#bundle-file").send_keys(str(changed))
    failed = _wait("the failed verdict", lambda: page.all("#bundle-verdict p.error"), 30)
    assert "Verification failed" in failed[0].text
    problems = page.find("#bundle-verdict ul").text
    assert "event 1 (run.created): its hash recomputes to" in problems
    assert "its prev_hash" not in problems  # the bundle's stored hashes still link up
    assert page.driver.execute_script(requests) == loaded


def _json_of(path: Path) -> str:
    """A bundle file's content as one JSON document (a JSON Lines file's events gathered)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.dumps({"events": [r["value"] for r in lines[1:] if r["record"] == "event"]})


PROVIDER = Path(__file__).resolve().parent / "oidc" / "provider.mjs"
CLIENT_ID = "agentrt-console"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """panva's oidc-provider (tests/e2e/oidc/provider.mjs) on a loopback port, with the
    console (on the port it will listen on) registered as a client: (issuer, console port,
    client secret)."""
    port, console_port = free_port(), free_port()
    secret = new_token()
    callback = f"http://127.0.0.1:{console_port}/sign-in/oidc/callback"
    process = subprocess.Popen(
        ["node", str(PROVIDER), str(port), CLIENT_ID, secret, callback],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("ready "), line
        yield line.split()[1], console_port, secret
    finally:
        process.terminate()
        process.wait(10)


def test_signing_in_with_an_openid_provider(
    seeded: Seeded,
    shared_database_url: str,
    provider: tuple[str, int, str],
    tmp_path: Path,
    shots: Path,
) -> None:
    """The console's sign-in with a provider run here: the browser signs in at the provider
    (its login and consent pages), comes back with a code the console trades for an ID token,
    and the session is the principal the server's [[oidc]] rules make of that token. An
    account no rule admits is refused, and a callback not begun in this browser changes
    nothing."""
    issuer, console_port, secret = provider
    (tmp_path / "console.secret").write_text(secret)
    admin_token = new_token()
    config = tmp_path / "auth.toml"
    config.write_text(
        token_entry("admin-1", admin_token, ["admin"], [], [])
        + f"""
[[oidc]]
issuer = "{issuer}"
audiences = ["{CLIENT_ID}"]
jwks_url = "{issuer}/jwks"
principal = "sso:{{sub}}"

[[oidc.rules]]
claims = {{ sub = "alice" }}
roles = ["auditor"]
namespaces = ["default"]

[console_sign_in]
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
client_secret_file = "console.secret"
authorization_url = "{issuer}/auth"
token_url = "{issuer}/token"
label = "Test SSO"
"""
    )
    with serving(
        shared_database_url, auth_config=str(config), console_listen=f"127.0.0.1:{console_port}"
    ):
        # A server of its own (its auth config names the provider) on the seeded database.
        page = Page(f"http://127.0.0.1:{console_port}", shots)
        try:
            _sign_in_at_provider(page, "alice")
            _wait("the runs list", lambda: page.driver.current_url.endswith("/runs"), 30)
            assert "Signed in as sso:alice" in page.find("header").text
            assert page.all(f"a[href='/runs/{seeded.fix_run}']")
            page.checked("runs-signed-in-with-sso")
            # A callback this browser did not begin: refused, nothing opened.
            page.open("/sign-in/oidc/callback?state=forged&code=anything")
            assert "not begun in this browser" in page.find("main").text
        finally:
            page.close()
        stranger = Page(f"http://127.0.0.1:{console_port}", shots)
        try:
            _sign_in_at_provider(stranger, "mallory")
            refused = _wait("the refusal", lambda: stranger.all("main p.error"), 30)
            assert "admits no one" in refused[0].text
            stranger.open("/runs")
            assert stranger.driver.current_url.split("?")[0].endswith("/sign-in")
        finally:
            stranger.close()


def _sign_in_at_provider(page: Page, login: str) -> None:
    page.open("/sign-in")
    page.checked("sign-in-with-sso")
    page.find("a[href^='/sign-in/oidc']").click()
    _wait("the provider's login", lambda: page.all("input[name=login]"), 30)
    page.find("input[name=login]").send_keys(login)
    page.find("input[name=password]").send_keys("any password")
    page.find("button[type=submit]").click()
    _wait("the provider's consent", lambda: page.all("input[name=prompt][value=consent]"), 30)
    # What the provider's own pages logged (its missing favicon) is not the console's.
    page.driver.get_log("browser")
    page.find("button[type=submit]").click()
