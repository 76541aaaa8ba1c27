"""The ``FindUsages`` use case: which runs and steps used a component, a tool schema, an
agent version or a model, newest first, a page at a time.

One read transaction, one snapshot, like every audit call (``services/audit.py`` says why).
Each kind of query is one or more ordered index ranges (``store/audit_usages.py``); a query
that needs several (a model matched as requested and as reported, a policy pinned by several
agent versions) merges their pages here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session

from agentrt_base.access import Visibility
from agentrt_core import refs
from agentrt_core.errors import InvalidArgument, NotFound
from agentrt_core.model import Component
from agentrt_core.paging import PageRequest, next_page_token, page_request
from registry import store as registry_store
from runtime_service.services.context import Runtime
from runtime_service.store import audit_reads, audit_usages
from runtime_service.store.audit_usages import ModelKind

QueryKind = Literal["component_ref", "tool_schema_digest", "agent_digest", "model_id"]
ModelMatch = Literal["ANY", "REQUESTED", "REPORTED"]

#: The usage rows a model query reads, one index range each.
_MODEL_KINDS: dict[ModelMatch, list[ModelKind]] = {
    "REQUESTED": ["model_requested"],
    "REPORTED": ["model_reported"],
    "ANY": ["model_requested", "model_reported"],
}


@dataclass(frozen=True)
class Usage:
    run_id: str
    thread_id: str
    step_id: str
    step_sequence: int
    step_type: str
    attempt_id: str
    agent_digest: str
    matched: str
    time: dt.datetime
    #: The keyset position: (time, step or run id, usage name); unique per record.
    key: tuple[dt.datetime, str, str]


@dataclass(frozen=True)
class UsageQuery:
    kind: QueryKind
    value: str
    model_match: ModelMatch = "ANY"
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None


def _merge(pages: Sequence[Sequence[Usage]], size: int) -> tuple[list[Usage], bool]:
    """Merge per-source pages (each newest first, each ``size + 1`` long unless exhausted)
    into one page; records with the same key (one step matched twice) become one."""
    merged: dict[tuple[dt.datetime, str, str], Usage] = {}
    for page in pages:
        for usage in page:
            earlier = merged.get(usage.key)
            merged[usage.key] = usage if earlier is None else _combine(earlier, usage)
    ordered = sorted(merged.values(), key=lambda u: u.key, reverse=True)
    return ordered[:size], len(ordered) > size


def _combine(a: Usage, b: Usage) -> Usage:
    # A step whose requested and reported model are the same id matches a model query twice.
    if a.matched.endswith("(requested)") and b.matched.endswith("(reported)"):
        return dataclasses.replace(
            a, matched=a.matched.replace("(requested)", "(requested, reported)")
        )
    return a


class UsageService:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def find_usages(
        self, query: UsageQuery, visible: Visibility, page_size: int, page_token: str
    ) -> tuple[list[Usage], str]:
        """One page of the uses, by runs ``visible`` admits, of what ``query`` names. The
        namespace filter is part of each query: the page and its token are cut from what the
        caller may see, so neither says anything of another namespace (issue 25)."""
        field_name = query.kind
        if not query.value:
            raise InvalidArgument.for_field(
                "query", "required: a component, schema, agent or model"
            )
        if query.kind in ("tool_schema_digest", "agent_digest") and not refs.is_digest(query.value):
            raise InvalidArgument.for_field(
                field_name,
                f"{query.value!r} is not a digest: expected 'sha256:' and 64 lowercase hex digits",
            )
        if query.kind == "model_id" and len(query.value) > 200:
            raise InvalidArgument.for_field("model_id", "at most 200 characters")
        if query.start_time and query.end_time and query.start_time >= query.end_time:
            raise InvalidArgument.for_field("end_time", "must be after start_time")
        component_ref: refs.Ref | None = None
        if query.kind == "component_ref":
            try:
                component_ref = refs.parse_ref(query.value)
            except refs.RefError as exc:
                raise InvalidArgument.for_field("component_ref", str(exc)) from exc
            if isinstance(component_ref, refs.TagRef):
                raise InvalidArgument.for_field(
                    "component_ref", "components have no tags: give name@version or a digest"
                )
        filters = {
            "kind": query.kind,
            "value": query.value,
            "match": query.model_match,
            "start": query.start_time,
            "end": query.end_time,
        }
        page = page_request(page_size, page_token, filters, key=(dt.datetime, str, str))
        times = audit_usages.TimeRange(query.start_time, query.end_time)
        ns = visible.namespaces

        def read(session: Session) -> tuple[list[Usage], bool]:
            audit_reads.snapshot(session)
            if component_ref is not None:
                return self._component_usages(session, query, component_ref, page, ns)
            if query.kind == "tool_schema_digest":
                rows = audit_usages.steps_using_schema(session, query.value, times, page, ns)
                return _merge(
                    [
                        _step_usages(
                            rows, lambda r: f"{r.name}@{r.version} schema {r.schema_digest}"
                        )
                    ],
                    page.size,
                )
            if query.kind == "agent_digest":
                rows = audit_usages.runs_of_agent(session, query.value, times, page, ns)
                return _merge([_run_usages(rows, "")], page.size)
            # One ordered index range per kind, merged here: an IN over both kinds would lose
            # the index order and sort every use of a popular model.
            return _merge(
                [
                    _step_usages(
                        audit_usages.steps_using_model(session, kind, query.value, times, page, ns),
                        lambda r: f"model {r.name} ({r.kind.removeprefix('model_')})",
                    )
                    for kind in _MODEL_KINDS[query.model_match]
                ],
                page.size,
            )

        usages, more = await self._rt.read(read)
        token = next_page_token(list(usages[-1].key), filters) if more and usages else ""
        return usages, token

    def _component_usages(
        self,
        session: Session,
        query: UsageQuery,
        ref: refs.Ref,
        page: PageRequest,
        namespaces: frozenset[str] | None,
    ) -> tuple[list[Usage], bool]:
        component = _component(session, ref, query.value)
        shown = (
            f"{component.ref} {component.digest}"
            if not component.anonymous
            else (f"(inline system prompt) {component.digest}")
        )
        times = audit_usages.TimeRange(query.start_time, query.end_time)
        if component.kind.value in ("PERMISSION_POLICY", "COMPLETION_POLICY"):
            # Steps do not record these policies' digests: the runs that used one are the
            # runs bound to an agent version that pins it (run-level records, step_id "").
            return _merge(
                [
                    _run_usages(
                        audit_usages.runs_of_agent(session, digest, times, page, namespaces),
                        f"{shown} (in {agent_id}@{label})",
                    )
                    for digest, agent_id, label in audit_usages.agents_pinning(
                        session, component.digest
                    )
                ],
                page.size,
            )
        rows = audit_usages.steps_using_digest(session, component.digest, times, page, namespaces)
        return _merge([_step_usages(rows, lambda r: shown)], page.size)


# -- helpers ---------------------------------------------------------------------------------


def _component(session: Session, ref: refs.Ref, text: str) -> Component:
    match ref:
        case refs.VersionRef(name=name, version=version):
            row = registry_store.component_by_version(session, name, version)
        case refs.NameDigestRef(name=name, digest=digest):
            row = registry_store.component_by_digest(session, digest)
            row = row if row is not None and row.name == name else None
        case refs.DigestRef(digest=digest):
            row = registry_store.component_by_digest(session, digest)
            if row is None:
                _refuse_other_digest(session, digest)
        case _:
            row = None
    if row is None:
        raise NotFound("component", text, f"no published component matches {text!r}")
    return registry_store.component_of(row)


def _refuse_other_digest(session: Session, digest: str) -> None:
    """A bare digest that is not a component's may still be one the caller can query: say
    which, rather than only "not found"."""
    if registry_store.agent_version_by_digest(session, digest) is not None:
        raise NotFound(
            "component",
            digest,
            f"{digest} is an agent version's digest, not a component's: query agent_digest "
            "(agentrt audit usages --agent) instead",
        )
    if audit_usages.is_schema_digest(session, digest):
        raise NotFound(
            "component",
            digest,
            f"{digest} is a tool input schema digest, not a component's: query "
            "tool_schema_digest (agentrt audit usages --schema) instead",
        )


def _step_usages(rows: Iterable[Any], matched: Callable[[Any], str]) -> list[Usage]:
    """The usages of rows of ``audit_usages``' step queries; ``matched`` says, per row, what
    matched the query."""
    return [
        Usage(
            run_id=r.run_id,
            thread_id=r.thread_id,
            step_id=r.step_id,
            step_sequence=r.sequence,
            step_type=r.type,
            attempt_id=r.attempt_id,
            agent_digest=r.agent_digest,
            matched=matched(r),
            time=r.start_time,
            key=(r.start_time, r.step_id, r.name),
        )
        for r in rows
    ]


def _run_usages(rows: Iterable[Any], matched: str) -> list[Usage]:
    """The run-level usages of rows of ``audit_usages.runs_of_agent``; ``matched`` empty
    names the agent version the run was bound to."""
    return [
        Usage(
            run_id=r.id,
            thread_id=r.thread_id,
            step_id="",
            step_sequence=0,
            step_type="",
            attempt_id="",
            agent_digest=r.agent_digest,
            matched=matched or f"{r.agent_id}@{r.agent_version_label} {r.agent_digest}",
            time=r.create_time,
            key=(r.create_time, r.id, ""),
        )
        for r in rows
    ]
