"""VerifyRun checks every row the read APIs serve against what the run's event chain committed
to, and names the row (kind and id) and the field that differ (docs/audit.md, "What VerifyRun
checks"). A row changed in the database is still served (GetStep, GetProvenance show it):
VerifyRun, and a bundle exported afterwards, are what tell."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.runtime.v1 import enum_pb2, message_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt.runtime.v1 import worker_service_pb2 as wpb
from agentrt_core import audit_bundle
from tests.runtime_support import Stubs
from tests.service.audit_history import Env, build_history
from tests.service.steps_support import args, get_step, put_blob

pytestmark = pytest.mark.fresh_server(
    reason="tampers with rows and verifies every run the database holds"
)


@dataclass
class Live:
    """Run D, left RUNNING: labels, an amendment, a steer delivered to a model call with
    usage, a follow-up still pending, a tool call and an artifact with labels."""

    run_id: str
    model: str
    tool: str
    steer: str
    follow_up: str
    artifact: str


def build_live_run(stubs: Stubs) -> Live:
    run = stubs.run(stubs.thread().id, labels={"team": "core"})
    fence = stubs.acquire().fence
    turn = stubs.worker.BeginTurn(wpb.BeginTurnRequest(fence=fence), timeout=10).turn.id
    stubs.runtime.AmendRun(
        pb.AmendRunRequest(
            run_id=run.id,
            amendment=message_pb2.Amendment(
                added_constraints=["no new dependencies"], note="from review"
            ),
            actor="bob",
        ),
        timeout=10,
    )
    steer = stubs.runtime.SendInput(
        pb.SendInputRequest(
            run_id=run.id, kind=enum_pb2.INPUT_KIND_STEER, content="keep it small", sender="bob"
        ),
        timeout=10,
    ).input.id
    spec = message_pb2.ModelCallSpec(
        estimated_input_tokens=100, skills=["repo-debug"], tools=["read_file"]
    )
    model = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_MODEL_CALL,
            idempotency_key="m1",
            model_call=spec,
        ),
        timeout=10,
    ).step.id
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=model,
            status=enum_pb2.STEP_STATUS_SUCCEEDED,
            summary="planned",
            usage=message_pb2.Usage(input_tokens=120, output_tokens=30, cost_usd=0.0125),
            reported_model_id="gpt-4.1-2025",
        ),
        timeout=10,
    )
    tool = stubs.worker.BeginStep(
        wpb.BeginStepRequest(
            fence=fence,
            turn_id=turn,
            type=enum_pb2.STEP_TYPE_TOOL_CALL,
            idempotency_key="r1",
            tool_call=message_pb2.ToolCallSpec(tool="read_file", arguments=args(path="a.py")),
        ),
        timeout=10,
    ).step.id
    blob = put_blob(stubs, b"print('a')\n").blob.digest
    stubs.worker.EndStep(
        wpb.EndStepRequest(
            fence=fence,
            step_id=tool,
            status=enum_pb2.STEP_STATUS_FAILED,
            output_ref=blob,
            error_class=enum_pb2.ERROR_CLASS_TOOL_ERROR,
            error_message="flaky",
            retryable=True,
        ),
        timeout=10,
    )
    artifact = stubs.worker.CreateArtifact(
        wpb.CreateArtifactRequest(
            fence=fence, step_id=tool, name="a.py", blob_digest=blob, labels={"kind": "src"}
        ),
        timeout=10,
    ).artifact.id
    follow_up = stubs.runtime.SendInput(
        pb.SendInputRequest(
            run_id=run.id,
            kind=enum_pb2.INPUT_KIND_FOLLOW_UP,
            content="then update the docs",
            sender="bob",
            data=args(ticket="T-1"),
        ),
        timeout=10,
    ).input.id
    return Live(run.id, model, tool, steer, follow_up, artifact)


def verify(env: Env, run_id: str) -> Any:
    return env.audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id), timeout=30)


def mismatches(report: Any) -> set[tuple[str, str, str]]:
    return {(m.kind, m.id, m.field) for m in report.row_mismatches}


def sql(env: Env, statement: str, **params: Any) -> None:
    database = env.server.server.database
    assert database is not None
    database.write_sync(lambda session: session.execute(sa.text(statement), params))


def attempts(env: Env, run_id: str) -> list[Any]:
    return list(env.stubs.runtime.ListAttempts(pb.ListAttemptsRequest(run_id=run_id)).attempts)


def bundle_failures(env: Env, run_id: str) -> list[str]:
    parts = env.audit.ExportBundle(apb.ExportBundleRequest(run_id=run_id), timeout=30)
    data = b"".join(p.chunk for p in parts if p.WhichOneof("part") == "chunk")
    return audit_bundle.verify_bundle(audit_bundle.decode(data)).failures


def test_untampered_runs_are_intact_row_by_row(env: Env) -> None:
    h = build_history(env.stubs)
    live = build_live_run(env.stubs)
    for run_id in (h.run_a, h.run_b, h.run_c, live.run_id):
        report = verify(env, run_id)
        assert report.intact, list(report.row_mismatches)
        assert not report.row_mismatches and not report.not_covered
        assert not report.HasField("first_break")
    # Every row of run B is checked: the run, 2 attempts, its steps, 1 checkpoint, 1 input,
    # and its steps' usage index rows.
    steps_b = env.stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=h.run_b)).steps
    usages_b = _scalar(
        env,
        "SELECT count(*) FROM runtime_step_usages u JOIN runtime_steps s ON s.id = u.step_id"
        " WHERE s.run_id = :i",
        i=h.run_b,
    )
    assert usages_b > 0
    assert verify(env, h.run_b).rows_checked == 1 + 2 + len(steps_b) + 1 + 1 + usages_b
    assert bundle_failures(env, live.run_id) == []


def test_a_tampered_row_of_every_kind_is_named_with_its_field(env: Env) -> None:
    h = build_history(env.stubs)
    live = build_live_run(env.stubs)
    resumed = attempts(env, h.run_b)[1]
    assert resumed.reason == enum_pb2.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL

    # Run A: its binding, a step's resolved model, a step's tool arguments, its artifact.
    sql(
        env,
        "UPDATE runtime_runs SET agent_requested_ref = 'coding_agent:canary' WHERE id = :i",
        i=h.run_a,
    )
    sql(
        env,
        "UPDATE runtime_steps SET requested_model_id = 'gpt-evil' WHERE id = :i",
        i=h.a_fallback,
    )
    sql(
        env,
        "UPDATE runtime_steps SET tool_arguments_json = :a WHERE id = :i",
        a='{"path":"/etc/passwd"}',
        i=h.a_read,
    )
    sql(
        env,
        "UPDATE runtime_artifacts SET labels_json = :l WHERE id = :i",
        l='{"kind":"secret"}',
        i=h.artifact,
    )
    # Run B: the resumed attempt's worker, the approval's approver, the checkpoint, the steer.
    sql(env, "UPDATE runtime_attempts SET worker_id = 'w-evil' WHERE id = :i", i=resumed.id)
    sql(env, "UPDATE runtime_steps SET approver = 'mallory' WHERE id = :i", i=h.b_approval)
    sql(env, "UPDATE runtime_checkpoints SET after_sequence = 99 WHERE id = :i", i=h.checkpoint)
    steer_b = env.stubs.runtime.GetStep(pb.GetStepRequest(step_id=h.b_model)).step
    (steer_b_id,) = steer_b.consumed_input_ids
    sql(env, "UPDATE runtime_inputs SET sender = 'mallory' WHERE id = :i", i=steer_b_id)
    # Run D (live): an amendment, a step's usage, a follow-up's content, the run's labels.
    run_d = env.stubs.runtime.GetRun(pb.GetRunRequest(run_id=live.run_id)).run
    stored = json.loads(
        _scalar(env, "SELECT amendments_json FROM runtime_runs WHERE id = :i", i=live.run_id)
    )
    stored[0]["note"] = "nothing happened"
    sql(
        env,
        "UPDATE runtime_runs SET amendments_json = :a WHERE id = :i",
        a=json.dumps(stored),
        i=live.run_id,
    )
    sql(env, "UPDATE runtime_steps SET input_tokens = 5 WHERE id = :i", i=live.model)
    sql(
        env,
        "UPDATE runtime_inputs SET content = 'delete everything' WHERE id = :i",
        i=live.follow_up,
    )
    sql(
        env,
        "UPDATE runtime_runs SET labels_json = :l WHERE id = :i",
        l='{"team":"other"}',
        i=live.run_id,
    )
    assert run_d.labels == {"team": "core"}

    a, b, d = verify(env, h.run_a), verify(env, h.run_b), verify(env, live.run_id)
    assert mismatches(a) == {
        ("run", h.run_a, "agent.requested_ref"),
        ("step", h.a_fallback, "versions.model.requested_model_id"),
        ("step", h.a_read, "tool_arguments"),
        ("artifact", h.artifact, "labels.kind"),
    }
    assert mismatches(b) == {
        ("attempt", resumed.id, "worker_id"),
        ("step", h.b_approval, "approval.approver"),
        ("checkpoint", h.checkpoint, "after_sequence"),
        ("input", steer_b_id, "sender"),
    }
    assert mismatches(d) == {
        ("run", live.run_id, "amendments[0].note"),
        ("run", live.run_id, "labels.team"),
        ("step", live.model, "usage.input_tokens"),
        ("input", live.follow_up, "content"),
    }
    for report in (a, b, d):
        # The chain itself still verifies: only the rows were changed.
        assert not report.intact and not report.HasField("first_break")
    # Stored and committed values are JSON, so an auditor sees both sides.
    model = next(m for m in a.row_mismatches if m.id == h.a_fallback)
    assert (json.loads(model.stored), json.loads(model.committed)) == ("gpt-evil", "gpt-4.1")
    approver = next(m for m in b.row_mismatches if m.id == h.b_approval)
    assert (json.loads(approver.stored), json.loads(approver.committed)) == ("mallory", "alice")
    usage = next(m for m in d.row_mismatches if m.id == live.model)
    assert (json.loads(usage.stored), json.loads(usage.committed)) == ("5", "120")
    # Run C was not touched.
    assert verify(env, h.run_c).intact

    # The read APIs serve what is stored: VerifyRun is what tells.
    served = get_step(env.stubs, h.a_fallback)
    assert served.versions.model.requested_model_id == "gpt-evil"
    provenance = env.audit.GetProvenance(apb.GetProvenanceRequest(step_id=h.a_fallback))
    assert provenance.records[0].step.versions.model.requested_model_id == "gpt-evil"
    assert provenance.records[0].run.agent.requested_ref == "coding_agent:canary"

    # A bundle exported now fails with the same rows (the same comparison).
    failures = bundle_failures(env, h.run_a)
    assert any(h.a_fallback in f and "versions.model.requested_model_id" in f for f in failures)
    assert any(h.artifact in f and "labels.kind" in f for f in failures)


def test_rows_without_their_events_and_events_without_their_rows(env: Env) -> None:
    h = build_history(env.stubs)
    # A forged artifact row (a copy under a new id) that no event records, and a checkpoint
    # row deleted although its event records it.
    sql(
        env,
        "INSERT INTO runtime_artifacts (id, run_id, thread_id, attempt_id, step_id, name,"
        " blob_digest, media_type, size, labels_json, create_time, request_id)"
        " SELECT 'art_forged', run_id, thread_id, attempt_id, step_id, 'evil.py', blob_digest,"
        " media_type, size, labels_json, create_time, NULL FROM runtime_artifacts WHERE id = :i",
        i=h.artifact,
    )
    sql(env, "DELETE FROM runtime_checkpoints WHERE id = :i", i=h.checkpoint)
    a, b = verify(env, h.run_a), verify(env, h.run_b)
    assert mismatches(a) == {("artifact", "art_forged", "(row)")}
    assert (a.row_mismatches[0].stored, a.row_mismatches[0].committed) == ("true", "null")
    assert mismatches(b) == {("checkpoint", h.checkpoint, "(row)")}
    assert (b.row_mismatches[0].stored, b.row_mismatches[0].committed) == ("null", "true")
    assert not a.intact and not b.intact


def test_a_tampered_usage_index_row_is_named_with_its_field(env: Env) -> None:
    # The rows FindUsages answers from (runtime_step_usages) are checked against the versions
    # each step's events committed to: a model id, a skill's digest, a row deleted or forged.
    h = build_history(env.stubs)
    live = build_live_run(env.stubs)
    skill = get_step(env.stubs, live.model).versions.skills[0]
    requested = get_step(env.stubs, live.model).versions.model.requested_model_id
    assert live.model in steps_using(env, apb.FindUsagesRequest(component_ref=skill.digest))
    usage_where = "step_id = :s AND kind = :k"
    sql(
        env,
        f"UPDATE runtime_step_usages SET name = 'gpt-evil' WHERE {usage_where}",
        s=live.model,
        k="model_requested",
    )
    sql(
        env,
        f"UPDATE runtime_step_usages SET digest = :d WHERE {usage_where}",
        d="sha256:" + "0" * 64,
        s=live.model,
        k="skill",
    )
    sql(env, f"DELETE FROM runtime_step_usages WHERE {usage_where}", s=live.tool, k="tool")
    sql(
        env,
        "INSERT INTO runtime_step_usages"
        " (step_id, kind, name, version, digest, schema_digest, run_id, start_time)"
        " SELECT id, 'model_reported', 'gpt-forged', '', '', '', run_id, start_time"
        " FROM runtime_steps WHERE id = :s",
        s=live.tool,
    )

    report = verify(env, live.run_id)
    assert mismatches(report) == {
        ("usage", f"{live.model}/model_requested", "name"),
        ("usage", f"{live.model}/skill/{skill.name}", "digest"),
        ("usage", f"{live.tool}/tool/read_file", "(row)"),
        ("usage", f"{live.tool}/model_reported", "(row)"),
    }
    assert not report.intact and not report.HasField("first_break")
    by_id = {m.id: m for m in report.row_mismatches}
    model = by_id[f"{live.model}/model_requested"]
    assert (json.loads(model.stored), json.loads(model.committed)) == ("gpt-evil", requested)
    digest = by_id[f"{live.model}/skill/{skill.name}"]
    assert (json.loads(digest.stored), json.loads(digest.committed)) == (
        "sha256:" + "0" * 64,
        skill.digest,
    )
    deleted = by_id[f"{live.tool}/tool/read_file"]
    assert (deleted.stored, deleted.committed) == ("null", "true")
    forged = by_id[f"{live.tool}/model_reported"]
    assert (forged.stored, forged.committed) == ("true", "null")

    # FindUsages serves what is stored (the steps' own rows still say otherwise, and are
    # intact): VerifyRun is what tells.
    assert steps_using(env, apb.FindUsagesRequest(model_id="gpt-evil")) == [live.model]
    assert steps_using(env, apb.FindUsagesRequest(model_id="gpt-forged")) == [live.tool]
    assert live.model not in steps_using(env, apb.FindUsagesRequest(component_ref=skill.digest))
    assert {m.kind for m in report.row_mismatches} == {"usage"}
    # The other runs were not touched.
    assert verify(env, h.run_a).intact and verify(env, h.run_b).intact
    # A bundle carries no usage index rows: it still verifies (docs/audit.md says so).
    assert bundle_failures(env, live.run_id) == []


def steps_using(env: Env, request: apb.FindUsagesRequest) -> list[str]:
    return [u.step_id for u in env.audit.FindUsages(request, timeout=10).usages]


def _scalar(env: Env, statement: str, **params: Any) -> Any:
    database = env.server.server.database
    assert database is not None
    return database.write_sync(
        lambda session: session.execute(sa.text(statement), params).scalar_one()
    )
