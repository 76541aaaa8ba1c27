"""The usage rows a step's recorded versions give: the index behind FindUsages.

The step path writes them (``runtime_service.step_rules`` and the store) and an auditor
re-derives them from a run's events to check the stored ones (``agentrt_core.audit_rows``):
one rule, shared, so the two cannot disagree.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class UsedVersions(Protocol):
    """What the usage rows are built from: a step's recorded versions. A :class:`Step` has
    them; so has the step as its events committed to it (``audit_rows``, which re-derives
    the rows with these same two functions to check the stored ones)."""

    @property
    def id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def start_time(self) -> Any: ...
    @property
    def model_policy_digest(self) -> str: ...
    @property
    def requested_model_id(self) -> str: ...
    @property
    def reported_model_id(self) -> str: ...
    @property
    def system_prompt_digest(self) -> str: ...
    @property
    def skills_json(self) -> str: ...
    @property
    def tools_json(self) -> str: ...


def usage_rows(step: UsedVersions) -> list[dict[str, Any]]:
    """Every version a new step used, as rows of the index behind FindUsages."""
    rows: list[dict[str, Any]] = []

    def add(kind: str, name: str, version: str, digest: str, schema: str = "") -> None:
        rows.append(
            {
                "step_id": step.id,
                "kind": kind,
                "name": name,
                "version": version,
                "digest": digest,
                "schema_digest": schema,
                "run_id": step.run_id,
                "start_time": step.start_time,
            }
        )

    if step.model_policy_digest:
        add("model_policy", "", "", step.model_policy_digest)
        add("model_requested", step.requested_model_id, "", "")
    if step.system_prompt_digest:
        add("system_prompt", "", "", step.system_prompt_digest)
    if step.skills_json != "[]":
        for skill in json.loads(step.skills_json):
            add("skill", skill["name"], skill["version"], skill["digest"])
    if step.tools_json != "[]":
        for tool in json.loads(step.tools_json):
            add("tool", tool["name"], tool["version"], tool["digest"], tool["schema_digest"])
    return rows


def reported_usage_rows(step: UsedVersions) -> list[dict[str, Any]]:
    """The usage row of the model the provider reported, set when the step ends."""
    if not step.reported_model_id:
        return []
    return [
        {
            "step_id": step.id,
            "kind": "model_reported",
            "name": step.reported_model_id,
            "version": "",
            "digest": "",
            "schema_digest": "",
            "run_id": step.run_id,
            "start_time": step.start_time,
        }
    ]
