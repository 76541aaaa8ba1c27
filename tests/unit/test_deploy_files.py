"""deploy/: the alerting rules and the Grafana dashboard name only what the server exposes.

A rule or a panel on a metric the server does not expose (a typo, a metric renamed) would
never fire or stay empty, silently; these tests make that a failure. ``promtool`` (Debian's
``prometheus`` package, installed by ``.ci/run``) checks the rules file as Prometheus would
load it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agentrt_base.metrics import SPECS, Spec

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "agentrt.json"

#: Labels Prometheus adds to every scraped series, and a histogram's bucket label.
TARGET_LABELS = {"instance", "job", "le"}


def series(spec: Spec) -> dict[str, set[str]]:
    """The series names a metric exposes, each with the labels it may be selected by."""
    labels = set(spec.labels) | TARGET_LABELS
    if spec.kind == "histogram":
        return {f"{spec.name}{suffix}": labels for suffix in ("_bucket", "_count", "_sum")}
    return {spec.exposed_name: labels}


EXPOSED = {name: labels for spec in SPECS for name, labels in series(spec).items()}


def expressions() -> list[tuple[str, str]]:
    """Every PromQL expression of the rules file and the dashboard, with where it is."""
    found = [
        (f"{RULES.name}: {rule['alert']}", rule["expr"])
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    ]
    dashboard = json.loads(DASHBOARD.read_text())
    found += [
        (f"{DASHBOARD.name}: {panel['title']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    found += [
        (f"{DASHBOARD.name}: variable {variable['name']}", variable["query"]["query"])
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return found


def names_in(expr: str) -> list[tuple[str, set[str]]]:
    """Each agentrt series an expression selects, with the label names it matches on."""
    selected = []
    for match in re.finditer(r"\b(agentrt_\w+)(\{([^}]*)\})?", expr):
        matchers = match.group(3) or ""
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
        selected.append((match.group(1), labels))
    return selected


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=[w for w, _ in expressions()])
def test_every_expression_selects_what_the_server_exposes(where: str, expr: str) -> None:
    selected = names_in(expr)
    assert selected or "up{" in expr, f"{where} names no agentrt metric: {expr}"
    for name, labels in selected:
        assert name in EXPOSED, f"{where}: {name} is not a series the server exposes"
        assert labels <= EXPOSED[name], f"{where}: {name} has no label {labels - EXPOSED[name]}"
    # by/without clauses too: a label no series has would group everything into one.
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (part.strip() for part in clause.split(","))):
            assert any(label in EXPOSED[name] for name, _ in selected), (where, label)


def test_the_checker_catches_a_misspelt_metric() -> None:
    assert names_in('rate(agentrt_grpc_server_handeld_total{grpc_code="OK"}[5m])') == [
        ("agentrt_grpc_server_handeld_total", {"grpc_code"})
    ]
    assert "agentrt_grpc_server_handeld_total" not in EXPOSED


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool: .ci/run installs it")
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
