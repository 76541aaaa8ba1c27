"""The permission table (agentrt_base/access.py): it covers every RPC of the contract, the
docs carry exactly it, and its pieces agree with each other."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt.audit.v1 import audit_service_pb2
from agentrt.registry.v1 import registry_service_pb2
from agentrt.runtime.v1 import runtime_service_pb2, worker_service_pb2
from agentrt_base.access import (
    LINK_PERMISSION,
    RULES,
    Authorizer,
    Kind,
    Resource,
    Rule,
    check_namespace,
    decide,
    field_value,
    markdown_matrix,
    scope_like,
    scope_matches,
    visibility,
)
from agentrt_base.auth import CALLER, Principal
from agentrt_core.errors import InvalidArgument, PermissionDenied

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
_MODULES = (registry_service_pb2, runtime_service_pb2, worker_service_pb2, audit_service_pb2)


def _methods() -> dict[str, object]:
    found = {}
    for module in _MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                found[f"/{service.full_name}/{method.name}"] = method
    return found


def test_every_rpc_has_exactly_one_rule_and_every_field_it_names_exists() -> None:
    methods = _methods()
    assert sorted(RULES) == sorted(methods)
    for name, rule in RULES.items():
        request = methods[name].input_type._concrete_class()  # type: ignore[attr-defined]
        for f in rule.fields:
            assert isinstance(field_value(request, f.path), str), (name, f.path)
        for link in rule.links:
            assert isinstance(field_value(request, link.field.path), str), (name, link)
            # A link is looked up: only ids have a lookup (a namespace or a name is no link).
            assert link.field.kind not in (Kind.NAMESPACE, Kind.NAME), (name, link)


def test_the_docs_carry_the_table_the_server_enforces() -> None:
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- permission-matrix:start -->\n(.*?)<!-- permission-matrix:end -->", text, re.S
    )
    assert found is not None, "docs/security.md lost its permission matrix markers"
    assert found.group(1) == markdown_matrix(), (
        "docs/security.md's matrix differs from agentrt_base/access.py:"
        " regenerate it with `python -m agentrt_base.access`"
    )


def _like(pattern: str, value: str) -> bool:
    """SQL LIKE with backslash escapes, as both engines read it (case-sensitively: names and
    scopes are lower case)."""
    regex, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
            regex += re.escape(pattern[i])
        elif c == "%":
            regex += ".*"
        elif c == "_":
            regex += "."
        else:
            regex += re.escape(c)
        i += 1
    return re.fullmatch(regex, value, re.S) is not None


_NAMEISH = st.text(alphabet="ab_-.%\\*", max_size=8)


@given(pattern=_NAMEISH, name=st.text(alphabet="ab_-.%\\", max_size=8))
def test_the_sql_pattern_matches_what_the_python_rule_matches(pattern: str, name: str) -> None:
    assert _like(scope_like(pattern), name) == scope_matches(pattern, name)


def test_scopes_match_whole_names_with_star_as_the_only_wildcard() -> None:
    assert scope_matches("coding_agent*", "coding_agent")
    assert scope_matches("coding_agent*", "coding_agent_v2")
    assert not scope_matches("coding_agent*", "xcoding_agent")
    assert not scope_matches("coding_agent", "coding_agents")
    assert not scope_matches("coding?agent", "coding_agent")


@pytest.mark.parametrize("bad", ["Team", "team_a", "-a", "a-", "a" * 64, "a.b"])
def test_a_namespace_is_a_dns_label(bad: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_namespace(bad, "namespace")
    assert refused.value.violations[0].field == "namespace"
    assert check_namespace("", "namespace") == "default"
    assert check_namespace("team-a", "namespace") == "team-a"


_RULE = Rule("runs.read")
_A_RUN = Resource(namespace="team-a", name="coding_agent")


def test_a_decision_needs_a_granting_role_that_admits_the_resource() -> None:
    worker = Principal("w", ("worker",), ("coding_agent*",), ("team-a",))
    assert decide(worker, _RULE, _A_RUN) is None
    assert decide(worker, _RULE, Resource("team-b", "coding_agent")) == "OUTSIDE_SCOPE"
    assert decide(worker, _RULE, Resource("team-a", "other_agent")) == "OUTSIDE_SCOPE"
    assert decide(worker, Rule("runs.control"), _A_RUN) == "ROLE_MISSING"
    # A second role of wider reach admits what the first does not.
    both = Principal("x", ("worker", "auditor"), (), ("team-a", "team-b"))
    assert decide(both, _RULE, Resource("team-b", "other_agent")) is None
    assert decide(Principal("admin", ("admin",)), _RULE, Resource("any", "thing")) is None
    assert decide(Principal("nobody"), _RULE, None) == "ROLE_MISSING"


def test_visibility_is_the_union_of_the_granting_roles() -> None:
    p = Principal("x", ("client", "worker"), ("coding_agent*",), ("team-a",))
    seen = visibility(p, "runs.read")
    # client: every agent in team-a; worker: coding_agent* in team-a -> the client's reach.
    assert seen.namespaces == frozenset({"team-a"}) and seen.scopes is None
    assert visibility(Principal("a", ("admin",)), "runs.read").namespaces is None
    assert visibility(p, "work.acquire").scopes == ("coding_agent*",)


def test_kinds_with_a_lookup_are_the_ones_the_table_uses() -> None:
    used = {f.kind for rule in RULES.values() for f in rule.fields}
    assert used == set(Kind)


_CREATE_RUN = "/agentrt.runtime.v1.RuntimeService/CreateRun"


def test_every_id_a_request_links_to_is_decided_like_the_resource() -> None:
    """Issue 25: CreateRun's parent_run_id and derived_from_run_id need runs.read on the run
    they name, decided by decide(); an id nobody has is left to the handler (NOT_FOUND)."""
    known = {
        (Kind.THREAD, "thr_b"): Resource("team-b"),
        (Kind.RUN, "run_b"): Resource("team-b", "coding_agent"),
        (Kind.RUN, "run_a"): Resource("team-a", "coding_agent"),
    }

    async def lookup(kind: Kind, id_: str) -> Resource | None:
        return known.get((kind, id_))

    authorizer = Authorizer(lookup)

    def authorize(**fields: str) -> None:
        request = runtime_service_pb2.CreateRunRequest(thread_id="thr_b", **fields)
        asyncio.run(authorizer.authorize(_CREATE_RUN, request))

    token = CALLER.set(Principal("b", ("client",), (), ("team-b",)))
    try:
        authorize()
        for field in ("parent_run_id", "derived_from_run_id"):
            authorize(**{field: "run_b"})
            authorize(**{field: "run_x"})
            with pytest.raises(PermissionDenied) as refused:
                authorize(**{field: "run_a"})
            assert refused.value.reason == "OUTSIDE_SCOPE"
            assert refused.value.metadata["field"] == field
            assert refused.value.metadata["permission"] == LINK_PERMISSION
            assert refused.value.metadata["namespace"] == "team-a"
    finally:
        CALLER.reset(token)
