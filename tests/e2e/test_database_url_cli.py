"""The database URL as an operator gives it to the real ``agentrt`` command: a malformed URL is
one line and exit code 3; a password can come from a file instead of the process arguments,
and one given on the command line is warned about."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import URL, make_url

from agentrt_base.db_failures import DatabaseUnavailable
from runtime_service.cli import database_url
from tests.e2e.cli_support import AGENTRT, serve_env, stop, wait_ready
from tests.support import free_port

pytestmark = pytest.mark.e2e

EXIT_CANNOT_START = 3
PASSWORD = "s3cr:t@/pw"


def _run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGENTRT, *args],
        cwd=cwd,
        env=env or serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == EXIT_CANNOT_START, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentrt: ")
    return lines[0]


@pytest.mark.parametrize("url", ["notaurl", "sqlite://x.db", "postgresql://u:pw@h:notaport/d"])
@pytest.mark.parametrize("command", [["serve", "--listen", "127.0.0.1:0"], ["db", "upgrade"]])
def test_a_malformed_url_is_one_line_and_exit_code_3(
    url: str, command: list[str], tmp_path: Path
) -> None:
    line = _one_line(_run(*command, "--database-url", url, cwd=tmp_path))
    assert "sqlite:///" in line and "postgresql://" in line  # says what a URL looks like
    assert ":pw@" not in line
    assert not list(tmp_path.iterdir())  # nothing created


def test_a_password_on_the_command_line_is_warned_about_once(tmp_path: Path) -> None:
    url = URL.create("postgresql", "postgres", PASSWORD, "127.0.0.1", 1, "test").render_as_string(
        hide_password=False
    )
    result = _run("serve", "--listen", "127.0.0.1:0", "--database-url", url, cwd=tmp_path)
    assert result.returncode == EXIT_CANNOT_START
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, result.stderr
    assert "--database-password-file" in warnings[0] and "AGENTRT_DATABASE_URL" in warnings[0]
    assert "s3cr" not in result.stderr


def test_no_warning_without_a_password_on_the_command_line(tmp_path: Path) -> None:
    result = _run(
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        "postgresql://postgres@127.0.0.1:1/test",
        cwd=tmp_path,
    )
    assert result.returncode == EXIT_CANNOT_START
    assert "WARNING" not in result.stderr, result.stderr


@pytest.mark.postgres
def test_serve_takes_the_password_from_a_file_and_not_from_its_arguments(
    postgres_session_url: str, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    env = serve_env()
    env["AGENTRT_DATABASE_URL"] = postgres_session_url
    env["AGENTRT_DATABASE_PASSWORD_FILE"] = str(secret)
    port = free_port()
    process = subprocess.Popen(
        [*AGENTRT, "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = wait_ready(process)
        assert "***" in line and PASSWORD not in line  # the URL it opened, masked
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
        assert PASSWORD not in cmdline
    finally:
        assert stop(process) == 0
        assert process.stderr is not None
        rest = process.stderr.read()
    assert "WARNING" not in rest and PASSWORD not in rest


def test_an_unreadable_password_file_is_one_line_and_exit_code_3(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    line = _one_line(
        _run(
            "db",
            "upgrade",
            "--database-url",
            "postgresql://postgres@127.0.0.1:1/test",
            "--database-password-file",
            str(missing),
            cwd=tmp_path,
        )
    )
    assert str(missing) in line


def test_serve_help_says_where_a_password_should_go(tmp_path: Path) -> None:
    result = _run("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "AGENTRT_DATABASE_URL" in text
    assert "--database-password-file" in text and "AGENTRT_DATABASE_PASSWORD_FILE" in text
    assert "process list" in text


# -- the password file, as a function -------------------------------------------------------


def test_the_files_content_replaces_the_urls_password(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    url = database_url.with_password_from_file(
        "postgresql://app:old@db.example:5433/agentrt", str(secret)
    )
    parsed = make_url(url)
    assert parsed.password == PASSWORD
    assert (parsed.username, parsed.host, parsed.port, parsed.database) == (
        "app",
        "db.example",
        5433,
        "agentrt",
    )
    secret.write_text(" spaced  ")  # kept byte-exact but for one final line break
    assert (
        make_url(database_url.with_password_from_file("postgresql://app@h/d", str(secret))).password
        == " spaced  "
    )


@pytest.mark.parametrize(
    ("content", "url", "says"),
    [
        ("", "postgresql://app@h/d", "is empty"),
        ("pw", "sqlite:///a.db", "SQLite"),
        ("pw", "notaurl", "not a URL"),
    ],
)
def test_a_password_file_that_cannot_be_used_is_refused(
    content: str, url: str, says: str, tmp_path: Path
) -> None:
    secret = tmp_path / "pw"
    secret.write_text(content)
    with pytest.raises(DatabaseUnavailable, match=says):
        database_url.with_password_from_file(url, str(secret))


def test_the_flag_wins_over_the_environment() -> None:
    env = {"AGENTRT_DATABASE_PASSWORD_FILE": "/from/env"}
    assert database_url.password_file("/from/flag", env) == "/from/flag"
    assert database_url.password_file(None, env) == "/from/env"
    assert database_url.password_file(None, {}) is None
