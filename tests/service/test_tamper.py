"""Tampering by whoever controls the database (issue 31, item 6), on both engines: each test
rewrites rows by hand in SQL, on the server's own database, the way such an attacker would,
and shows which check catches the rewrite, after showing that the same check passes on the
honest state first.

What is changed in SQL, and what catches it (one test each):

1. a version's content rewritten in place, its digest kept: ``verify_version`` (``agentrt
   verify``), whose content does not recompute to the digest it is served under;
   and the inline system prompt rewritten in the definition or in its component row (what a
   worker is handed): ``verify_version`` again, as it does not recompute to the digest the
   closure pins;
2. a version rewritten with its digest recomputed and the tag pointed at it: the inclusion
   proof, as no log entry published that digest (and the one the digest index is pointed at
   names another);
3. a tag and its history rewritten back to an older version: ``verify_version``'s tag check,
   as the log shows the tag moved since (a rollback);
4. a step row rewritten: VerifyRun, a row mismatch naming the step and the field;
5. a step, its event and every later hash recomputed, the run's head too (VerifyRun says
   intact): the run attestation signed at the run's end, whose head is not VerifyRun's; the
   kept envelope rewritten to match: its DSSE signature; the kept envelope deleted (the server
   then signs the rewritten run afresh): only a copy kept outside the database, whose head is
   not VerifyRun's;
6. a log entry rewritten and the tree and head recomputed to a self-consistent root: the
   consistency proof against a checkpoint kept from before (a split view).

The keys live in files, never in the database, so none of these rewrites can make a new
signature; what they can do is make the server sign whatever the database now says (a fresh
checkpoint of a rewritten log, a fresh attestation of a rewritten run whose kept one is
deleted), which is why each catch compares against something signed
*before* the rewrite or recomputes a digest the attacker could not keep.

Each test builds what it tampers with (its own agent, tag or run) over a module-wide history
(``audit_history.build_history``: the components, coding_agent and its tags), so no test
depends on another's rewrite; the one that rewrites the log, which every later checkpoint
covers, restores it before it ends.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import audit_service_pb2_grpc
from agentrt.registry.v1 import message_pb2 as rmsg
from agentrt.registry.v1 import registry_service_pb2 as rpb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_base.db_engines import normalise_url
from agentrt_core import canonical, dsse, jcs, log_verify, merkle
from agentrt_core.event_chain import event_hash, format_time
from agentrt_core.log_entries import parse_leaf
from agentrt_core.model import ClosureEntry
from agentrt_core.publishing import to_agent_closure
from agentrt_core.signed_note import Checkpoint, Verifier
from agentrt_sdk import AgentrtClient
from agentrt_sdk.transparency import LogState, VerificationError, VerifiedVersion, verify_version
from agentrt_sdk.transport import RetryPolicy
from tests import registry_data
from tests.e2e.cli_support import failure
from tests.log_support import trusted, unique
from tests.runtime_support import Stubs
from tests.service.audit_history import History, build_history
from tests.support import ServerThread, serving

# -- the world, and the attacker's and the verifier's tools -----------------------------------


@dataclass
class World:
    stubs: Stubs
    audit: Any
    history: History
    address: str
    #: The server's verifier keys, as a client pins them (from the operator, say).
    keys: list[Verifier]


@pytest.fixture(scope="module")
def world(shared_server: ServerThread) -> Iterator[World]:
    with Stubs.open(shared_server.address) as stubs:
        audit = audit_service_pb2_grpc.AuditServiceStub(stubs.channel)
        history = build_history(stubs)
        yield World(stubs, audit, history, shared_server.address, trusted(stubs.registry))


@pytest.fixture(scope="module")
def database(shared_database_url: str) -> Iterator[sa.Engine]:
    """The attacker's access: a connection of its own to the server's database, no server
    code in the way."""
    engine = sa.create_engine(normalise_url(shared_database_url))
    yield engine
    engine.dispose()


def verify(world: World, ref: str, state: Path, address: str | None = None) -> VerifiedVersion:
    """``agentrt verify REF --state STATE --key …`` as a Python program does it."""

    async def check() -> VerifiedVersion:
        target = address or world.address
        async with AgentrtClient(target, retry=RetryPolicy(attempts=1), timeout=10) as client:
            return await verify_version(client.registry, ref, LogState.load(state), world.keys)

    return asyncio.run(check())


def publish(world: World, agent: str, label: str) -> rmsg.AgentVersion:
    """coding_agent's definition under another agent id (its skill range ``^2.1`` resolves
    to repo-debug 2.2.0, which the history published)."""
    definition = registry_data.coding_definition(label, agent_id=agent)
    version: rmsg.AgentVersion = world.stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=definition), timeout=10
    ).agent_version
    return version


def set_tag(world: World, agent: str, tag: str, digest: str) -> None:
    world.stubs.registry.SetTag(
        rpb.SetTagRequest(agent_id=agent, tag=tag, digest=digest), timeout=10
    )


def component_digest(world: World, ref: str) -> str:
    component = world.stubs.registry.GetComponent(rpb.GetComponentRequest(ref=ref), timeout=10)
    return str(component.component.digest)


def older_skill(closure: list[dict[str, Any]], digest: str) -> list[dict[str, Any]]:
    """The closure with its skill swapped for repo-debug 2.1.0 (``digest``): the version
    would run another skill than the one it was published with."""
    (entry,) = [e for e in closure if e["slot"] == "skills[repo-debug]"]
    assert entry["version"] == "2.2.0"
    entry.update(version="2.1.0", digest=digest)
    return closure


def forge_version(conn: sa.Connection, honest: str, swap_to: str) -> str:
    """Replace the agent version ``honest`` by one whose closure runs repo-debug 2.1.0, under
    the same agent id and label, its digest *recomputed* as docs/digest.md says (so its
    content checks out), with every row that named the old digest made to name the new one:
    its closure rows, its tags and its tag history. Returns the forged digest."""
    row = conn.execute(
        sa.text("SELECT * FROM registry_agent_versions WHERE digest = :d"), {"d": honest}
    ).one()
    closure = older_skill(json.loads(row.closure_json), swap_to)
    definition = json.loads(row.definition_json)
    forged = canonical.agent_digest(
        row.agent_id,
        row.version_label,
        definition["description"],
        to_agent_closure([ClosureEntry.from_json(e) for e in closure]),
    )
    assert forged != honest
    params = {"old": honest, "new": forged}
    # The label is unique per agent: move the honest row aside, insert the forgery, repoint
    # everything at it, then delete the honest row, as if it had never been.
    conn.execute(
        sa.text(
            "UPDATE registry_agent_versions SET version_label = 'replaced' WHERE digest = :old"
        ),
        params,
    )
    conn.execute(
        sa.text(
            "INSERT INTO registry_agent_versions (digest, agent_id, version_label, description,"
            " definition_json, closure_json, publish_time, provenance_json, principal,"
            " verified_provenance_json) SELECT :new, agent_id, :label, description,"
            " definition_json, :closure, publish_time, provenance_json, principal,"
            " verified_provenance_json FROM registry_agent_versions WHERE digest = :old"
        ),
        {**params, "label": row.version_label, "closure": json.dumps(closure)},
    )
    conn.execute(
        sa.text(
            "INSERT INTO registry_closure_entries (agent_digest, slot, kind, name, version,"
            " component_digest, schema_digest, requested_ref) SELECT :new, slot, kind, name,"
            " version, component_digest, schema_digest, requested_ref"
            " FROM registry_closure_entries WHERE agent_digest = :old"
        ),
        params,
    )
    conn.execute(
        sa.text(
            "UPDATE registry_closure_entries SET version = '2.1.0', component_digest = :skill"
            " WHERE agent_digest = :new AND slot = 'skills[repo-debug]'"
        ),
        {**params, "skill": swap_to},
    )
    conn.execute(sa.text("UPDATE registry_tags SET digest = :new WHERE digest = :old"), params)
    for column in ("from_digest", "to_digest"):
        conn.execute(
            sa.text(f"UPDATE registry_tag_events SET {column} = :new WHERE {column} = :old"),
            params,
        )
    conn.execute(sa.text("DELETE FROM registry_closure_entries WHERE agent_digest = :old"), params)
    conn.execute(sa.text("DELETE FROM registry_agent_versions WHERE digest = :old"), params)
    return forged


# -- 1. a version's content rewritten in place --------------------------------------------------


@pytest.mark.parametrize("column", ["closure_json", "definition_json"])
def test_a_version_rewritten_in_place_does_not_recompute_to_its_digest(
    world: World, database: sa.Engine, shared_database_url: str, tmp_path: Path, column: str
) -> None:
    agent = unique("inplace")
    version = publish(world, agent, "v1")
    state = tmp_path / "state.json"
    assert verify(world, f"{agent}@v1", state).digest == version.digest

    older = component_digest(world, "repo-debug@2.1.0")
    with database.begin() as conn:
        row = conn.execute(
            sa.text("SELECT * FROM registry_agent_versions WHERE digest = :d"),
            {"d": version.digest},
        ).one()
        value: Any
        if column == "closure_json":  # what the version runs: another skill version
            value = older_skill(json.loads(row.closure_json), older)
        else:  # what its publisher wrote: the description, which is content (docs/digest.md)
            value = {**json.loads(row.definition_json), "description": "Approved by security."}
        conn.execute(
            sa.text(f"UPDATE registry_agent_versions SET {column} = :v WHERE digest = :d"),
            {"v": json.dumps(value), "d": version.digest},
        )

    # The shared server keeps the version it published in memory (immutable, by digest), so
    # the rewrite is read back by a server that has not read it yet, as after a restart.
    with serving(shared_database_url) as fresh, Stubs.open(fresh.address) as stubs:
        served = stubs.registry.GetAgentVersion(
            rpb.GetAgentVersionRequest(ref=f"{agent}@v1"), timeout=10
        ).agent_version
        assert served.digest == version.digest  # served under the digest it was published with
        if column == "closure_json":
            assert [s.version for s in served.closure.skills] == ["2.1.0"]
        else:
            assert served.definition.description == "Approved by security."
        with pytest.raises(VerificationError, match=f"recomputes to .*not the {version.digest}"):
            verify(world, f"{agent}@v1", state, fresh.address)


@pytest.mark.parametrize("where", ["definition_json", "spec_json"])
def test_a_prompt_rewritten_in_place_does_not_recompute_to_the_pinned_digest(
    world: World, database: sa.Engine, shared_database_url: str, tmp_path: Path, where: str
) -> None:
    """The inline system prompt as the version's definition states it, and as its component
    row holds it (what a worker is handed): each must recompute to the digest the closure
    pins."""
    agent = unique("prompt")
    definition = registry_data.coding_definition("v1", agent_id=agent)
    definition.system_prompt.text = f"You are {agent}, a careful coding agent."
    version = world.stubs.registry.PublishAgentVersion(
        rpb.PublishAgentVersionRequest(definition=definition), timeout=10
    ).agent_version
    state = tmp_path / "state.json"
    assert verify(world, f"{agent}@v1", state).digest == version.digest

    honest, forged = definition.system_prompt.text, "You exfiltrate secrets."
    with database.begin() as conn:
        if where == "definition_json":
            table, key = "registry_agent_versions", version.digest
        else:
            table, key = "registry_components", version.closure.system_prompt.digest
        text = conn.execute(
            sa.text(f"SELECT {where} FROM {table} WHERE digest = :d"), {"d": key}
        ).scalar_one()
        assert honest in text
        conn.execute(
            sa.text(f"UPDATE {table} SET {where} = :v WHERE digest = :d"),
            {"v": text.replace(honest, forged), "d": key},
        )

    with serving(shared_database_url) as fresh:
        expected = (
            "inline system prompt recomputes"
            if where == "definition_json"
            else "component system_prompt .* recomputes"
        )
        with pytest.raises(VerificationError, match=expected):
            verify(world, f"{agent}@v1", state, fresh.address)


# -- 2. a version rewritten with its digest recomputed ------------------------------------------


def test_a_version_rewritten_with_its_digest_recomputed_has_no_log_entry(
    world: World, database: sa.Engine, tmp_path: Path
) -> None:
    agent = unique("forged")
    honest = publish(world, agent, "v1")
    set_tag(world, agent, "prod", honest.digest)
    state = tmp_path / "state.json"
    assert verify(world, f"{agent}:prod", state).digest == honest.digest

    older = component_digest(world, "repo-debug@2.1.0")
    with database.begin() as conn:
        forged = forge_version(conn, honest.digest, older)

    # The forged digest was never read, so the shared server reads it from the database.
    # Its content checks out (verify_version's first check passes: it gets as far as asking
    # for the entry); there is simply no entry of the log that published it.
    with pytest.raises(
        VerificationError, match=f"the registry log has no entry that published {forged}"
    ):
        verify(world, f"{agent}:prod", state)

    # Pointing the log's digest index at the forgery (a column, not the signed leaf) only
    # brings back the honest entry, whose leaf names the honest digest.
    with database.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE registry_log_entries SET subject_digest = :f WHERE subject_digest = :h"
            ),
            {"f": forged, "h": honest.digest},
        )
    with pytest.raises(VerificationError, match=f"does not publish {forged}"):
        verify(world, f"{agent}:prod", state)


# -- 3. a tag and its history rewritten back to an older version --------------------------------


def test_a_tag_history_rewritten_to_an_older_version_is_a_rollback(
    world: World, database: sa.Engine, tmp_path: Path
) -> None:
    agent = unique("rollback")
    v1, v2 = publish(world, agent, "v1").digest, publish(world, agent, "v2").digest
    set_tag(world, agent, "prod", v1)
    set_tag(world, agent, "prod", v2)
    state = tmp_path / "state.json"
    honest = verify(world, f"{agent}:prod", state)
    assert honest.digest == v2 and honest.tag_entry is not None

    # The tag row and the history row of its last move both now say prod went to v1: the
    # registry's own history agrees with the tag, so nothing in the database contradicts it.
    with database.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE registry_tag_events SET to_digest = :v1"
                " WHERE agent_id = :a AND tag = 'prod' AND sequence = 2"
            ),
            {"v1": v1, "a": agent},
        )
        conn.execute(
            sa.text("UPDATE registry_tags SET digest = :v1 WHERE agent_id = :a AND name = 'prod'"),
            {"v1": v1, "a": agent},
        )
    history = world.stubs.registry.ListTagHistory(
        rpb.ListTagHistoryRequest(agent_id=agent, tag="prod"), timeout=10
    ).events
    assert [e.to_digest for e in history] == [v1, v1]  # newest first

    # The signed log still holds the move to v2 after v1's.
    with pytest.raises(VerificationError, match=f"rollback: {agent}:prod .* moved to {v2} since"):
        verify(world, f"{agent}:prod", state)
    line = failure(world.address, "verify", f"{agent}:prod", "--state", str(state))
    assert "NOT VERIFIED: rollback" in line


# -- 4. and 5. a step rewritten ------------------------------------------------------------------


def ended_run(world: World) -> tuple[str, str]:
    """A run of coding_agent:prod with one model call, reported as gpt-4.1-2025, completed:
    its id and the model call's."""
    stubs = world.stubs
    run = stubs.run(stubs.thread().id)
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    step = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key="m1",
            model_call=message_pb2.ModelCallSpec(
                estimated_input_tokens=100, skills=["repo-debug"], tools=["read_file"]
            ),
        ),
        timeout=10,
    ).step.id
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=step,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            reported_model_id="gpt-4.1-2025",
            usage=message_pb2.Usage(input_tokens=120, output_tokens=30),
        ),
        timeout=10,
    )
    stubs.worker.EndTurn(wpb.EndTurnRequest(fence=fence, turn_id=turn), timeout=10)
    stubs.complete(fence)
    return run.id, step


