"""The registry log from the command line and from a server's start (issue 31, items 1, 5
and 7): ``agentrt keys`` and ``checkpoint`` print what a stranger verifies with; ``verify``
proves a tag, and catches a tag served at a target it has since left (rollback) and two
histories under one log's name (split view); keys are generated once for a SQLite file,
required on PostgreSQL, rotated with the old key still published; a log keeps its origin.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from agentrt.registry.v1 import registry_service_pb2 as pb
from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt_base.db_engines import normalise_url
from agentrt_core.signed_note import Verifier, open_checkpoint
from runtime_service.listening import StartupError
from tests import registry_data as data
from tests.conftest import _new_database
from tests.e2e.cli_support import ROOT, failure, ok, run
from tests.log_support import publish_agent
from tests.support import ServerThread, signing_key

pytestmark = pytest.mark.e2e

V7 = str(ROOT / "examples" / "coding_agent.yaml")
V8 = str(ROOT / "examples" / "coding_agent_v8.yaml")


def keys_of(target: str) -> list[str]:
    return ok(target, "keys").stdout.split()


def test_keys_and_checkpoint_print_what_a_verifier_needs(server_address: str) -> None:
    keys = keys_of(server_address)
    assert len(keys) == 1
    note = ok(server_address, "checkpoint").stdout
    checkpoint = open_checkpoint(note, [Verifier.parse(keys[0])])
    assert note.startswith(f"{checkpoint.origin}\n{checkpoint.size}\n")
    assert Verifier.parse(keys[0]).name == checkpoint.origin


def _point_tag_back(database_url: str, agent: str, tag: str, digest: str) -> None:
    """What whoever controls the database can do: point the tag at an older target, its
    history and the log untouched."""
    engine = sa.create_engine(normalise_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE registry_tags SET digest = :digest, event_sequence = 1 "
                    "WHERE agent_id = :agent AND name = :tag"
                ),
                {"digest": digest, "agent": agent, "tag": tag},
            )
    finally:
        engine.dispose()


def test_verify_proves_a_tag_and_catches_a_rollback(
    server_address: str, database_url: str, tmp_path: Path
) -> None:
    state = str(tmp_path / "state.json")
    key = keys_of(server_address)[0]
    v7 = ok(server_address, "publish", V7, "--tag", "prod").stdout.split()[0]
    first = ok(server_address, "verify", "coding_agent:prod", "--key", key, "--state", state)
    assert f"verified {v7}" in first.stdout and "first checkpoint seen" in first.stdout
    v8 = ok(server_address, "publish", V8, "--tag", "prod").stdout.split()[0]
    second = ok(server_address, "verify", "coding_agent:prod", "--key", key, "--state", state)
    assert f"verified {v8}" in second.stdout and "consistent with the checkpoint" in second.stdout

    _point_tag_back(database_url, "coding_agent", "prod", v7)
    assert ok(server_address, "show", "coding_agent:prod", "--digest").stdout.strip() == v7
    line = failure(server_address, "verify", "coding_agent:prod", "--state", state)
    assert "NOT VERIFIED: rollback" in line and f"moved to {v8}" in line
    # The pinned key was used (no --key): the state file holds it.
    assert key in Path(state).read_text()


def test_verify_refuses_a_key_it_cannot_read(server_address: str, tmp_path: Path) -> None:
    line = failure(server_address, "verify", "coding_agent@agent_v7", "--key", "x+y+z", code=2)
    assert "--key x+y+z" in line
    other = Verifier.parse(keys_of(server_address)[0])
    wrong = f"{other.name}+00000000+{other.encode().split('+', 2)[2]}"
    line = failure(server_address, "verify", "coding_agent@agent_v7", "--key", wrong, code=2)
    assert "does not match its key" in line


@pytest.fixture
def two_logs(
    engine: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """Two servers on two databases with one key and one origin: one log's name, two
    histories (a server showing different clients different logs)."""
    urls = [
        next(_new_database(engine, request, tmp_path_factory.mktemp("fork"), f"fork{i}"))
        for i in range(2)
    ]
    settings = {"signing_keys": (signing_key(),), "log_origin": "registry.example/fork"}
    servers = [ServerThread(url, step_process=False, **settings) for url in urls]
    for s in servers:
        s.start()
    yield servers[0].address, servers[1].address
    for s in servers:
        s.stop()


def test_verify_catches_a_split_view(two_logs: tuple[str, str], tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    a, b = two_logs
    assert keys_of(a) == keys_of(b)
    for address, agents in ((a, ["shown_to_a"]), (b, ["shown_to_b", "more"])):
        with grpc.insecure_channel(address) as channel:
            stub = registry_service_pb2_grpc.RegistryServiceStub(channel)
            stub.PublishComponent(pb.PublishComponentRequest(component=data.model_policy()))
            for agent in agents:
                publish_agent(stub, agent, "v1")
    ok(a, "verify", "shown_to_a@v1", "--state", state)
    # B's version is in B's log, signed with the one key, but B's log does not extend the
    # one A showed under the same name.
    line = failure(b, "verify", "shown_to_b@v1", "--state", state)
    assert "NOT VERIFIED: split view" in line


def test_a_sqlite_file_generates_its_key_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentrt.db'}"
    keys = []
    for _ in range(2):
        server = ServerThread(url, step_process=False)
        server.start()
        try:
            keys.append(keys_of(server.address))
        finally:
            server.stop()
    assert keys[0] == keys[1]
    generated = tmp_path / "agentrt.db.signing-key.pem"
    assert generated.stat().st_mode & 0o777 == 0o600


def test_rotation_publishes_the_old_key_after_the_new(tmp_path: Path) -> None:
    old, new = tmp_path / "old.pem", tmp_path / "new.pem"
    assert ok("127.0.0.1:9", "keygen", str(old)).stdout.strip() == str(old)
    ok("127.0.0.1:9", "keygen", str(new))
    assert "exists" in failure("127.0.0.1:9", "keygen", str(old), code=2)
    url = f"sqlite:///{tmp_path / 'agentrt.db'}"
    notes: list[tuple[list[str], str]] = []
    for files in [(str(old),), (str(new), str(old))]:
        server = ServerThread(url, step_process=False, signing_keys=files)
        server.start()
        try:
            notes.append((keys_of(server.address), ok(server.address, "checkpoint").stdout))
        finally:
            server.stop()
    (old_keys, old_note), (rotated_keys, new_note) = notes
    assert rotated_keys[1:] == old_keys and rotated_keys[0] != old_keys[0]
    old_key, new_key = Verifier.parse(old_keys[0]), Verifier.parse(rotated_keys[0])
    assert open_checkpoint(old_note, [old_key]).size == open_checkpoint(new_note, [new_key]).size
    with pytest.raises(ValueError, match="none of the trusted keys"):
        open_checkpoint(new_note, [old_key])


def test_start_refusals_name_what_to_fix(
    engine: str, empty_database_url: str, tmp_path: Path
) -> None:
    if engine == "postgres":
        server = ServerThread(empty_database_url, step_process=False, signing_keys=())
        with pytest.raises(StartupError, match="needs --signing-key"):
            server.start()
        server.stop()
    (tmp_path / "public.pem").write_bytes(b"not a key")
    server = ServerThread(
        empty_database_url, step_process=False, signing_keys=(str(tmp_path / "public.pem"),)
    )
    with pytest.raises(StartupError, match=r"public\.pem: not an unencrypted PEM"):
        server.start()
    server.stop()
    first = ServerThread(empty_database_url, step_process=False, log_origin="registry.example/a")
    first.start()
    first.stop()
    moved = ServerThread(empty_database_url, step_process=False, log_origin="registry.example/b")
    with pytest.raises(StartupError, match="keeps its origin"):
        moved.start()
    moved.stop()


def test_run_without_a_server_fails_as_a_client(tmp_path: Path) -> None:
    result = run("127.0.0.1:9", "checkpoint", "--timeout", "2")
    assert result.returncode == 1 and "cannot reach" in result.stderr


def test_card_prints_a_signed_agent_card(server_address: str) -> None:
    import json

    from agentrt_core import agent_card

    ok(server_address, "publish", V7)
    key = Verifier.parse(keys_of(server_address)[0])
    card = json.loads(ok(server_address, "card", "coding_agent@agent_v7").stdout)
    assert agent_card.verify(card, [key]) == [key]
    assert "not found" in failure(server_address, "card", "coding_agent@nope").lower()


def test_a_server_may_not_turn_into_another_log(server_address: str, tmp_path: Path) -> None:
    """The state file remembers which log each target served: a server that later claims to
    be another log (to have its keys pinned afresh on first use) is refused."""
    import json

    ok(server_address, "publish", V7)
    state = tmp_path / "state.json"
    ok(server_address, "verify", "coding_agent@agent_v7", "--state", str(state))
    document = json.loads(state.read_text())
    (origin,) = document["logs"]
    assert document["targets"] == {server_address: origin}
    document["targets"][server_address] = "registry.example/another"
    state.write_text(json.dumps(document))
    line = failure(server_address, "verify", "coding_agent@agent_v7", "--state", str(state))
    assert "served the log 'registry.example/another' before" in line
