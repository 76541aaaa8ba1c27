"""``agentrt audit …`` as an engineer or a script runs it.

The server runs in-process (``server_address``, SQLite and PostgreSQL) over the history of
:func:`tests.service.test_audit.build_history`; each command runs through the console
script's ``main(argv)`` with its own environment (``cli_support.in_process``), so exit codes,
stdout and the one-line stderr contract are what is tested. Bundles exported here are
verified with no server at all (``AGENTRT_TARGET`` pointing nowhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentrt_base.db_engines import normalise_url
from tests.e2e.cli_support import failure, run, stdout_of
from tests.runtime_support import Stubs
from tests.service.audit_history import History, build_history

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.fresh_server(
        reason="publishes coding_agent with other content per test, and lists its usages"
    ),
]

NOWHERE = "127.0.0.1:1"


@pytest.fixture
def history(stubs: Stubs) -> History:
    return build_history(stubs)


def test_run_tree_artifact_chain_and_json(server_address: str, history: History) -> None:
    h = history
    tree = stdout_of(server_address, "audit", h.run_a)
    lines = tree.splitlines()
    assert lines[0].startswith(f"agent coding_agent@agent_v7 {h.v7}")
    assert "tags at run creation: prod (event 1" in tree and "now: stable" in tree
    assert "4f2c9e1" in tree  # publish provenance: the commit
    assert f"run {h.run_a} COMPLETED" in tree
    assert "agent ref coding_agent:prod -> agent_v7 via tag prod" in tree
    # The server authenticates nobody: every actor is "anonymous", the caller's label beside it.
    assert "attempt 1 " in tree and "worker anonymous (label 'w1') epoch 1" in tree
    assert " by anonymous, ended " in tree
    approved = stdout_of(server_address, "audit", h.run_b)
    assert "approval APPROVE by anonymous (label 'alice')" in approved
    assert f"#1 MODEL_CALL FAILED (RATE_LIMITED)  {h.a_model}" in tree
    assert "model claude-sonnet-4 via primary/anthropic" in tree
    assert "model gpt-4.1 -> reported gpt-4.1-2025" in tree
    assert "skills repo-debug@2.1.0" in tree and "tools read_file@1 ALLOW" in tree
    assert "policy coding-balanced@3" in tree
    # The indentation is the hierarchy: agent > thread > run > attempt > step.
    depth = {
        word: next(len(x) - len(x.lstrip()) for x in lines if x.lstrip().startswith(word))
        for word in ("agent ", "thread ", "run ", "attempt ", "#1 ")
    }
    assert depth["agent "] < depth["thread "] < depth["run "] < depth["attempt "] < depth["#1 "]
    assert stdout_of(server_address, "audit", "run", h.run_a) == tree

    chain = stdout_of(server_address, "audit", "artifact", h.artifact).splitlines()
    assert chain[0].startswith(f'artifact {h.artifact} "app.py"')
    assert chain[1].startswith("  made by step #3 TOOL_CALL read_file SUCCEEDED")
    assert any(x.startswith("  in attempt 1") for x in chain)
    assert any(x.startswith(f"  of run {h.run_a}") for x in chain)
    assert any(x.startswith(f"  agent coding_agent@agent_v7 {h.v7}") for x in chain)

    data = json.loads(stdout_of(server_address, "audit", "artifact", h.artifact, "--json"))
    record = data["records"][0]
    assert record["artifact"]["id"] == h.artifact
    assert record["agent_version"]["digest"] == h.v7
    assert [t["tag"] for t in record["tags_at_run_creation"]] == ["prod", "stable"]
    blob = json.loads(stdout_of(server_address, "audit", "blob", h.blob, "--json"))
    assert len(blob["blob_references"]) == 3

    assert "NOT_FOUND" in failure(server_address, "audit", "run_nope")
    assert "INVALID_ARGUMENT" in failure(server_address, "audit", "blob", "sha256:nope")
    assert "UNAVAILABLE" in failure(NOWHERE, "audit", h.run_a, "--timeout", "2")


def test_usages(server_address: str, history: History) -> None:
    h = history
    lines = stdout_of(server_address, "audit", "usages", "repo-debug@2.1.0").splitlines()
    assert [x.split()[4] for x in lines] == [h.c_model, h.a_fallback, h.a_model]
    assert all("repo-debug@2.1.0 sha256:" in x for x in lines)
    reported = stdout_of(
        server_address, "audit", "usages", "--model", "claude-sonnet-4", "--reported"
    )
    assert [x.split()[4] for x in reported.splitlines()] == [h.b_model]
    schema = stdout_of(server_address, "audit", "usages", "--schema", h.read_file_schema)
    assert len(schema.splitlines()) == 6
    agent = stdout_of(server_address, "audit", "usages", "--agent", h.v7).splitlines()
    assert [x.split()[1] for x in agent] == [h.run_c, h.run_a]
    assert all("(run)" in x for x in agent)
    # --limit pages through; --json carries the token for the rest.
    page = json.loads(
        stdout_of(
            server_address,
            "audit",
            "usages",
            "--schema",
            h.read_file_schema,
            "--limit",
            "4",
            "--json",
        )
    )
    assert len(page["usages"]) == 4 and page["next_page_token"]
    rest = json.loads(
        stdout_of(
            server_address,
            "audit",
            "usages",
            "--schema",
            h.read_file_schema,
            "--page-token",
            page["next_page_token"],
            "--json",
        )
    )
    assert len(rest["usages"]) == 2 and "next_page_token" not in rest
    since = stdout_of(
        server_address,
        "audit",
        "usages",
        "repo-debug@2.1.0",
        "--since",
        h.between_a_and_c.isoformat(),
    )
    assert [x.split()[4] for x in since.splitlines()] == [h.c_model]

    assert "INVALID_ARGUMENT" in failure(server_address, "audit", "usages", "repo-debug@^2.1")
    assert "NOT_FOUND" in failure(server_address, "audit", "usages", "repo-debug@9.9.9")
    assert "--agent" in failure(server_address, "audit", "usages", h.v7)
    failure(server_address, "audit", "usages", code=2)
    failure(server_address, "audit", "usages", "repo-debug@2.1.0", "--model", "x", code=2)
    failure(server_address, "audit", "usages", "--agent", h.v7, "--reported", code=2)
    # argparse's own usage errors: exit 2 with its usage text.
    result = run(server_address, "audit", "usages", "x@1", "--since", "yesterday")
    assert result.returncode == 2 and "not an ISO 8601 time" in result.stderr


def test_verify_bundle_with_the_servers_key(
    server_address: str, history: History, tmp_path: Path
) -> None:
    """Issue 31, item 5: the bundle's run attestation and its agent version's log entry are
    checked offline with the key alone; a bundle rewritten and re-hashed by hand fails."""
    h = history
    key = stdout_of(server_address, "keys").split()[0]
    bundle = tmp_path / "run_a.json"
    run(server_address, "audit", "export", h.run_a, "-o", str(bundle)).check_returncode()
    lines = bundle.with_suffix(".jsonl")
    run(server_address, "audit", "export", h.run_a, "--jsonl", "-o", str(lines)).check_returncode()
    for path in (bundle, lines):
        report = stdout_of(NOWHERE, "audit", "verify-bundle", str(path), "--key", key)
        assert "the run attestation, signed when the run ended" in report
        assert "proven against its signed checkpoint" in report
    # `audit verify FILE --key KEY` is the same check.
    same = stdout_of(NOWHERE, "audit", "verify", str(bundle), "--key", key)
    assert "the run attestation, signed when the run ended" in same

    # Another key: nothing it signed is here.
    other = tmp_path / "other.pem"
    run(NOWHERE, "keygen", str(other)).check_returncode()
    from agentrt_base.signing_keys import load

    stranger = load([str(other)]).named(key.split("+")[0]).signer.verifier.encode()
    message = failure(NOWHERE, "audit", "verify-bundle", str(bundle), "--key", stranger)
    assert "none of the trusted keys" in message

    # A changed attestation payload; an entry proven at another index; no evidence at all
    # (the bundle alone still verifies, but not as the server's record).
    document = json.loads(bundle.read_text())
    document["evidence"]["attestation"]["envelope"]["payload"] = document["evidence"][
        "attestation"
    ]["envelope"]["payload"].replace("A", "B", 1)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(document))
    assert "does not verify" in failure(
        NOWHERE, "audit", "verify-bundle", str(forged), "--key", key
    )
    document = json.loads(bundle.read_text())
    entry = document["evidence"]["registry_log"]["agent_version_entry"]
    entry["index"] += 1
    forged.write_text(json.dumps(document))
    assert "registry log" in failure(NOWHERE, "audit", "verify-bundle", str(forged), "--key", key)
    document = json.loads(bundle.read_text())
    del document["evidence"]
    forged.write_text(json.dumps(document))
    assert "no signed evidence" in failure(
        NOWHERE, "audit", "verify-bundle", str(forged), "--key", key
    )
    assert stdout_of(NOWHERE, "audit", "verify", str(forged)).startswith("bundle")


def test_verify_run_and_bundles_offline(
    server_address: str, history: History, database_url: str, tmp_path: Path
) -> None:
    h = history
    assert stdout_of(server_address, "audit", "verify", h.run_a).startswith(
        f"run {h.run_a}: intact"
    )
    bundle = tmp_path / "run_a.json"
    run(server_address, "audit", "export", h.run_a, "-o", str(bundle)).check_returncode()
    lines = bundle.with_suffix(".jsonl")
    run(server_address, "audit", "export", h.run_a, "--jsonl", "-o", str(lines)).check_returncode()
    # Offline: the target points nowhere, and nothing is contacted.
    for path in (bundle, lines):
        report = stdout_of(NOWHERE, "audit", "verify", str(path))
        assert report.startswith(f"bundle {path}: verified offline")
        assert "8 component digests recompute" in report
    data = json.loads(stdout_of(NOWHERE, "audit", "verify", str(bundle), "--json"))
    assert data["ok"] and data["agent_digest"] == h.v7 and data["failures"] == []
    # To stdout, the same document (exported again, so at another time).
    again = json.loads(run(server_address, "audit", "export", h.run_a).stdout)
    assert {**again, "export_time": ""} == {**json.loads(bundle.read_text()), "export_time": ""}

    document = json.loads(bundle.read_text())
    skill = next(c for c in document["components"] if c["name"] == "repo-debug")
    skill["spec"]["instructions"] = "Skip the tests."
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(document))
    message = failure(NOWHERE, "audit", "verify", str(tampered))
    assert "verification failed: component repo-debug@2.1.0: digest recomputes to" in message

    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(bundle.read_bytes()[:-200])
    assert "truncated" in failure(NOWHERE, "audit", "verify", str(truncated))
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines.read_text().splitlines(keepends=True)[:-3]))
    assert "truncated" in failure(NOWHERE, "audit", "verify", str(cut))
    failure(NOWHERE, "audit", "verify", str(tmp_path / "absent.json"), code=2)
    failure(server_address, "audit", "export", h.run_a, "-o", str(tmp_path / "no/dir/x"), code=2)

    # Tamper with the ledger itself: the server's verification names the event.
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE runtime_events SET attributes_json = '{}' "
                    "WHERE run_id = :r AND sequence = 2"
                ),
                {"r": h.run_a},
            )
    finally:
        engine.dispose()
    message = failure(server_address, "audit", "verify", h.run_a)
    assert f"run {h.run_a}: event chain broken at sequence 2: hash mismatch" in message

    # Tamper with a served row and leave the chain alone: the server names the row and field.
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE runtime_steps SET requested_model_id = 'gpt-evil' WHERE id = :s"),
                {"s": h.c_model},
            )
    finally:
        engine.dispose()
    message = failure(server_address, "audit", "verify", h.run_c)
    assert (
        f'run {h.run_c}: step {h.c_model}: versions.model.requested_model_id is "gpt-evil" '
        "but the chain committed to" in message
    )
