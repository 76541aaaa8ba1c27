"""AuditService through real gRPC on both engines, over the realistic history that
:func:`tests.service.audit_history.build_history` records (described there)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import timestamp_pb2

from agentrt.audit.v1 import audit_service_pb2 as apb
from agentrt.audit.v1 import message_pb2 as amsg
from agentrt.runtime.v1 import enum_pb2
from agentrt.runtime.v1 import runtime_service_pb2 as pb
from agentrt_core import audit_bundle
from agentrt_core.audit_bundle import BundleFormatError
from agentrt_core.audit_chain import Link, verify_chain
from agentrt_core.event_chain import event_hash
from runtime_service.services.audit import TagEvent, tags_at
from tests.service.audit_history import PROVENANCE, Env, build_history
from tests.support import error_details, rpc_error

pytestmark = pytest.mark.fresh_server(
    reason="publishes coding_agent under labels its other tests publish with other content,"
    " and counts usages over the whole database"
)

# -- provenance ------------------------------------------------------------------------------


def test_provenance_of_an_artifact_reaches_the_agent_version_and_its_tags_at_creation(
    env: Env,
) -> None:
    h = build_history(env.stubs)
    response = env.audit.GetProvenance(apb.GetProvenanceRequest(artifact_id=h.artifact))
    [record] = response.records
    assert record.artifact.id == h.artifact and record.artifact.blob_digest == h.blob
    assert record.step.id == h.a_read and record.step.output_ref == h.blob
    assert record.step.versions.tools[0].name == "read_file"
    assert record.attempt.id == record.step.attempt_id
    assert record.attempt.number == 1 and record.attempt.worker_id == "w1"
    assert record.attempt.lease_epoch >= 1
    assert record.attempt.reason == enum_pb2.ATTEMPT_REASON_INITIAL
    run = record.run
    assert run.id == h.run_a and run.status == enum_pb2.RUN_STATUS_COMPLETED
    assert run.goal.objective == "make the tests pass" and run.input_revision == 1
    assert run.agent.requested_ref == "coding_agent:prod"
    assert run.agent.resolved_via_tag == "prod" and run.agent.agent_digest == h.v7
    assert run.agent.resolve_time.seconds > 0
    assert record.thread.id == run.thread_id
    version = record.agent_version
    assert version.digest == h.v7 and version.version_label == "agent_v7"
    assert version.publish.provenance.source_repo == PROVENANCE.source_repo
    assert version.publish.provenance.commit == "4f2c9e1"
    assert version.publish.provenance.pipeline_url == PROVENANCE.pipeline_url
    assert [c.version for c in version.closure.skills] == ["2.1.0"]
    # prod has moved to v8 since: now only `stable` points at v7, but at the run's creation
    # both did, each set by its own tag event.
    assert list(version.tags) == ["stable"]
    tags = [(t.tag, t.event_sequence) for t in record.tags_at_run_creation]
    assert tags == [("prod", 1), ("stable", 2)]
    assert all(t.since_time.seconds > 0 for t in record.tags_at_run_creation)
    # Every step of the run, in order, with what it resolved.
    steps = list(record.steps)
    assert [s.sequence for s in steps] == list(range(1, len(steps) + 1))
    assert not record.steps_truncated
    by_id = {s.id: s for s in steps}
    first, fallback = by_id[h.a_model], by_id[h.a_fallback]
    assert first.versions.model.requested_model_id == "claude-sonnet-4"
    assert fallback.versions.model.requested_model_id == "gpt-4.1"
    assert fallback.versions.model.reported_model_id == "gpt-4.1-2025"
    assert fallback.versions.skills[0].version == "2.1.0"
    assert fallback.versions.system_prompt_digest == version.closure.system_prompt.digest
    assert [a.number for a in record.attempts] == [1]


def test_provenance_steps_are_exactly_the_runtime_api_steps(env: Env) -> None:
    """GetProvenance maps steps with its own faster twin of proto_map.step: it must give
    the same messages as ListSteps for every kind of step (model calls with parameters and
    steers, tool calls with arguments and blobs, an approval, a checkpoint, checks)."""
    h = build_history(env.stubs)
    kinds: set[int] = set()
    for run_id in (h.run_a, h.run_b, h.run_c):
        [record] = env.audit.GetProvenance(apb.GetProvenanceRequest(run_id=run_id)).records
        listed = env.stubs.runtime.ListSteps(pb.ListStepsRequest(run_id=run_id)).steps
        assert list(record.steps) == list(listed)
        kinds |= {s.type for s in listed}
    assert len(kinds) == 5  # model, tool, approval, checkpoint, completion check
    [b] = env.audit.GetProvenance(apb.GetProvenanceRequest(run_id=h.run_b)).records
    by_id = {s.id: s for s in b.steps}
    assert by_id[h.b_model].consumed_input_ids
    assert by_id[h.b_approval].approval.approver == "alice"
    assert by_id[h.b_patch].approval_step_id == h.b_approval
    assert [a.reason for a in b.attempts] == [
        enum_pb2.ATTEMPT_REASON_INITIAL,
        enum_pb2.ATTEMPT_REASON_RESUMED_AFTER_APPROVAL,
    ]
    [checkpoint] = env.audit.GetProvenance(
        apb.GetProvenanceRequest(blob_digest=h.state_blob)
    ).records
    assert checkpoint.run.id == h.run_b
    roles = env.audit.GetProvenance(apb.GetProvenanceRequest(blob_digest=h.state_blob))
    assert amsg.BLOB_ROLE_CHECKPOINT in {r.role for r in roles.blob_references}
    assert h.checkpoint in {r.checkpoint_id for r in roles.blob_references}


def test_provenance_of_run_step_and_blob(env: Env) -> None:
    h = build_history(env.stubs)
    [run_b] = env.audit.GetProvenance(apb.GetProvenanceRequest(run_id=h.run_b)).records
    assert run_b.agent_version.digest == h.v8
    assert [t.tag for t in run_b.tags_at_run_creation] == ["prod"]
    assert not run_b.HasField("step") and not run_b.HasField("artifact")
    [step] = env.audit.GetProvenance(apb.GetProvenanceRequest(step_id=h.b_model)).records
    assert step.step.versions.skills[0].version == "2.2.0"
    assert step.attempt.id == step.step.attempt_id
    capped = env.audit.GetProvenance(apb.GetProvenanceRequest(run_id=h.run_a, max_steps=2))
    assert len(capped.records[0].steps) == 2 and capped.records[0].steps_truncated

    # The blob: A's read_file output and artifact, B's read_file input.
    blob = env.audit.GetProvenance(apb.GetProvenanceRequest(blob_digest=h.blob))
    refs = {(r.role, r.run_id, r.step_id, r.artifact_id) for r in blob.blob_references}
    assert refs == {
        (amsg.BLOB_ROLE_STEP_OUTPUT, h.run_a, h.a_read, ""),
        (amsg.BLOB_ROLE_ARTIFACT, h.run_a, h.a_read, h.artifact),
        (amsg.BLOB_ROLE_STEP_INPUT, h.run_b, h.b_read, ""),
    }
    records = {r.run.id: r for r in blob.records}
    assert set(records) == {h.run_a, h.run_b}
    assert records[h.run_a].artifact.id == h.artifact
    assert records[h.run_a].step.id == h.a_read
    assert records[h.run_b].step.id == h.b_read
    assert records[h.run_b].agent_version.digest == h.v8


def test_provenance_refuses_bad_and_unknown_targets(env: Env) -> None:
    audit = env.audit
    for request, name in (
        (apb.GetProvenanceRequest(run_id="run_nope"), "run_nope"),
        (apb.GetProvenanceRequest(step_id="stp_nope"), "stp_nope"),
        (apb.GetProvenanceRequest(artifact_id="art_nope"), "art_nope"),
        (apb.GetProvenanceRequest(blob_digest="sha256:" + "0" * 64), "sha256:" + "0" * 64),
    ):
        error = rpc_error(lambda r=request: audit.GetProvenance(r))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert name in (error.details() or "")
    error = rpc_error(
        lambda: audit.GetProvenance(apb.GetProvenanceRequest(blob_digest="sha256:xyz"))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(error)["BadRequest"].field_violations[0].field == "blob_digest"
    error = rpc_error(lambda: audit.GetProvenance(apb.GetProvenanceRequest()))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- usages ----------------------------------------------------------------------------------


def _usages(audit: Any, **query: Any) -> list[Any]:
    return list(audit.FindUsages(apb.FindUsagesRequest(**query)).usages)


def _all_pages(audit: Any, page_size: int, **query: Any) -> list[Any]:
    found: list[Any] = []
    token = ""
    while True:
        page = audit.FindUsages(
            apb.FindUsagesRequest(page_size=page_size, page_token=token, **query)
        )
        assert len(page.usages) <= page_size
        found += page.usages
        token = page.next_page_token
        if not token:
            return found


def test_usages_of_a_skill_version_schema_agent_and_model(env: Env) -> None:
    h = build_history(env.stubs)
    audit = env.audit
    # repo-debug@2.1.0: the model calls of runs A and C (v7), not B (v8 pins 2.2.0); newest
    # first.
    found = _usages(audit, component_ref="repo-debug@2.1.0")
    assert [u.step_id for u in found] == [h.c_model, h.a_fallback, h.a_model]
    assert all(u.step_type == enum_pb2.STEP_TYPE_MODEL_CALL for u in found)
    assert found[0].matched.startswith("repo-debug@2.1.0 sha256:")
    assert found[0].run_id == h.run_c and found[0].agent_digest == h.v7
    assert found[0].thread_id and found[0].attempt_id and found[0].step_sequence >= 1
    times = [u.time.ToDatetime() for u in found]
    assert times == sorted(times, reverse=True)
    # The same by digest, and by name@digest.
    digest = found[0].matched.split()[1]
    assert [u.step_id for u in _usages(audit, component_ref=digest)] == [u.step_id for u in found]
    assert len(_usages(audit, component_ref=f"repo-debug@{digest}")) == 3
    assert [u.step_id for u in _usages(audit, component_ref="repo-debug@2.2.0")] == [h.b_model]

    # A tool schema: every step that offered or called read_file@1 (both agent versions pin it).
    by_schema = _usages(audit, tool_schema_digest=h.read_file_schema)
    assert {u.step_id for u in by_schema} == {
        h.a_model,
        h.a_fallback,
        h.a_read,
        h.b_model,
        h.b_read,
        h.c_model,
    }
    assert by_schema[0].matched == f"read_file@1 schema {h.read_file_schema}"

    # An agent digest: the runs bound to it (run-level records).
    bound = _usages(audit, agent_digest=h.v7)
    assert [u.run_id for u in bound] == [h.run_c, h.run_a]
    assert all(u.step_id == "" for u in bound)
    assert bound[0].matched == f"coding_agent@agent_v7 {h.v7}"
    assert [u.run_id for u in _usages(audit, agent_digest=h.v8)] == [h.run_b]

    # A permission policy is not recorded per step: the runs whose agent pins it.
    policy = _usages(audit, component_ref="workspace-safe@4")
    assert {u.run_id for u in policy} == {h.run_a, h.run_b, h.run_c}

    # Models: requested vs reported.
    requested = _usages(audit, model_id="claude-sonnet-4", model_match=amsg.MODEL_MATCH_REQUESTED)
    assert [u.step_id for u in requested] == [h.c_model, h.b_model, h.a_model]
    reported = _usages(audit, model_id="claude-sonnet-4", model_match=amsg.MODEL_MATCH_REPORTED)
    assert [u.step_id for u in reported] == [h.b_model]
    assert reported[0].matched == "model claude-sonnet-4 (reported)"
    both = _usages(audit, model_id="claude-sonnet-4")
    assert [u.step_id for u in both] == [h.c_model, h.b_model, h.a_model]
    assert both[1].matched == "model claude-sonnet-4 (requested, reported)"
    assert [u.step_id for u in _usages(audit, model_id="gpt-4.1-2025")] == [h.a_fallback]
    assert _usages(audit, model_id="gpt-4.1-2025", model_match=amsg.MODEL_MATCH_REQUESTED) == []


def _stamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def test_usages_time_range_and_pagination(env: Env) -> None:
    h = build_history(env.stubs)
    audit = env.audit
    cut = _stamp(h.between_a_and_c)
    later = _usages(audit, component_ref="repo-debug@2.1.0", start_time=cut)
    assert [u.step_id for u in later] == [h.c_model]
    earlier = _usages(audit, component_ref="repo-debug@2.1.0", end_time=cut)
    assert [u.step_id for u in earlier] == [h.a_fallback, h.a_model]
    assert [u.run_id for u in _usages(audit, agent_digest=h.v7, end_time=cut)] == [h.run_a]

    # Every page size gives the same sequence as one big page, newest first, no repeats.
    for query in (
        {"tool_schema_digest": h.read_file_schema},
        {"model_id": "claude-sonnet-4"},
        {"agent_digest": h.v7},
        {"component_ref": "workspace-safe@4"},
    ):
        whole = [(u.run_id, u.step_id) for u in _usages(audit, **query)]
        for size in (1, 2, 4):
            paged = [(u.run_id, u.step_id) for u in _all_pages(audit, size, **query)]
            assert paged == whole, (query, size)

    first = audit.FindUsages(
        apb.FindUsagesRequest(tool_schema_digest=h.read_file_schema, page_size=2)
    )
    error = rpc_error(
        lambda: audit.FindUsages(
            apb.FindUsagesRequest(
                tool_schema_digest=h.read_file_schema,
                page_size=2,
                page_token=first.next_page_token,
                start_time=cut,
            )
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = rpc_error(
        lambda: audit.FindUsages(apb.FindUsagesRequest(model_id="x", page_token="zz"))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_usages_refuse_malformed_and_unknown_references(env: Env) -> None:
    h = build_history(env.stubs)
    audit = env.audit

    def code(**query: Any) -> tuple[grpc.StatusCode, str]:
        error = rpc_error(lambda: audit.FindUsages(apb.FindUsagesRequest(**query)))
        return error.code(), error.details() or ""

    assert code(component_ref="repo-debug@^2.1")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(component_ref="repo-debug")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(component_ref="repo-debug:prod")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(component_ref="sha256:ABC")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(tool_schema_digest="read_file@1")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(agent_digest="coding_agent@agent_v7")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code()[0] == grpc.StatusCode.INVALID_ARGUMENT
    status, message = code(component_ref="repo-debug@9.9.9")
    assert status == grpc.StatusCode.NOT_FOUND and "repo-debug@9.9.9" in message
    status, message = code(component_ref=h.v7)
    assert status == grpc.StatusCode.NOT_FOUND and "agent version" in message
    cut = _stamp(h.between_a_and_c)
    assert code(model_id="x", start_time=cut, end_time=cut)[0] == grpc.StatusCode.INVALID_ARGUMENT
    # A well-formed digest nothing used is simply unused.
    assert _usages(audit, tool_schema_digest="sha256:" + "1" * 64) == []


# -- the event chain -------------------------------------------------------------------------


def _verify(audit: Any, run_id: str) -> Any:
    return audit.VerifyRun(apb.VerifyRunRequest(run_id=run_id))


def _sql(env: Env, statement: str, **params: Any) -> None:
    database = env.server.server.database
    assert database is not None
    database.write_sync(lambda session: session.execute(sa.text(statement), params))


def test_verify_run_intact_then_tampered_rows_are_caught(env: Env) -> None:
    h = build_history(env.stubs)
    audit = env.audit
    run = env.stubs.runtime.GetRun(pb.GetRunRequest(run_id=h.run_a)).run
    intact = _verify(audit, h.run_a)
    assert intact.intact and not intact.HasField("first_break")
    assert intact.event_count == run.last_event_sequence > 10
    assert intact.head_hash.startswith("sha256:")

    # Run A: rewrite the attributes of event 3 (valid JSON, different content).
    _sql(
        env,
        "UPDATE runtime_events SET attributes_json = :a WHERE run_id = :r AND sequence = 3",
        a='{"reason":"nothing to see"}',
        r=h.run_a,
    )
    broken = _verify(audit, h.run_a)
    assert not broken.intact and broken.event_count == 2
    assert broken.first_break.sequence == 3
    assert broken.first_break.reason.startswith("hash mismatch")
    assert broken.first_break.found_hash != broken.first_break.expected_hash

    # Run B: delete an event in the middle: a gap.
    _sql(env, "DELETE FROM runtime_events WHERE run_id = :r AND sequence = 4", r=h.run_b)
    gap = _verify(audit, h.run_b).first_break
    assert gap.sequence == 5 and "sequence gap after 3" in gap.reason

    # Run C: rewrite event 2 *and* its hash, as a careful forger would: event 3 no longer
    # links to it.
    database = env.server.server.database
    assert database is not None

    def forge(session: Any) -> None:
        row = session.execute(
            sa.text("SELECT * FROM runtime_events WHERE run_id = :r AND sequence = 2"),
            {"r": h.run_c},
        ).one()
        attributes = {**json.loads(row.attributes_json), "reason": "forged"}
        event_time = row.event_time
        if isinstance(event_time, str):  # SQLite hands back text through sa.text()
            event_time = dt.datetime.fromisoformat(event_time).replace(tzinfo=dt.UTC)
        from agentrt_core.event_chain import format_time

        forged = event_hash(
            event_id=row.id,
            thread_id=row.thread_id,
            run_id=row.run_id,
            sequence=2,
            event_type=row.event_type,
            event_time=format_time(event_time),
            attributes=attributes,
            prev_hash=row.prev_hash,
        )
        session.execute(
            sa.text(
                "UPDATE runtime_events SET attributes_json = :a, hash = :h "
                "WHERE run_id = :r AND sequence = 2"
            ),
            {"a": json.dumps(attributes), "h": forged, "r": h.run_c},
        )

    database.write_sync(forge)
    link = _verify(audit, h.run_c).first_break
    assert link.sequence == 3 and link.reason.startswith("prev_hash does not match")


def test_verify_run_catches_a_truncated_chain_and_unknown_runs(env: Env) -> None:
    h = build_history(env.stubs)
    last = env.stubs.runtime.GetRun(pb.GetRunRequest(run_id=h.run_c)).run.last_event_sequence
    _sql(env, "DELETE FROM runtime_events WHERE run_id = :r AND sequence = :s", r=h.run_c, s=last)
    report = _verify(env.audit, h.run_c)
    assert not report.intact and report.event_count == last - 1
    assert report.first_break.sequence == last
    assert "missing at the end" in report.first_break.reason
    error = rpc_error(lambda: _verify(env.audit, "run_nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "run_nope" in (error.details() or "")


# -- bundles ---------------------------------------------------------------------------------


def _export(audit: Any, run_id: str, fmt: Any = 0) -> tuple[Any, bytes]:
    parts = list(audit.ExportBundle(apb.ExportBundleRequest(run_id=run_id, format=fmt)))
    assert parts[0].WhichOneof("part") == "info"
    data = b"".join(p.chunk for p in parts[1:])
    return parts[0].info, data


def test_exported_bundle_verifies_offline_in_both_formats(env: Env) -> None:
    h = build_history(env.stubs)
    info, data = _export(env.audit, h.run_a)
    assert info.run_id == h.run_a and info.size == len(data)
    assert info.media_type == "application/json" and info.format == apb.BUNDLE_FORMAT_JSON
    from agentrt_core.jcs import digest_bytes

    assert info.digest == digest_bytes(data)
    assert info.installation_id.startswith("ins_") and info.export_time.seconds > 0
    document = audit_bundle.decode(data)
    report = audit_bundle.verify_bundle(document)
    assert report.ok, report.failures
    assert report.agent == "coding_agent@agent_v7" and report.agent_digest == h.v7
    assert report.component_count == 8  # 7 published + the inline system prompt
    assert report.event_count == len(document["events"]) > 10
    assert report.head_hash == _verify(env.audit, h.run_a).head_hash
    assert [t["tag"] for t in document["agent"]["tags_at_run_creation"]] == ["prod", "stable"]
    assert {a["id"] for a in document["artifacts"]} == {h.artifact}

    info, lines = _export(env.audit, h.run_a, apb.BUNDLE_FORMAT_JSONL)
    assert info.media_type == "application/jsonl"
    assert audit_bundle.decode(lines) == {**document, "export_time": info_time(lines)}
    assert audit_bundle.verify_bundle(audit_bundle.decode(lines)).ok
    error = rpc_error(lambda: _export(env.audit, "run_nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def info_time(jsonl: bytes) -> str:
    return str(json.loads(jsonl.split(b"\n", 1)[0])["export_time"])


def test_tampered_and_truncated_bundles_fail_naming_what(env: Env) -> None:
    h = build_history(env.stubs)
    _, data = _export(env.audit, h.run_a)
    document = audit_bundle.decode(data)

    def failures(change: Any) -> list[str]:
        changed = copy.deepcopy(document)
        change(changed)
        return audit_bundle.verify_bundle(changed).failures

    def by_name(d: dict[str, Any], name: str) -> dict[str, Any]:
        return next(c for c in d["components"] if c["name"] == name)

    def skill(d: dict[str, Any]) -> None:
        by_name(d, "repo-debug")["spec"]["instructions"] = "Delete the tests."

    assert failures(skill)[0].startswith("component repo-debug@2.1.0: digest recomputes to")

    def version(d: dict[str, Any]) -> None:
        by_name(d, "read_file")["version"] = "2"

    assert "component read_file@2" in failures(version)[0]

    def closure(d: dict[str, Any]) -> None:
        d["agent"]["closure"] = [
            e for e in d["agent"]["closure"] if e["slot"] != "tools[run_tests]"
        ]

    assert any("agent coding_agent@agent_v7: digest recomputes" in f for f in failures(closure))

    def step(d: dict[str, Any]) -> None:
        model = next(s for s in d["steps"] if s["id"] == h.a_fallback)
        model["versions"]["skills"][0]["digest"] = "sha256:" + "e" * 64

    assert any(
        "skill repo-debug@2.1.0" in f and "not in the agent's closure" in f for f in failures(step)
    )

    def event(d: dict[str, Any]) -> None:
        d["events"][4]["attributes"]["reason"] = "edited"

    assert any("event chain broken at sequence 5: hash mismatch" in f for f in failures(event))

    def tail(d: dict[str, Any]) -> None:
        d["events"].pop()

    assert any("missing at the end" in f for f in failures(tail))

    with pytest.raises(BundleFormatError, match="truncated"):
        audit_bundle.decode(data[: len(data) // 2])
    _, lines = _export(env.audit, h.run_a, apb.BUNDLE_FORMAT_JSONL)
    cut = lines[: lines.rindex(b"\n", 0, len(lines) - 1) + 1]  # drop the last record line
    with pytest.raises(BundleFormatError, match="truncated"):
        audit_bundle.decode(cut)


# -- pure pieces -----------------------------------------------------------------------------


def _chain(n: int) -> list[Link]:
    links, prev = [], ""
    for i in range(1, n + 1):
        link = Link(
            f"evt_{i}",
            "thr",
            "run",
            i,
            "run.amended",
            "2026-01-01T00:00:00.000000Z",
            {"i": i},
            prev,
            "",
        )
        link = Link(**{**link.__dict__, "hash": link.recomputed_hash()})
        links.append(link)
        prev = link.hash
    return links


def test_verify_chain_reports_the_first_broken_link() -> None:
    links = _chain(5)
    assert verify_chain(links, head=(5, links[-1].hash), chain=("thr", "run")).intact
    assert verify_chain([]).intact and verify_chain([], head=(0, "")).intact
    first = verify_chain(links[1:]).first_break
    assert first is not None and "starts at sequence 2" in first.reason
    swapped = verify_chain([links[0], links[2], links[1]]).first_break
    assert swapped is not None and swapped.sequence == 3 and "gap after 1" in swapped.reason
    other = verify_chain(links, chain=("thr", "run_other")).first_break
    assert other is not None and "belongs to chain" in other.reason
    longer = verify_chain(links, head=(4, links[3].hash)).first_break
    assert longer is not None and longer.sequence == 5


def test_tags_at_replays_the_history() -> None:
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = [
        TagEvent(1, "prod", "SET", "sha256:a", t),
        TagEvent(2, "canary", "SET", "sha256:a", t),
        TagEvent(3, "prod", "SET", "sha256:b", t),
        TagEvent(4, "canary", "DELETE", "", t),
        TagEvent(5, "prod", "SET", "sha256:a", t),
    ]
    assert [(x.tag, x.event_sequence) for x in tags_at(events, "sha256:a")] == [("prod", 5)]
    assert [x.tag for x in tags_at(events[:2], "sha256:a")] == ["canary", "prod"]
    assert tags_at(events[:4], "sha256:b")[0].event_sequence == 3


# -- query plans -------------------------------------------------------------------------------


def test_usage_and_event_reads_use_their_indexes(env: Env) -> None:
    """The usage indexes are partial (migration 0007), so a query can use one only if it
    repeats the index's condition word for word; without it both engines would silently scan
    the table. Every FindUsages and VerifyRun statement is explained on its own engine, with
    sequential scans disabled on PostgreSQL (its tables here are tiny)."""
    h = build_history(env.stubs)
    database = env.server.server.database
    assert database is not None
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM runtime_step_usages" in statement or "FROM runtime_events" in statement:
            seen.append((statement, parameters))

    sa.event.listen(database.read_engine, "before_cursor_execute", capture)
    try:
        _usages(env.audit, component_ref="repo-debug@2.1.0")
        _usages(env.audit, tool_schema_digest=h.read_file_schema)
        _usages(env.audit, model_id="claude-sonnet-4")
        env.audit.VerifyRun(apb.VerifyRunRequest(run_id=h.run_a))
    finally:
        sa.event.remove(database.read_engine, "before_cursor_execute", capture)

    # What each statement filters on, and how each engine names the indexes that must serve
    # it, one tuple of alternatives per index (SQLite names a unique constraint's index by
    # number, so its plan shows the columns).
    chain = ("thread_id=? AND run_id=?", "uq_runtime_events_thread_id_run_id_sequence")
    expected: dict[str, list[tuple[str, ...]]] = {
        "runtime_step_usages.digest =": [("ix_runtime_step_usages_digest_time",)],
        "runtime_step_usages.schema_digest =": [("ix_runtime_step_usages_schema_digest_time",)],
        "runtime_step_usages.kind =": [("ix_runtime_step_usages_kind_name_time",)],
        "runtime_events.thread_id =": [chain],
        # VerifyRun's usage rows of a run: its steps by run, then each step's rows by the
        # usage key's leading step_id (audit_reads.usages_of_run).
        "runtime_steps.run_id =": [
            ("uq_runtime_steps_run_id_sequence", "runtime_steps_2 (run_id=?)"),
            ("pk_runtime_step_usages", "runtime_step_usages_1 (step_id=?)"),
        ],
    }
    checked: set[str] = set()
    raw = database.read_engine.raw_connection()
    try:
        cursor = raw.cursor()
        if database.is_sqlite:
            explain = "EXPLAIN QUERY PLAN "
        else:
            cursor.execute("SET enable_seqscan = off")
            explain = "EXPLAIN "
        for statement, parameters in seen:
            cursor.execute(explain + statement, parameters)
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
            key = next(k for k in expected if k in statement)
            used = all(any(name in plan for name in group) for group in expected[key])
            assert used and "Seq Scan" not in plan, (statement, plan)
            checked.add(key)
    finally:
        raw.close()
    assert checked == set(expected)