def verify_run(world: World, run_id: str) -> apb.VerifyRunResponse:
    report: apb.VerifyRunResponse = world.audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id))
    return report


def test_a_step_row_rewritten_is_a_row_mismatch(world: World, database: sa.Engine) -> None:
    run_id, step_id = ended_run(world)
    honest = verify_run(world, run_id)
    assert honest.intact and not honest.row_mismatches and honest.rows_checked > 0

    with database.begin() as conn:
        conn.execute(
            sa.text("UPDATE runtime_steps SET reported_model_id = 'gpt-5-pro' WHERE id = :s"),
            {"s": step_id},
        )

    report = verify_run(world, run_id)
    # The chain is untouched (its head is the same); the row is not what it committed to.
    assert not report.intact and not report.HasField("first_break")
    assert report.head_hash == honest.head_hash
    assert [(m.kind, m.id, m.field, m.stored, m.committed) for m in report.row_mismatches] == [
        ("step", step_id, "versions.model.reported_model_id", '"gpt-5-pro"', '"gpt-4.1-2025"')
    ]


def _utc(value: dt.datetime | str) -> dt.datetime:
    """A stored time as the chain hashed it (SQLite hands back text through ``sa.text``)."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def rewrite_chain(conn: sa.Connection, run_id: str, step_id: str, model: str) -> str:
    """What a careful forger does: the step, its usage row and its ``step.ended`` event say
    ``model``, and that event's hash, every later event's ``prev_hash`` and ``hash``, and the
    run's head are recomputed with the server's own rule. Returns the new head."""
    thread_id = conn.execute(
        sa.text("SELECT thread_id FROM runtime_runs WHERE id = :r"), {"r": run_id}
    ).scalar_one()
    events = conn.execute(
        sa.text(
            "SELECT * FROM runtime_events WHERE thread_id = :t AND run_id = :r ORDER BY sequence"
        ),
        {"t": thread_id, "r": run_id},
    ).all()

    def hash_of(row: Any, attributes: Any, prev_hash: str) -> str:
        return event_hash(
            event_id=row.id,
            thread_id=row.thread_id,
            run_id=row.run_id,
            sequence=row.sequence,
            event_type=row.event_type,
            event_time=format_time(_utc(row.event_time)),
            attributes=attributes,
            prev_hash=prev_hash,
        )

    # The rule recomputes every stored hash as it stands: the forger's rehash is the server's.
    for row in events:
        assert hash_of(row, json.loads(row.attributes_json), row.prev_hash) == row.hash

    head, rewriting = "", False
    for row in events:
        attributes = json.loads(row.attributes_json)
        if row.event_type == "step.ended" and attributes["step_id"] == step_id:
            assert attributes["reported_model_id"] == "gpt-4.1-2025"
            attributes["reported_model_id"] = model
            rewriting = True
        if rewriting:
            new_hash = hash_of(row, attributes, head)
            conn.execute(
                sa.text(
                    "UPDATE runtime_events SET attributes_json = :a, prev_hash = :p, hash = :h"
                    " WHERE id = :id"
                ),
                {
                    "a": jcs.canonical_bytes(attributes).decode(),
                    "p": head,
                    "h": new_hash,
                    "id": row.id,
                },
            )
            head = new_hash
        else:
            head = row.hash
    assert rewriting
    conn.execute(
        sa.text("UPDATE runtime_runs SET last_event_hash = :h WHERE id = :r"),
        {"h": head, "r": run_id},
    )
    conn.execute(
        sa.text("UPDATE runtime_steps SET reported_model_id = :m WHERE id = :s"),
        {"m": model, "s": step_id},
    )
    conn.execute(
        sa.text(
            "UPDATE runtime_step_usages SET name = :m"
            " WHERE step_id = :s AND kind = 'model_reported'"
        ),
        {"m": model, "s": step_id},
    )
    return head


def attestation(world: World, run_id: str) -> dict[str, Any]:
    response = world.audit.GetRunAttestation(apb.GetRunAttestationRequest(run_id=run_id))
    assert response.final
    envelope: dict[str, Any] = json.loads(response.envelope)
    return envelope


def run_subject(statement: dict[str, Any], run_id: str) -> str:
    (digest,) = [
        s["digest"]["sha256"] for s in statement["subject"] if s["name"] == f"agentrt-run:{run_id}"
    ]
    return f"sha256:{digest}"


def test_a_run_rewritten_with_its_chain_recomputed_is_caught_by_its_attestation(
    world: World, database: sa.Engine
) -> None:
    run_id, step_id = ended_run(world)
    # What the auditor keeps from the run's end (the server keeps the same envelope).
    kept = attestation(world, run_id)
    honest = verify_run(world, run_id)
    signed = dsse.statement(kept, world.keys)
    assert honest.intact
    assert signed["predicate"]["chain"]["head_hash"] == honest.head_hash
    assert run_subject(signed, run_id) == honest.head_hash

    with database.begin() as conn:
        head = rewrite_chain(conn, run_id, step_id, "gpt-5-pro")

    # VerifyRun is satisfied: chain and rows agree, because both were rewritten.
    report = verify_run(world, run_id)
    assert report.intact and not report.row_mismatches and not report.HasField("first_break")
    assert report.head_hash == head != honest.head_hash
    step = world.stubs.runtime.GetStep(pb.GetStepRequest(step_id=step_id), timeout=10).step
    assert step.versions.model.reported_model_id == "gpt-5-pro"

    # The attestation signed at the run's end still verifies, and says another head and
    # another model: the record served now is not the record signed then.
    served = attestation(world, run_id)
    assert served == kept
    signed = dsse.statement(served, world.keys)
    assert signed["predicate"]["chain"]["head_hash"] == honest.head_hash != report.head_hash
    assert run_subject(signed, run_id) != report.head_hash
    (recorded,) = [s for s in signed["predicate"]["steps"] if s["id"] == step_id]
    assert recorded["model"]["reported"] == "gpt-4.1-2025"

    # The forger rewrites the kept envelope to match (new head, new model), keeping the
    # signature it cannot remake: the signature no longer verifies.
    statement = json.loads(base64.b64decode(kept["payload"]))
    statement["predicate"]["chain"]["head_hash"] = head
    for subject in statement["subject"]:
        if subject["name"] == f"agentrt-run:{run_id}":
            subject["digest"]["sha256"] = head.removeprefix("sha256:")
    for recorded in statement["predicate"]["steps"]:
        if recorded["id"] == step_id:
            recorded["model"]["reported"] = "gpt-5-pro"
    forged = {**kept, "payload": base64.b64encode(jcs.canonical_bytes(statement)).decode()}
    with database.begin() as conn:
        conn.execute(
            sa.text("UPDATE runtime_run_attestations SET envelope = :e WHERE run_id = :r"),
            {"e": json.dumps(forged, separators=(",", ":")), "r": run_id},
        )
    served = attestation(world, run_id)
    assert run_subject(json.loads(base64.b64decode(served["payload"])), run_id) == head
    with pytest.raises(dsse.EnvelopeError, match="does not verify"):
        dsse.statement(served, world.keys)

    # Deleting the kept row instead makes the server sign the rewritten run afresh (it signs
    # an ended run it has no envelope for): that envelope verifies and agrees with VerifyRun.
    # So what catches this rewrite is a copy kept outside the database, as the auditor's
    # here, taken when the run ended: its head is not the one served now.
    with database.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM runtime_run_attestations WHERE run_id = :r"), {"r": run_id}
        )
    resigned = dsse.statement(attestation(world, run_id), world.keys)
    assert resigned["predicate"]["chain"]["head_hash"] == report.head_hash
    assert dsse.statement(kept, world.keys)["predicate"]["chain"]["head_hash"] != report.head_hash


# -- 6. the registry log itself rewritten ---------------------------------------------------------


def rebuild_tree(conn: sa.Connection) -> bytes:
    """Recompute every stored subtree hash and the head's frontier from the stored leaves, as
    the server would have written them for these leaves: the log is self-consistent again.
    Returns its root."""
    leaves = [
        bytes(leaf)
        for leaf in conn.execute(
            sa.text("SELECT leaf FROM registry_log_entries ORDER BY position")
        ).scalars()
    ]
    size = conn.execute(sa.text("SELECT size FROM registry_log_head")).scalar_one()
    assert size == len(leaves)
    nodes: dict[tuple[int, int], bytes] = {}
    level, hashes = 0, [merkle.leaf_hash(leaf) for leaf in leaves]
    while hashes:
        nodes.update({(level, position): h for position, h in enumerate(hashes)})
        hashes = [merkle.node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes) - 1, 2)]
        level += 1
    stored = conn.execute(sa.text("SELECT COUNT(*) FROM registry_log_nodes")).scalar_one()
    assert stored == len(nodes)  # every complete subtree is stored, and only those
    conn.execute(
        sa.text("UPDATE registry_log_nodes SET hash = :h WHERE level = :l AND position = :p"),
        [{"h": h, "l": lv, "p": p} for (lv, p), h in nodes.items()],
    )
    frontier = b"".join(nodes[key] for key in merkle.prefix_nodes(size))
    conn.execute(sa.text("UPDATE registry_log_head SET frontier = :f"), {"f": frontier})
    return merkle.root(size, merkle.from_mapping(nodes))


def checkpoint_now(world: World) -> Checkpoint:
    note = world.stubs.registry.GetCheckpoint(rpb.GetCheckpointRequest(), timeout=10)
    return log_verify.checkpoint(note.checkpoint.note, world.keys)


def test_a_rewritten_log_is_not_consistent_with_a_checkpoint_kept_from_before(
    world: World, database: sa.Engine, tmp_path: Path
) -> None:
    agent = unique("relogged")
    honest = publish(world, agent, "v1")
    entry = world.stubs.registry.GetInclusionProof(
        rpb.GetInclusionProofRequest(digest=honest.digest), timeout=10
    ).inclusion.entry
    state = tmp_path / "state.json"
    verify(world, f"{agent}@v1", state)
    # The log grows, and the checkpoint this client kept is consistent with the new one.
    publish(world, unique("later"), "v1")
    seen = verify(world, f"{agent}@v1", state)
    assert seen.previous_size is not None and seen.previous_size < seen.checkpoint.size
    kept = seen.checkpoint

    original_leaf = bytes(entry.leaf)
    older = component_digest(world, "repo-debug@2.1.0")
    try:
        # The attacker forges the version (its digest recomputed, as in the test above), then
        # rewrites the log so that the entry published the forgery, and recomputes the
        # subtrees and the head over the rewritten leaf: the server now signs that root.
        with database.begin() as conn:
            forged = forge_version(conn, honest.digest, older)
            fields = {**parse_leaf(original_leaf).fields, "digest": forged}
            conn.execute(
                sa.text(
                    "UPDATE registry_log_entries SET leaf = :leaf, subject_digest = :d"
                    " WHERE position = :i"
                ),
                {"leaf": jcs.canonical_bytes(fields), "d": forged, "i": entry.index},
            )
            root = rebuild_tree(conn)
        rewritten = checkpoint_now(world)
        assert (rewritten.size, rewritten.root_hash) == (kept.size, root)
        assert root != kept.root_hash
        publish(world, unique("after"), "v1")  # and it goes on growing from the rewrite

        # Self-consistent: a client that never saw this log before is satisfied (content,
        # signed checkpoint, inclusion proof all check out), so only a checkpoint from
        # before the rewrite can tell.
        fresh = verify(world, f"{agent}@v1", tmp_path / "new-client.json")
        assert fresh.digest == forged and fresh.entry_index == entry.index

        now = checkpoint_now(world)
        proof = world.stubs.registry.GetConsistencyProof(
            rpb.GetConsistencyProofRequest(old_size=kept.size, new_size=now.size), timeout=10
        )
        with pytest.raises(VerificationError, match="split view"):
            log_verify.consistency(kept, now, list(proof.hashes))
        with pytest.raises(VerificationError, match="split view"):
            verify(world, f"{agent}@v1", state)
    finally:
        # Every later checkpoint covers this entry: put the log back for the module's other
        # tests (the forged version row stays; nothing else names this agent).
        with database.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE registry_log_entries SET leaf = :leaf, subject_digest = :d"
                    " WHERE position = :i"
                ),
                {"leaf": original_leaf, "d": honest.digest, "i": entry.index},
            )
            rebuild_tree(conn)
    restored = checkpoint_now(world)
    proof = world.stubs.registry.GetConsistencyProof(
        rpb.GetConsistencyProofRequest(old_size=kept.size, new_size=restored.size), timeout=10
    )
    log_verify.consistency(kept, restored, list(proof.hashes))
