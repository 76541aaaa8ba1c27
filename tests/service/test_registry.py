"""RegistryService through real gRPC on both engines."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from agentrt.registry.v1 import enum_pb2, message_pb2
from agentrt.registry.v1 import registry_service_pb2 as pb
from tests import registry_data as data
from tests.support import error_details

pytestmark = pytest.mark.fresh_server(
    reason="publishes coding_agent under labels its other tests publish with other content,"
    " and lists every version"
)

DIGEST_Z = "sha256:" + "0" * 64


@pytest.fixture
def published(stub: Any) -> pb.PublishAgentVersionResponse:
    data.publish_all(stub, data.coding_components())
    response: pb.PublishAgentVersionResponse = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition(),
            provenance=message_pb2.Provenance(
                publisher="ci@example",
                source_repo="git@example:agents.git",
                commit="abc123",
                pipeline_url="https://ci.example/p/1",
                labels={"build": "17"},
            ),
        ),
        timeout=10,
    )
    return response


def refused(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value


def violations(error: grpc.RpcError) -> dict[str, str]:
    return {v.field: v.description for v in error_details(error)["BadRequest"].field_violations}


# -- components -------------------------------------------------------------------------------


def test_publish_component_is_idempotent_and_immutable(stub: Any) -> None:
    first = stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("read_file", "1")))
    assert first.created
    assert first.component.digest.startswith("sha256:")
    assert first.component.schema_digest.startswith("sha256:")
    again = stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("read_file", "1")))
    assert not again.created
    assert again.component == first.component  # same digest, same publish record

    changed = data.tool(
        "read_file", "1", {"type": "object", "properties": {"p": {"type": "string"}}}
    )
    error = refused(stub.PublishComponent, pb.PublishComponentRequest(component=changed))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    info = error_details(error)["ErrorInfo"]
    assert info.reason == "VERSION_CONFLICT"
    assert info.metadata["existing_digest"] == first.component.digest
    assert first.component.digest in error.details()
    got = stub.GetComponent(pb.GetComponentRequest(ref="read_file@1")).component
    assert got == first.component


def test_get_component_by_every_reference_form(stub: Any) -> None:
    component = stub.PublishComponent(
        pb.PublishComponentRequest(component=data.skill("repo-debug", "2.1.0"))
    ).component
    for ref in ("repo-debug@2.1.0", f"repo-debug@{component.digest}", component.digest):
        assert stub.GetComponent(pb.GetComponentRequest(ref=ref)).component == component
    assert component.spec.skill.files[0].path == "checklist.md"
    missing = refused(stub.GetComponent, pb.GetComponentRequest(ref="repo-debug@9.9.9"))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert error_details(missing)["ResourceInfo"].resource_name == "repo-debug@9.9.9"
    for bad in ("repo-debug:prod", "repo-debug@^2", "Repo@1", "sha256:abc", ""):
        error = refused(stub.GetComponent, pb.GetComponentRequest(ref=bad))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert "ref" in violations(error)


@pytest.mark.parametrize(
    ("draft", "field"),
    [
        (message_pb2.ComponentDraft(name="x", version="1"), "component.kind"),
        (data.tool("read_file", "01"), "component.version"),
        (data.tool("read_file", "1.2"), "component.version"),
        (data.tool("Read-File", "1"), "component.name"),
        (data.tool("read_file", "1", {"type": "objekt"}), "component.spec.tool.input_schema"),
        (
            data.tool("read_file", "1", {"properties": {"a": {"minimum": "one"}}}),
            "component.spec.tool.input_schema",
        ),
        (
            message_pb2.ComponentDraft(
                kind=enum_pb2.COMPONENT_KIND_TOOL,
                name="t",
                version="1",
                spec=message_pb2.ComponentSpec(prompt=message_pb2.PromptSpec(text="hi")),
            ),
            "component.spec.prompt",
        ),
        (
            message_pb2.ComponentDraft(
                kind=enum_pb2.COMPONENT_KIND_PROMPT,
                name="p",
                version="1",
                spec=message_pb2.ComponentSpec(
                    prompt=message_pb2.PromptSpec(text="x" * (3 * 1024 * 1024))
                ),
            ),
            "component.spec.prompt",
        ),
    ],
)
def test_bad_component_is_invalid_argument_naming_the_field(
    stub: Any, draft: Any, field: str
) -> None:
    error = refused(stub.PublishComponent, pb.PublishComponentRequest(component=draft))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert any(f.startswith(field) for f in violations(error)), violations(error)
    assert not stub.ListComponents(pb.ListComponentsRequest()).components  # nothing changed


def test_model_policy_rules_are_checked(stub: Any) -> None:
    draft = data.model_policy()
    draft.spec.model_policy.candidates[1].name = "primary"
    draft.spec.model_policy.candidates[0].fallback_on.append(enum_pb2.ERROR_CLASS_LEASE_LOST)
    error = refused(stub.PublishComponent, pb.PublishComponentRequest(component=draft))
    fields = violations(error)
    assert "component.spec.model_policy.candidates[1].name" in fields
    assert "component.spec.model_policy.candidates[0].fallback_on" in fields


def test_a_name_keeps_its_kind_and_version_scheme(stub: Any) -> None:
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("read_file", "1")))
    kind_error = refused(
        stub.PublishComponent,
        pb.PublishComponentRequest(component=data.skill("read_file", "2.0.0")),
    )
    assert kind_error.code() == grpc.StatusCode.FAILED_PRECONDITION
    scheme_error = refused(
        stub.PublishComponent, pb.PublishComponentRequest(component=data.tool("read_file", "2.0.0"))
    )
    assert scheme_error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_list_components_filters_and_pages(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("read_file", "2")))
    tools = stub.ListComponents(
        pb.ListComponentsRequest(kind=enum_pb2.COMPONENT_KIND_TOOL)
    ).components
    assert sorted((t.name, t.version) for t in tools) == [
        ("apply_patch", "2"),
        ("read_file", "1"),
        ("read_file", "2"),
        ("run_tests", "1"),
    ]
    seen, token = [], ""
    while True:
        page = stub.ListComponents(pb.ListComponentsRequest(page_size=2, page_token=token))
        seen += [(c.name, c.version) for c in page.components]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 8
    first = stub.ListComponents(pb.ListComponentsRequest(page_size=1))
    error = refused(
        stub.ListComponents,
        pb.ListComponentsRequest(page_size=1, page_token=first.next_page_token, name="read_file"),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused(stub.ListComponents, pb.ListComponentsRequest(page_size=-1)).code()
        == grpc.StatusCode.INVALID_ARGUMENT
    )


# -- agent versions ---------------------------------------------------------------------------


def test_publish_agent_resolves_closure(stub: Any, published: Any) -> None:
    version = published.agent_version
    assert published.created
    assert version.digest.startswith("sha256:")
    closure = version.closure
    assert closure.system_prompt.name == "" and closure.system_prompt.digest.startswith("sha256:")
    assert [(s.name, s.version, s.requested_ref) for s in closure.skills] == [
        ("repo-debug", "2.1.0", "repo-debug@^2.1")
    ]
    assert [t.name for t in closure.tools] == ["apply_patch", "read_file", "run_tests"]
    assert all(t.schema_digest.startswith("sha256:") for t in closure.tools)
    assert closure.model_policy.name == "coding-balanced"
    assert version.publish.provenance.commit == "abc123"
    assert version.publish.provenance.labels["build"] == "17"

    again = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(definition=data.coding_definition())
    )
    assert not again.created
    assert again.agent_version.digest == version.digest
    assert again.agent_version.publish == version.publish


def test_range_resolves_to_highest_published_match_at_publish_time(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    stub.PublishComponent(pb.PublishComponentRequest(component=data.skill("repo-debug", "2.3.1")))
    stub.PublishComponent(pb.PublishComponentRequest(component=data.skill("repo-debug", "3.0.0")))
    stub.PublishComponent(
        pb.PublishComponentRequest(component=data.skill("repo-debug", "2.4.0-rc.1"))
    )
    version = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(definition=data.coding_definition())
    ).agent_version
    assert version.closure.skills[0].version == "2.3.1"


def test_label_conflict_names_existing_digest(stub: Any, published: Any) -> None:
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("apply_patch", "3")))
    error = refused(
        stub.PublishAgentVersion,
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition(apply_patch="apply_patch@3")
        ),
    )
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (
        error_details(error)["ErrorInfo"].metadata["existing_digest"]
        == published.agent_version.digest
    )


def test_unknown_reference_is_not_found_naming_it(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    definition = data.coding_definition()
    definition.tools.append("write_file@1")
    error = refused(stub.PublishAgentVersion, pb.PublishAgentVersionRequest(definition=definition))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error_details(error)["ResourceInfo"].resource_name == "write_file@1"
    assert error_details(error)["ErrorInfo"].metadata["field"] == "definition.tools[3]"
    assert not stub.ListAgentVersions(pb.ListAgentVersionsRequest()).agent_versions


def test_bad_definitions_name_their_fields(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    definition = data.coding_definition(label="sha256:nope")
    definition.model_policy = "read_file@1"  # wrong kind
    definition.skills.append("repo-debug:prod")
    definition.tools.append("read_file@1")
    definition.agent_id = "Coding Agent"
    error = refused(stub.PublishAgentVersion, pb.PublishAgentVersionRequest(definition=definition))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = violations(error)
    for expected in (
        "definition.agent_id",
        "definition.version_label",
        "definition.skills[1]",
        "definition.tools[3]",
    ):
        assert expected in fields, fields
    fixed = data.coding_definition()
    fixed.model_policy = "read_file@1"
    kind_error = refused(stub.PublishAgentVersion, pb.PublishAgentVersionRequest(definition=fixed))
    assert kind_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "definition.model_policy" in violations(kind_error)


def test_get_agent_version_says_how_it_resolved(stub: Any, published: Any) -> None:
    digest = published.agent_version.digest
    stub.SetTag(
        pb.SetTagRequest(
            agent_id="coding_agent", tag="prod", digest=digest, expect_absent=True, actor="deployer"
        )
    )
    cases = {
        "coding_agent@agent_v7": enum_pb2.REFERENCE_KIND_LABEL,
        f"coding_agent@{digest}": enum_pb2.REFERENCE_KIND_DIGEST,
        digest: enum_pb2.REFERENCE_KIND_DIGEST,
        "coding_agent:prod": enum_pb2.REFERENCE_KIND_TAG,
    }
    for ref, kind in cases.items():
        response = stub.GetAgentVersion(pb.GetAgentVersionRequest(ref=ref))
        assert response.agent_version.digest == digest
        assert response.resolution.kind == kind
        assert response.resolution.requested_ref == ref
        assert response.resolution.resolved_digest == digest
    tagged = stub.GetAgentVersion(pb.GetAgentVersionRequest(ref="coding_agent:prod"))
    assert tagged.resolution.tag == "prod" and tagged.resolution.tag_event_sequence == 1
    assert list(tagged.agent_version.tags) == ["prod"]
    for missing in ("coding_agent@agent_v9", "coding_agent:canary", DIGEST_Z, f"other@{digest}"):
        assert (
            refused(stub.GetAgentVersion, pb.GetAgentVersionRequest(ref=missing)).code()
            == grpc.StatusCode.NOT_FOUND
        )
    for bad in ("coding_agent", "coding_agent@^1", "sha256:XYZ"):
        assert (
            refused(stub.GetAgentVersion, pb.GetAgentVersionRequest(ref=bad)).code()
            == grpc.StatusCode.INVALID_ARGUMENT
        )


def test_compute_digest_matches_publish_and_stores_nothing(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    computed = stub.ComputeDigest(
        pb.ComputeDigestRequest(agent_definition=data.coding_definition())
    )
    assert computed.canonical_json.startswith(b"{")
    assert (
        refused(stub.GetAgentVersion, pb.GetAgentVersionRequest(ref="coding_agent@agent_v7")).code()
        == grpc.StatusCode.NOT_FOUND
    )
    published = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(definition=data.coding_definition())
    )
    assert published.agent_version.digest == computed.digest
    again = stub.ComputeDigest(pb.ComputeDigestRequest(agent_definition=data.coding_definition()))
    assert again.existing_digest == computed.digest
    component = stub.ComputeDigest(pb.ComputeDigestRequest(component=data.tool("new_tool", "1")))
    assert component.schema_digest.startswith("sha256:")
    assert (
        refused(stub.GetComponent, pb.GetComponentRequest(ref="new_tool@1")).code()
        == grpc.StatusCode.NOT_FOUND
    )


def test_list_agent_versions_newest_first_with_pages(stub: Any, published: Any) -> None:
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("apply_patch", "3")))
    v8 = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition("agent_v8", "apply_patch@3")
        )
    ).agent_version
    first = stub.ListAgentVersions(
        pb.ListAgentVersionsRequest(agent_id="coding_agent", page_size=1)
    )
    assert [v.version_label for v in first.agent_versions] == ["agent_v8"]
    second = stub.ListAgentVersions(
        pb.ListAgentVersionsRequest(
            agent_id="coding_agent", page_size=1, page_token=first.next_page_token
        )
    )
    assert [v.version_label for v in second.agent_versions] == ["agent_v7"]
    assert second.next_page_token == ""
    assert v8.digest != published.agent_version.digest


# -- tags ---------------------------------------------------------------------------------------


def test_tags_compare_and_swap_with_history(stub: Any, published: Any) -> None:
    v7 = published.agent_version.digest
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("apply_patch", "3")))
    v8 = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition("agent_v8", "apply_patch@3")
        )
    ).agent_version.digest

    created = stub.SetTag(
        pb.SetTagRequest(
            agent_id="coding_agent",
            tag="prod",
            digest=v7,
            expect_absent=True,
            actor="ci",
            reason="first",
        )
    )
    assert created.tag.digest == v7 and created.event.sequence == 1
    absent_again = refused(
        stub.SetTag,
        pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8, expect_absent=True),
    )
    assert absent_again.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_details(absent_again)["ErrorInfo"].metadata["current_digest"] == v7

    stale = refused(
        stub.SetTag,
        pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8, expected_digest=v8),
    )
    assert stale.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_details(stale)["ErrorInfo"].reason == "TAG_EXPECTATION_FAILED"

    moved = stub.SetTag(
        pb.SetTagRequest(
            agent_id="coding_agent",
            tag="prod",
            digest=v8,
            expected_digest=v7,
            actor="ci",
            reason="ship v8",
            provenance=message_pb2.Provenance(pipeline_url="https://ci.example/p/2"),
        )
    )
    assert moved.tag.digest == v8 and moved.event.from_digest == v7
    repeat = stub.SetTag(
        pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v8, expected_digest=v7)
    )
    assert repeat.tag.digest == v8 and not repeat.HasField("event")  # idempotent retry

    deleted = stub.DeleteTag(
        pb.DeleteTagRequest(agent_id="coding_agent", tag="prod", expected_digest=v8, actor="ops")
    )
    assert deleted.event.type == enum_pb2.TAG_EVENT_TYPE_DELETE
    history = stub.ListTagHistory(pb.ListTagHistoryRequest(agent_id="coding_agent")).events
    assert [(e.sequence, e.from_digest, e.to_digest) for e in history] == [
        (3, v8, ""),
        (2, v7, v8),
        (1, "", v7),
    ]
    assert (
        history[1].reason == "ship v8"
        and history[1].provenance.pipeline_url == "https://ci.example/p/2"
    )
    assert (
        refused(stub.DeleteTag, pb.DeleteTagRequest(agent_id="coding_agent", tag="prod")).code()
        == grpc.StatusCode.NOT_FOUND
    )


def test_tag_requests_are_validated(stub: Any, published: Any) -> None:
    v7 = published.agent_version.digest
    bad = refused(
        stub.SetTag, pb.SetTagRequest(agent_id="coding_agent", tag="-bad tag", digest="sha256:12")
    )
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert {"tag", "digest"} <= set(violations(bad))
    foreign = refused(
        stub.SetTag, pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=DIGEST_Z)
    )
    assert foreign.code() == grpc.StatusCode.NOT_FOUND
    nobody = refused(stub.SetTag, pb.SetTagRequest(agent_id="nobody", tag="prod", digest=v7))
    assert nobody.code() == grpc.StatusCode.NOT_FOUND
    assert not stub.ListTags(pb.ListTagsRequest(agent_id="coding_agent")).tags


def test_concurrent_tag_moves_serialise(stub: Any, published: Any) -> None:
    """Many movers expecting the same old digest: exactly one wins, the rest are told why."""
    v7 = published.agent_version.digest
    stub.PublishComponent(pb.PublishComponentRequest(component=data.tool("apply_patch", "3")))
    v8 = stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition("agent_v8", "apply_patch@3")
        )
    ).agent_version.digest
    stub.SetTag(pb.SetTagRequest(agent_id="coding_agent", tag="prod", digest=v7))
    outcomes: list[Any] = []

    def move(i: int) -> None:
        try:
            stub.SetTag(
                pb.SetTagRequest(
                    agent_id="coding_agent",
                    tag="prod",
                    digest=v8,
                    expected_digest=v7,
                    actor=f"m{i}",
                )
            )
            outcomes.append("ok")
        except grpc.RpcError as error:
            outcomes.append(error.code())

    threads = [threading.Thread(target=move, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The first mover wins; later ones find the tag already at v8 (an idempotent success).
    assert set(outcomes) <= {"ok", grpc.StatusCode.ABORTED}
    history = stub.ListTagHistory(
        pb.ListTagHistoryRequest(agent_id="coding_agent", tag="prod")
    ).events
    assert [e.to_digest for e in history] == [v8, v7]


# -- diff -----------------------------------------------------------------------------------------


def test_diff_names_the_changed_tool_and_schema(stub: Any, published: Any) -> None:
    stub.PublishComponent(
        pb.PublishComponentRequest(
            component=data.tool(
                "apply_patch",
                "3",
                {"type": "object", "properties": {"diff": {"type": "string"}}},
                side_effects=True,
            )
        )
    )
    stub.PublishAgentVersion(
        pb.PublishAgentVersionRequest(
            definition=data.coding_definition("agent_v8", "apply_patch@3")
        )
    )
    diff = stub.DiffAgentVersions(
        pb.DiffAgentVersionsRequest(
            base_ref="coding_agent@agent_v7", target_ref="coding_agent@agent_v8"
        )
    )
    assert [(c.path, c.type) for c in diff.changes] == [
        ("tools[apply_patch]", enum_pb2.CHANGE_TYPE_MODIFIED)
    ]
    change = diff.changes[0]
    assert change.base_value.startswith("apply_patch@2 sha256:")
    assert change.target_value.startswith("apply_patch@3 sha256:")
    assert change.base_schema_digest != change.target_schema_digest
    same = stub.DiffAgentVersions(
        pb.DiffAgentVersionsRequest(
            base_ref="coding_agent@agent_v7", target_ref="coding_agent@agent_v7"
        )
    )
    assert not same.changes
    missing = refused(
        stub.DiffAgentVersions,
        pb.DiffAgentVersionsRequest(
            base_ref="coding_agent@agent_v7", target_ref="coding_agent@nope"
        ),
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND


def test_concurrent_identical_publishes_make_one_version(stub: Any) -> None:
    data.publish_all(stub, data.coding_components())
    results: list[Any] = []

    def publish() -> None:
        results.append(
            stub.PublishAgentVersion(
                pb.PublishAgentVersionRequest(definition=data.coding_definition())
            )
        )

    threads = [threading.Thread(target=publish) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1
    assert len({r.agent_version.digest for r in results}) == 1
    assert len(stub.ListAgentVersions(pb.ListAgentVersionsRequest()).agent_versions) == 1
