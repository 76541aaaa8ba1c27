"""The registry commands as a CI job runs them, against a real server.

The server runs in-process (``server_address``, on SQLite and PostgreSQL). Each command runs
through the console script's ``main(argv)`` in this process (``cli_support.in_process``), with
its own environment, so exit codes, stdout and the one-line stderr contract are what is
tested; the example files' header commands and the CI script run ``.venv/bin/agentrt`` as
real processes, as a newcomer and a CI job do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli_support import ROOT, cli_env, failure, ok, run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.fresh_server(
        reason="publishes coding_agent under labels its other tests publish with other content,"
        " and lists every version"
    ),
]

EXAMPLES = ROOT / "examples"
V7 = str(EXAMPLES / "coding_agent.yaml")
V8 = str(EXAMPLES / "coding_agent_v8.yaml")
ABSENT = "sha256:" + "0" * 64
#: What ``make serve`` installs (``make setup`` makes the same .venv).
VENV_AGENTRT = ROOT / ".venv" / "bin" / "agentrt"


def digest_of(result: subprocess.CompletedProcess[str]) -> str:
    first = result.stdout.splitlines()[0]
    assert first.startswith("sha256:") and len(first) == 71, result.stdout
    return first


def test_offline_digest_equals_published_digest_and_republish_is_idempotent(
    server_address: str,
) -> None:
    offline = digest_of(ok(server_address, "digest", V7))
    first = ok(server_address, "publish", V7)
    assert digest_of(first) == offline
    assert first.stdout.strip() == offline  # the digest alone, for $(agentrt publish …)
    assert first.stderr.strip().splitlines()[-1] == "created coding_agent@agent_v7"
    again = ok(server_address, "publish", V7, "--verbose")
    assert digest_of(again) == offline
    stderr = again.stderr.strip().splitlines()
    assert stderr[-1] == "unchanged coding_agent@agent_v7"
    assert "read_file@1  sha256:" in again.stderr and "unchanged" in stderr[0]
    # v8 only declares apply_patch@3: offline it needs the v7 file, online the server.
    v8_offline = digest_of(ok(server_address, "digest", V8, "--with", V7))
    assert digest_of(ok(server_address, "digest", V8, "--target", server_address)) == v8_offline
    assert digest_of(ok(server_address, "publish", V8)) == v8_offline


def test_digest_without_the_referenced_components_names_the_reference(
    server_address: str,
) -> None:
    # Offline the file alone is incomplete (exit 2); the server, asked, has none (exit 1).
    line = failure(server_address, "digest", V8, code=2)
    assert "agent.model_policy: 'coding-balanced@3'" in line
    assert "--with" in line and "agentrt publish" in line
    line = failure(server_address, "digest", V8, "--target", server_address, code=1)
    assert "agent.model_policy: 'coding-balanced@3'" in line and server_address in line


def test_a_rule_violation_in_the_file_is_a_bad_file_for_digest_and_publish(
    server_address: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(V7).read_text().replace("name: read_file\n", "name: Read File\n", 1))
    lines = {
        failure(server_address, command, str(bad), code=2) for command in ("digest", "publish")
    }
    assert lines == {
        f"agentrt: {bad}: components[1].name: 'Read File' is not a valid name: 1-64 of a-z 0-9 "
        "_ -, starting with a letter"
    }
    assert failure(server_address, "versions", "coding_agent").startswith("agentrt: NOT_FOUND")


def test_republishing_with_other_provenance_says_the_recorded_one_is_kept(
    server_address: str,
) -> None:
    first = ok(server_address, "publish", V7, "--publisher", "alice", "--commit", "abc")
    assert "warning" not in first.stderr
    again = ok(server_address, "publish", V7, "--publisher", "bob", "--commit", "def")
    assert again.stdout.strip() == first.stdout.strip()
    assert again.stderr.strip().splitlines()[-2:] == [
        "unchanged coding_agent@agent_v7",
        "agentrt: warning: coding_agent@agent_v7 was published before and keeps its recorded "
        'provenance (publisher "alice", commit "abc"); this publish\'s publisher "bob", '
        'commit "def" were not recorded',
    ]
    shown = json.loads(ok(server_address, "show", "coding_agent@agent_v7", "--json").stdout)
    provenance = shown["agent_version"]["publish"]["provenance"]
    assert (provenance["publisher"], provenance["commit"]) == ("alice", "abc")
    # The same statement again is no news: no warning.
    same = ok(server_address, "publish", V7, "--publisher", "alice", "--commit", "abc")
    assert "warning" not in same.stderr


def test_different_content_under_a_taken_label_fails_naming_the_existing_digest(
    server_address: str, tmp_path: Path
) -> None:
    published = digest_of(ok(server_address, "publish", V7))
    changed = tmp_path / "changed.yaml"
    text = Path(V7).read_text()
    changed.write_text(text.replace("hands back a reviewed diff", "hands back a diff"))
    line = failure(server_address, "publish", str(changed))
    assert line.startswith("agentrt: ALREADY_EXISTS: ")
    assert "coding_agent@agent_v7" in line and published in line
    component = tmp_path / "component.yaml"
    component.write_text(text.replace("maximum: 3600", "maximum: 7200"))
    line = failure(server_address, "publish", str(component))
    assert line.startswith("agentrt: ALREADY_EXISTS: ") and "run_tests@1" in line


def test_tags_move_by_compare_and_swap(server_address: str) -> None:
    v7 = digest_of(ok(server_address, "publish", V7))
    created = ok(server_address, "tag", "coding_agent", "prod", v7, "--expect-absent")
    assert created.stdout.strip() == f"coding_agent:prod -> {v7} (event 1)"
    # Already there, even at the same digest: --expect-absent means absent, and nothing is
    # written (the server's retry-safe success with no event is not taken as one).
    line = failure(server_address, "tag", "coding_agent", "prod", v7, "--expect-absent")
    assert line == (
        f"agentrt: FAILED_PRECONDITION: tag coding_agent:prod already exists (at {v7}, "
        "event 1); --expect-absent requires that it does not"
    )
    again = ok(server_address, "tag", "coding_agent", "prod", v7)
    assert again.stdout.strip() == f"coding_agent:prod -> {v7} (unchanged, event 1)"
    v8 = digest_of(ok(server_address, "publish", V8))
    line = failure(server_address, "tag", "coding_agent", "prod", v8, "--expect-absent")
    assert line.startswith("agentrt: FAILED_PRECONDITION: ") and v7 in line
    line = failure(server_address, "tag", "coding_agent", "prod", v8, "--expect", ABSENT)
    assert line.startswith("agentrt: FAILED_PRECONDITION: ") and v7 in line
    moved = ok(server_address, "tag", "coding_agent", "prod", "agent_v8", "--expect", v7)
    assert moved.stdout.strip() == f"coding_agent:prod -> {v8} (event 2)"
    retried = ok(server_address, "tag", "coding_agent", "prod", v8, "--expect", v7)
    assert retried.stdout.strip() == f"coding_agent:prod -> {v8} (unchanged, event 2)"
    # publish --tag: the version is published even when the tag expectation fails.
    result = run(server_address, "publish", V7, "--tag", "prod", "--expect", v7)
    assert result.returncode == 1
    assert result.stdout.strip() == v7
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("agentrt: coding_agent@agent_v7 is published")
    )
    canary = ok(server_address, "publish", V7, "--tag", "canary", "--expect-absent")
    assert f"coding_agent:canary -> {v7} (event 3)" in canary.stderr
    result = run(server_address, "publish", V7, "--tag", "canary", "--expect-absent")
    assert result.returncode == 1 and result.stdout.strip() == v7
    assert result.stderr.strip().splitlines()[-1] == (
        f"agentrt: coding_agent@agent_v7 is published ({v7}) but tag 'canary' was not moved: "
        f"FAILED_PRECONDITION: tag coding_agent:canary already exists (at {v7}, event 3); "
        "--expect-absent requires that it does not"
    )
    # A tag reference as DIGEST copies where it points.
    copied = ok(server_address, "tag", "coding_agent", "stable", "coding_agent:canary")
    assert copied.stdout.strip() == f"coding_agent:stable -> {v7} (event 4)"


def test_show_diff_and_versions(server_address: str) -> None:
    v7 = digest_of(
        ok(
            server_address,
            "publish",
            V7,
            "--tag",
            "prod",
            "--label",
            "build=17",
            GITHUB_REPOSITORY="acme/agents",
            GITHUB_SHA="abc123",
            GITHUB_RUN_ID="99",
            GITHUB_ACTOR="release-bot",
        )
    )
    v8 = digest_of(ok(server_address, "publish", V8, "--publisher", "alice", "--commit", "def"))

    shown = ok(server_address, "show", "coding_agent:prod").stdout
    assert f"digest       {v7}" in shown
    assert "resolved     coding_agent:prod (tag prod, event 1)" in shown
    # Nobody is authenticated (no auth config): the principal is anonymous, and the name the
    # publisher gave is shown as what it is, a label.
    assert "published" in shown and 'by anonymous (says "release-bot")' in shown
    assert "verified     no (self-declared provenance only)" in shown
    assert "source       https://github.com/acme/agents" in shown
    assert "pipeline     https://github.com/acme/agents/actions/runs/99" in shown
    assert "labels       build=17" in shown
    lines = shown.splitlines()
    read_file = next(line for line in lines if "tools[read_file]" in line).split()
    assert read_file[:2] == ["tools[read_file]", "read_file@1"]
    assert read_file[2].startswith("sha256:") and read_file[3:4] == ["schema"]
    assert any("(requested repo-debug@^2.1)" in line for line in lines)

    as_json = json.loads(ok(server_address, "show", "coding_agent@agent_v8", "--json").stdout)
    assert as_json["agent_version"]["digest"] == v8
    assert as_json["agent_version"]["publish"]["provenance"]["publisher"] == "alice"
    assert as_json["resolution"]["kind"] == "REFERENCE_KIND_LABEL"
    assert ok(server_address, "show", v8, "--digest").stdout.strip() == v8

    diff = ok(server_address, "diff", "coding_agent@agent_v7", "coding_agent@agent_v8").stdout
    changes = diff.strip().splitlines()
    assert len(changes) == 1
    assert changes[0].startswith("MODIFIED tools[apply_patch]  apply_patch@2 sha256:")
    assert " -> apply_patch@3 sha256:" in changes[0] and "(schema sha256:" in changes[0]
    same = ok(server_address, "diff", "coding_agent:prod", "coding_agent@agent_v7")
    assert same.stdout.strip() == "identical"
    diff_json = json.loads(ok(server_address, "diff", v7, v8, "--json").stdout)
    assert [c["path"] for c in diff_json["changes"]] == ["tools[apply_patch]"]

    versions = ok(server_address, "versions", "coding_agent").stdout.strip().splitlines()
    assert [line.split()[:2] for line in versions] == [["agent_v8", v8], ["agent_v7", v7]]
    assert versions[1].split()[-1] == "prod" and versions[0].split()[-1] == "-"
    listed = json.loads(ok(server_address, "versions", "coding_agent", "--json").stdout)
    assert [v["version_label"] for v in listed["agent_versions"]] == ["agent_v8", "agent_v7"]


def test_failures_are_one_line(server_address: str, tmp_path: Path) -> None:
    assert "NOT_FOUND" in failure(server_address, "show", "coding_agent@agent_v99")
    assert "INVALID_ARGUMENT" in failure(server_address, "show", "coding_agent")
    # An unknown agent is an error in both formats, not an empty success.
    for extra in ((), ("--json",)):
        result = run(server_address, "versions", "no_such_agent", *extra)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.strip() == (
            "agentrt: NOT_FOUND: agent 'no_such_agent' has no published versions"
        )
    line = failure(server_address, "publish", str(tmp_path / "missing.yaml"), code=2)
    assert "cannot read" in line
    bad = tmp_path / "bad.yaml"
    bad.write_text("components:\n  - {kind: TOOL, name: t, version: 2.1, spec: {}}\n")
    assert "quote the version" in failure(server_address, "digest", str(bad), code=2)
    line = failure("127.0.0.1:1", "versions", "coding_agent")
    assert line.startswith("agentrt: UNAVAILABLE: cannot reach 127.0.0.1:1")
    line = failure(server_address, "publish", V7, "--expect-absent", code=2)
    assert "--tag" in line


def test_a_target_without_a_port_dials_the_agentrt_port() -> None:
    # .invalid never resolves (RFC 6761), so the line names the address that was dialled.
    line = failure("no-such-host.invalid", "versions", "coding_agent", "--timeout", "10")
    assert line.startswith("agentrt: UNAVAILABLE: cannot reach no-such-host.invalid:50051: ")


def _after_make_serve(target: str) -> dict[str, str]:
    """The environment of a newcomer after ``make serve``: this checkout's .venv exists, and
    no ``agentrt`` is on PATH."""
    assert VENV_AGENTRT.is_file(), f"{VENV_AGENTRT} is missing: run make setup"
    env = cli_env(target)
    env["PATH"] = os.pathsep.join(["/usr/bin", "/bin"])
    env.pop("AGENTRT", None)
    assert shutil.which("agentrt", path=env["PATH"]) is None
    return env


def test_the_example_files_header_commands_work_after_make_serve(server_address: str) -> None:
    env = _after_make_serve(server_address)
    digests = []
    for example in (V7, V8):
        header = Path(example).read_text().split("\ncomponents:")[0]
        commands = [
            line.removeprefix("#").strip()
            for line in header.splitlines()
            if line.removeprefix("#").strip().startswith(".venv/bin/agentrt ")
        ]
        assert [c.split()[1] for c in commands] == ["digest", "publish"], header
        for command in commands:
            result = subprocess.run(
                ["bash", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True
            )
            assert result.returncode == 0, (command, result.stderr)
            digests.append(digest_of(result))
    # Each file's offline digest is what its publish stored.
    assert digests[0] == digests[1] and digests[2] == digests[3]


def test_ci_publish_script_end_to_end_and_again(server_address: str, tmp_path: Path) -> None:
    env = _after_make_serve(server_address)
    for attempt in ("fresh database", "re-run"):
        result = subprocess.run(
            ["bash", str(EXAMPLES / "ci_publish.sh")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"{attempt}:\n{result.stdout}\n{result.stderr}"
        assert "MODIFIED tools[apply_patch]" in result.stdout
        assert "== done: coding_agent:prod is sha256:" in result.stdout
    v8 = ok(server_address, "show", "coding_agent@agent_v8", "--digest").stdout.strip()
    assert ok(server_address, "show", "coding_agent:prod", "--digest").stdout.strip() == v8
