"""The README's commands as a newcomer types them.

The PostgreSQL section's three lines are run in the shape the README gives them (``createdb
-h -p -U NAME``, checked to name the database of the URL on the last line; ``agentrt keygen``
of the key file that line names; then ``make serve`` with that URL, that key and the
``AGENTRT_LISTEN`` the README shows), on a database of the test's own: the database name,
the port the server listens on, and where PostgreSQL answers (the suite's admin URL) are put
in.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrt_base.db_engines import normalise_url
from tests.conftest import drop_postgres_database
from tests.e2e.cli_support import (
    AGENTRT,
    ROOT,
    checkout_env,
    in_process,
    serve_env,
    stop,
    stop_group,
    wait_ready,
)
from tests.support import free_port

pytestmark = pytest.mark.e2e

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def _shell_lines(section: str) -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if not line.startswith("#")]


def test_the_two_commands_are_the_newcomers_commands() -> None:
    commands = [line.split("#")[0].strip() for line in _shell_lines(_section("Two commands"))]
    assert commands == ["make serve", "make test"]


@pytest.fixture
def database_name(postgres_admin_url: str) -> Iterator[str]:
    name = f"agentrt_readme_{uuid.uuid4().hex[:12]}"
    yield name
    drop_postgres_database(postgres_admin_url, name)


@pytest.mark.postgres
def test_the_postgresql_lines_serve_from_a_fresh_database(
    postgres_admin_url: str, database_name: str, tmp_path: Path
) -> None:
    createdb, keygen, serve = _shell_lines(_section("PostgreSQL"))
    database_assignment, key_assignment, make = serve.split(" ", 2)
    assert make == "make serve"
    variable, readme_url = database_assignment.split("=", 1)
    assert variable == "AGENTRT_DATABASE_URL"
    key_variable, key_file = key_assignment.split("=", 1)
    assert key_variable == "AGENTRT_SIGNING_KEYS"
    assert shlex.split(keygen) == [".venv/bin/agentrt", "keygen", key_file]
    url = sa.make_url(readme_url)
    # The two lines name the same database.
    assert shlex.split(createdb) == [
        "createdb",
        "-h",
        str(url.host),
        "-p",
        str(url.port),
        "-U",
        str(url.username),
        str(url.database),
    ]
    listen = re.search(r"`AGENTRT_LISTEN=(\S+) make serve`", _section("Two commands"))
    assert listen, "the README says how to change the port"

    admin = normalise_url(postgres_admin_url)
    ours = url.set(
        host=admin.host, port=admin.port or 5432, username=admin.username, database=database_name
    )
    env = serve_env()
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # when run under `make test`
        env.pop(name, None)
    # The README's key, made by its keygen line (in a folder of the test's own), not the
    # tests' shared one.
    key_path = tmp_path / key_file
    made = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "agentrt"), "keygen", str(key_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    env["AGENTRT_SIGNING_KEYS"] = str(key_path)
    if admin.password:
        env["PGPASSWORD"] = admin.password
        ours = ours.set(password=admin.password)
    created = subprocess.run(
        [
            "createdb",
            "-h",
            str(ours.host),
            "-p",
            str(ours.port),
            "-U",
            str(ours.username),
            database_name,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr

    port = free_port()
    host = listen.group(1).rsplit(":", 1)[0]
    env["AGENTRT_LISTEN"] = f"{host}:{port}"
    env["AGENTRT_DATABASE_URL"] = ours.render_as_string(hide_password=False)
    # The console's port too (make serve's default, 8080, may be taken here).
    env["AGENTRT_CONSOLE_LISTEN"] = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        ["make", "serve"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # make and the server it starts are one group to stop
    )
    try:
        ready = wait_ready(process, timeout=120)
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        console = f"http://{env['AGENTRT_CONSOLE_LISTEN']}/"
        assert f"console at {console}" in ready, "make serve prints the console's URL"
        with urllib.request.urlopen(console + "runs", timeout=10) as page:
            assert page.status == 200 and "<h1>Runs</h1>" in page.read().decode()
        # Issue 30's newcomer: `agentrt demo --target` against it, and the demo's runs are
        # on the console's runs list.
        demo = subprocess.run(
            [*AGENTRT, "demo", "--json", "--target", f"{host}:{port}"],
            capture_output=True,
            text=True,
            env=checkout_env(os.environ),
            timeout=180,
            check=False,
        )
        assert demo.returncode == 0, demo.stderr
        with urllib.request.urlopen(console + "runs", timeout=10) as page:
            listed = page.read().decode()
        for run in json.loads(demo.stdout)["runs"]:
            assert f'href="/runs/{run["id"]}"' in listed
    finally:
        assert stop_group(process), "make serve did not exit on SIGTERM"


def test_the_authentication_lines_make_certificates_serve_tls_publish_and_tag(
    tmp_path: Path,
) -> None:
    """Issue 27, items 4 and 5: the README's authentication example, run as written (both of
    its blocks as one bash script, on a free port instead of 50051) in an empty directory
    holding only the checkout's ``.venv`` and ``examples``: its ``openssl`` lines make the CA
    and the server certificate, the server serves TLS with them and a principals file, and the
    tokens it made publish ``examples/coding_agent.yaml`` (the CI token, scoped as the README
    says), move ``prod`` (the release token) and read the versions (team A's), each over TLS
    with the CA the README made. Before, its scope refused the example's components and the
    certificates came from nowhere."""
    section = _section("With authentication")
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 2, "the certificates, then the tokens and the server"
    script = "\n".join(blocks)
    assert script.count("50051") == 2, "the server's --listen and the clients' target"
    port = free_port()
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "readme.sh").write_text(
        "set -euo pipefail\n" + script.replace("50051", str(port)) + '\necho "README DONE"\n'
    )
    env = serve_env()
    for name in ("AGENTRT_TARGET", "AGENTRT_TOKEN", "AGENTRT_TLS_CA", "AGENTRT_AUTH_CONFIG"):
        env.pop(name, None)
    log = tmp_path / "readme.log"
    with log.open("w") as out:
        shell = subprocess.Popen(
            ["bash", "readme.sh"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: the server (its background job) goes with it
        )
        try:
            shell.wait(timeout=180)
        finally:
            stop_group(shell)
    output = log.read_text()
    assert shell.returncode == 0, output
    assert "README DONE" in output, output
    assert "(TLS; callers are authenticated)" in output, output
    assert "created coding_agent@agent_v7" in output, output
    assert re.search(r"^coding_agent:prod -> sha256:[0-9a-f]{64}", output, re.M), output
    # team A's client reads the registry: the version, published by ci, tagged prod.
    assert re.search(r"^agent_v7 .* ci .* prod$", output, re.M), output
    assert "PERMISSION_DENIED" not in output, output


def test_the_sdk_snippet_follows_a_run_to_its_end_printing_event_names(
    server_address: str,
) -> None:
    """Issue 27, item 6: the README's Python snippet printed raw enum numbers (``1 3``) and
    waited forever without a worker (and at WAITING_APPROVAL with one), without saying a worker
    is needed. Run as written (the server address put in) against the module's server, with
    ``coding_agent:prod`` published and ``examples/worker.py`` running as the README says, it
    ends within the time given, having printed names and approved the patch."""
    section = _section("See it work")
    [snippet] = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert snippet.count('"127.0.0.1:50051"') == 1
    assert "examples/worker.py" in section, "the README says a worker is needed"
    env = checkout_env(os.environ)
    for name in ("AGENTRT_TOKEN", "AGENTRT_TLS_CA"):
        env.pop(name, None)
    env["AGENTRT_TARGET"] = server_address
    published = in_process(["publish", "examples/coding_agent.yaml", "--tag", "prod"], env)
    assert published.returncode == 0, published.stderr
    worker = subprocess.Popen(
        [sys.executable, "examples/worker.py"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", snippet.replace("127.0.0.1:50051", server_address)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,  # a snippet that waits forever fails here
        )
    finally:
        stop(worker)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1 EVENT_TYPE_RUN_CREATED", result.stdout
    names = [line.split(" ", 1)[1] for line in lines]
    assert all(name.startswith("EVENT_TYPE_") for name in names), result.stdout
    assert "EVENT_TYPE_APPROVAL_REQUESTED" in names and "EVENT_TYPE_APPROVAL_RESOLVED" in names
    assert names[-1] == "EVENT_TYPE_RUN_ENDED", result.stdout
