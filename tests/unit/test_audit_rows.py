"""``audit_rows.compare``: rows re-derived from a run's events, field by field; runs whose
events predate a field are reported as not covered for it, never as verified."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from agentrt.runtime.v1 import message_pb2
from agentrt_core import audit_bundle, audit_rows
from agentrt_core.audit_chain import Link
from runtime_service.store.ledger import StepUsageRow

T0 = "2026-11-29T12:00:00.000000Z"
T1 = "2026-11-29T12:00:01.250000Z"


def link(sequence: int, event_type: str, time: str, **attributes: Any) -> Link:
    return Link(f"evt_{sequence}", "thr_1", "run_1", sequence, event_type, time, attributes, "", "")


def chain(record_format: int) -> list[Link]:
    created: dict[str, Any] = {"agent": {"agent_digest": "sha256:" + "a" * 64}, "priority": 1}
    if record_format:
        created |= {"record_format": record_format, "labels": {"team": "core"}}
    return [
        link(1, "run.created", T0, **created),
        link(
            2,
            "artifact.created",
            T1,
            artifact_id="art_1",
            step_id="stp_1",
            name="a.py",
            **({"size": "12", "attempt_id": "att_1"} if record_format else {}),
        ),
    ]


def rows(**artifact: Any) -> dict[str, Any]:
    run = {
        "id": "run_1",
        "thread_id": "thr_1",
        "agent": {"agent_digest": "sha256:" + "a" * 64},
        "priority": 1,
        "labels": {"team": "core"},
        "input_revision": "1",
        "status": "RUN_STATUS_QUEUED",
        "create_time": "2026-11-29T12:00:00Z",
    }
    art = {
        "id": "art_1",
        "run_id": "run_1",
        "thread_id": "thr_1",
        "attempt_id": "att_1",
        "step_id": "stp_1",
        "name": "a.py",
        "size": "12",
        "create_time": "2026-11-29T12:00:01.250Z",
    } | artifact
    return {"run": run, "artifacts": [art]}


def found(report: audit_rows.RowReport) -> set[tuple[str, str, str]]:
    return {(m.kind, m.id, m.field) for m in report.mismatches}


def test_a_run_of_the_current_format_is_checked_whole() -> None:
    report = audit_rows.compare(rows(), chain(1), run_id="run_1", thread_id="thr_1")
    assert not report.mismatches and not report.not_covered and report.rows_checked == 2
    tampered = audit_rows.compare(
        rows(size="13", name="b.py"), chain(1), run_id="run_1", thread_id="thr_1"
    )
    assert found(tampered) == {("artifact", "art_1", "size"), ("artifact", "art_1", "name")}
    size = next(m for m in tampered.mismatches if m.field == "size")
    assert (size.stored, size.committed) == ('"13"', '"12"')


def test_an_older_run_reports_what_its_chain_does_not_cover() -> None:
    # Format 0: run.created carries no labels, artifact.created no size: those fields are
    # listed as not covered and not compared, the rest still is.
    report = audit_rows.compare(rows(size="13"), chain(0), run_id="run_1", thread_id="thr_1")
    assert not report.mismatches
    assert {"run.labels", "artifact.size", "artifact.labels", "step.summary"} <= set(
        report.not_covered
    )
    renamed = audit_rows.compare(rows(name="b.py"), chain(0), run_id="run_1", thread_id="thr_1")
    assert found(renamed) == {("artifact", "art_1", "name")}


def test_rows_and_events_that_do_not_pair_up() -> None:
    extra = rows()
    extra["artifacts"].append({**extra["artifacts"][0], "id": "art_2"})
    report = audit_rows.compare(extra, chain(1), run_id="run_1", thread_id="thr_1")
    assert found(report) == {("artifact", "art_2", "(row)")}
    missing = rows()
    missing["artifacts"] = []
    report = audit_rows.compare(missing, chain(1), run_id="run_1", thread_id="thr_1")
    assert found(report) == {("artifact", "art_1", "(row)")}
    # A section not given is not compared (a bundle from before it had inputs).
    del missing["artifacts"]
    assert not audit_rows.compare(missing, chain(1), run_id="run_1", thread_id="thr_1").mismatches


def test_a_jsonl_bundle_from_before_inputs_still_decodes() -> None:
    document = {
        "type": audit_bundle.BUNDLE_TYPE,
        "run": {"id": "run_1"},
        **{s: [] for s in ("attempts", "steps", "artifacts", "checkpoints", "components")},
        "events": [],
    }
    data = audit_bundle.encode({**document, "inputs": []}, "jsonl")
    header, _, rest = data.decode().partition("\n")
    old_header = header.replace(',"inputs":0', "")
    assert old_header != header
    decoded = audit_bundle.decode((old_header + "\n" + rest).encode())
    assert "inputs" not in decoded
    assert audit_bundle.decode(data)["inputs"] == []


def test_digested_fields_commit_to_the_served_value() -> None:
    # What the writer commits (from the stored JSON) is what the comparison recomputes from
    # the served proto3 JSON, where a Struct's numbers are doubles.
    assert audit_rows.arguments_digest('{"n":42,"path":"a"}') == audit_rows.arguments_digest(
        '{"path":"a","n":42.0}'
    )
    assert audit_rows.data_digest("{}") == audit_rows.data_digest("")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("run", message_pb2.Run),
        ("attempt", message_pb2.Attempt),
        ("step", message_pb2.Step),
        ("checkpoint", message_pb2.Checkpoint),
        ("artifact", message_pb2.Artifact),
        ("input", message_pb2.Input),
    ],
)
def test_every_served_field_is_compared_or_deliberately_not(kind: str, message: Any) -> None:
    fields = {f.name for f in message.DESCRIPTOR.fields}
    covered, skipped = set(audit_rows.COVERED[kind]), set(audit_rows.NOT_COMPARED[kind])
    assert not covered & skipped
    assert covered | skipped == fields, (
        f"{kind}: decide for {sorted(fields - covered - skipped)} (audit_rows, docs/audit.md)"
    )
    # A format-1 field is a covered field, or a member of one ("agent.reference_kind").
    assert {name.split(".")[0] for name in audit_rows.FORMAT_1_FIELDS[kind]} <= covered


def test_every_usage_index_column_is_compared_or_part_of_the_row_id() -> None:
    # The usage index rows have no API message: their columns are what is served.
    columns = {c.key for c in sa.inspect(StepUsageRow).columns}
    assert set(audit_rows.USAGE_COLUMNS) == columns
    covered, skipped = set(audit_rows.COVERED["usage"]), set(audit_rows.NOT_COMPARED["usage"])
    assert not covered & skipped and covered | skipped == columns


def model_call_chain() -> list[Link]:
    versions = {
        "model": {"policy_digest": "sha256:p", "requested_model_id": "gpt-4.1"},
        "skills": [{"name": "repo-debug", "version": "2.1.0", "digest": "sha256:s"}],
        "tools": [{"name": "read_file", "version": "1", "digest": "sha256:t"}],
    }
    return [
        link(1, "run.created", T0, record_format=1),
        link(2, "step.started", T1, step_id="stp_1", step_sequence="1", versions=versions),
        link(3, "step.ended", T1, step_id="stp_1", reported_model_id="gpt-4.1-2025"),
    ]


def usage(kind: str, name: str = "", **values: str) -> dict[str, Any]:
    row = {"step_id": "stp_1", "kind": kind, "name": name, "version": "", "digest": ""}
    return row | {"schema_digest": "", "run_id": "run_1", "start_time": T1} | values


def test_usage_rows_are_rederived_from_the_versions_the_step_committed_to() -> None:
    # The same rows the step path writes (agentrt_core.usage_rows), built
    # from step.started's versions and step.ended's reported model.
    stored = [
        usage("model_policy", digest="sha256:p"),
        usage("model_requested", "gpt-4.1"),
        usage("skill", "repo-debug", version="2.1.0", digest="sha256:s"),
        usage("tool", "read_file", version="1", digest="sha256:t"),
        usage("model_reported", "gpt-4.1-2025"),
    ]
    # Served times may spell the instant differently (proto3 JSON, a database's precision).
    stored[0]["start_time"] = "2026-11-29T12:00:01.250Z"

    def check(usages: list[dict[str, Any]]) -> audit_rows.RowReport:
        report = audit_rows.compare(
            {"usages": usages}, model_call_chain(), run_id="run_1", thread_id="thr_1"
        )
        # Only the usage rows are given (the run row, always compared, is left out here).
        report.mismatches = [m for m in report.mismatches if m.kind == "usage"]
        return report

    intact = check(stored)
    assert not intact.mismatches and intact.rows_checked == 5
    tampered = [dict(row) for row in stored]
    tampered[1]["name"] = "gpt-evil"
    tampered[2]["digest"] = "sha256:x"
    del tampered[3]
    tampered.append(usage("skill", "forged"))
    report = check(tampered)
    assert found(report) == {
        ("usage", "stp_1/model_requested", "name"),
        ("usage", "stp_1/skill/repo-debug", "digest"),
        ("usage", "stp_1/tool/read_file", "(row)"),
        ("usage", "stp_1/skill/forged", "(row)"),
    }
    name = next(m for m in report.mismatches if m.field == "name")
    assert (name.stored, name.committed) == ('"gpt-evil"', '"gpt-4.1"')
