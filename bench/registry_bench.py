"""Registry benchmark: publish and get-by-tag over gRPC, next to an empty call; 1 MB digest.

Definitions have 50 tools and 10 skills (issue: "Registry"). For each engine the script
starts ``agentrt serve`` on a fresh database, publishes the components once, then measures in
interleaved repetitions: the empty call (Health/Check), PublishAgentVersion (new labels), and
GetAgentVersion by tag (``bench_agent:prod``), 16 calls in flight from one grpc.aio client
process. Separately it times the digest of a ~1 MB definition in-process.

    .venv/bin/python bench/registry_bench.py [--engines sqlite,postgres] [--calls 2000]

Output: a Markdown table on stdout (recorded in bench/results/registry.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "generated"),
]

import grpc  # noqa: E402
from google.protobuf import struct_pb2  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from agentrt.registry.v1 import (  # noqa: E402
    enum_pb2,
    message_pb2,
    registry_service_pb2_grpc,
)
from agentrt.registry.v1 import registry_service_pb2 as pb  # noqa: E402
from agentrt_core import canonical, publishing  # noqa: E402
from agentrt_core.model import ClosureEntry, ComponentDraft, ComponentKind  # noqa: E402
from bench.common import closed_loop, database, fmt_row, median_result, server_process  # noqa: E402

TOOLS, SKILLS = 50, 10


def _struct(data: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def components() -> list[message_pb2.ComponentDraft]:
    drafts = []
    for i in range(TOOLS):
        schema = {
            "type": "object",
            "properties": {
                f"arg{j}": {"type": "string", "description": f"argument {j} of tool {i}"}
                for j in range(6)
            },
            "required": ["arg0"],
        }
        drafts.append(
            message_pb2.ComponentDraft(
                kind=enum_pb2.COMPONENT_KIND_TOOL,
                name=f"tool_{i:02d}",
                version="1",
                spec=message_pb2.ComponentSpec(
                    tool=message_pb2.ToolSpec(description=f"tool {i}", input_schema=_struct(schema))
                ),
            )
        )
    for i in range(SKILLS):
        drafts.append(
            message_pb2.ComponentDraft(
                kind=enum_pb2.COMPONENT_KIND_SKILL,
                name=f"skill_{i:02d}",
                version="1.0.0",
                spec=message_pb2.ComponentSpec(
                    skill=message_pb2.SkillSpec(
                        description=f"skill {i}", instructions="Do the thing carefully. " * 40
                    )
                ),
            )
        )
    drafts.append(
        message_pb2.ComponentDraft(
            kind=enum_pb2.COMPONENT_KIND_MODEL_POLICY,
            name="bench-models",
            version="1",
            spec=message_pb2.ComponentSpec(
                model_policy=message_pb2.ModelPolicySpec(
                    candidates=[
                        message_pb2.ModelCandidate(
                            name="primary",
                            provider="p",
                            model_id="m1",
                            fallback_on=[enum_pb2.ERROR_CLASS_RATE_LIMITED],
                        ),
                        message_pb2.ModelCandidate(name="fallback", provider="p", model_id="m2"),
                    ]
                )
            ),
        )
    )
    drafts.append(
        message_pb2.ComponentDraft(
            kind=enum_pb2.COMPONENT_KIND_PERMISSION_POLICY,
            name="bench-perms",
            version="1",
            spec=message_pb2.ComponentSpec(
                permission_policy=message_pb2.PermissionPolicySpec(
                    default_decision=enum_pb2.PERMISSION_DECISION_ALLOW
                )
            ),
        )
    )
    return drafts


def definition(label: str) -> message_pb2.AgentDefinition:
    return message_pb2.AgentDefinition(
        agent_id="bench_agent",
        version_label=label,
        description=f"benchmark {label}",
        system_prompt=message_pb2.SystemPrompt(text="You are a benchmark agent."),
        model_policy="bench-models@1",
        skills=[f"skill_{i:02d}@^1.0" for i in range(SKILLS)],
        tools=[f"tool_{i:02d}@1" for i in range(TOOLS)],
        permission_policy="bench-perms@1",
    )


async def run_engine(engine: str, calls: int, repetitions: int) -> list[str]:
    rows: list[str] = []
    with database(engine) as url, server_process(url) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            registry = registry_service_pb2_grpc.RegistryServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            for draft in components():
                await registry.PublishComponent(pb.PublishComponentRequest(component=draft))
            first = await registry.PublishAgentVersion(
                pb.PublishAgentVersionRequest(definition=definition("v0"))
            )
            await registry.SetTag(
                pb.SetTagRequest(
                    agent_id="bench_agent", tag="prod", digest=first.agent_version.digest
                )
            )
            empty, publish, get_tag, empty_1, get_tag_1 = [], [], [], [], []
            label = iter(range(1, 10**9))
            for _ in range(repetitions):
                empty.append(
                    await closed_loop(
                        "empty call (Health/Check), 16 in flight",
                        lambda i: health.Check(health_pb2.HealthCheckRequest()),
                        calls,
                        16,
                    )
                )
                get_tag.append(
                    await closed_loop(
                        "GetAgentVersion by tag, 16 in flight",
                        lambda i: registry.GetAgentVersion(
                            pb.GetAgentVersionRequest(ref="bench_agent:prod")
                        ),
                        calls,
                        16,
                    )
                )
                # Latency proper: one call at a time, nothing queued behind it.
                empty_1.append(
                    await closed_loop(
                        "empty call, 1 in flight",
                        lambda i: health.Check(health_pb2.HealthCheckRequest()),
                        calls // 4,
                        1,
                    )
                )
                get_tag_1.append(
                    await closed_loop(
                        "GetAgentVersion by tag, 1 in flight",
                        lambda i: registry.GetAgentVersion(
                            pb.GetAgentVersionRequest(ref="bench_agent:prod")
                        ),
                        calls // 4,
                        1,
                    )
                )
                publish.append(
                    await closed_loop(
                        "PublishAgentVersion (new label), 16 in flight",
                        lambda i: registry.PublishAgentVersion(
                            pb.PublishAgentVersionRequest(definition=definition(f"v{next(label)}"))
                        ),
                        max(calls // 10, 50),
                        16,
                    )
                )
            base = median_result(empty)
            rows.append(f"| **{engine}** | | | | | |")
            rows.append(fmt_row(base, base))
            rows.append(fmt_row(median_result(get_tag), base))
            rows.append(fmt_row(median_result(publish), base))
            base_1 = median_result(empty_1)
            rows.append(fmt_row(base_1, base_1))
            rows.append(fmt_row(median_result(get_tag_1), base_1))
    return rows


def digest_1mb() -> tuple[int, float, float]:
    """Digest a ~1 MB definition (big prompt, skills with files, 50 tool schemas) in-process.

    Returns the canonical size, the median time of the digest itself (normalisation, JCS,
    SHA-256 of every component and of the agent document) and the median time of the full
    publish-time validation, which adds the JSON Schema meta-validation of each tool schema.
    """
    drafts = [
        ComponentDraft(
            ComponentKind.SKILL,
            f"big_skill_{i}",
            "1.0.0",
            "",
            {
                "description": "large skill",
                "instructions": "x" * 1000,
                "files": [
                    {"path": f"f{j}.md", "content": ("lorem ipsum " * 2000)[:22_000]}
                    for j in range(10)
                ],
            },
        )
        for i in range(4)
    ]
    drafts += [
        ComponentDraft(
            ComponentKind.TOOL,
            f"big_tool_{i}",
            "1",
            "",
            {
                "description": "tool",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        f"p{j}": {"type": "string", "description": "d" * 80, "maxLength": 100}
                        for j in range(25)
                    },
                },
            },
        )
        for i in range(50)
    ]
    prompt = "You are an agent. " * 5000
    closure = [
        ClosureEntry(
            "system_prompt",
            ComponentKind.PROMPT,
            "",
            "",
            canonical.component_digest("PROMPT", "", "", "", {"text": prompt}),
            "",
        )
    ]
    closure.append(
        ClosureEntry(
            "model_policy", ComponentKind.MODEL_POLICY, "m", "1", "sha256:" + "1" * 64, "m@1"
        )
    )
    closure += [
        ClosureEntry(
            f"tools[{d.name}]",
            d.kind,
            d.name,
            d.version,
            "sha256:" + "2" * 64,
            "",
            "sha256:" + "3" * 64,
        )
        for d in drafts
        if d.kind is ComponentKind.TOOL
    ]
    closure += [
        ClosureEntry(f"skills[{d.name}]", d.kind, d.name, d.version, "sha256:" + "4" * 64, "")
        for d in drafts
        if d.kind is ComponentKind.SKILL
    ]
    size = sum(len(publishing.digest_component(d).canonical) for d in drafts)
    size += len(publishing.digest_inline_prompt(prompt).canonical)
    digest_ms, validate_ms = [], []
    for _ in range(15):
        started = time.perf_counter()
        for d in drafts:
            if d.kind is ComponentKind.TOOL:
                canonical.tool_digests(d.name, d.version, d.description, d.spec)
            else:
                canonical.component_digest(d.kind, d.name, d.version, d.description, d.spec)
        canonical.component_digest("PROMPT", "", "", "", {"text": prompt})
        canonical.agent_digest("big_agent", "v1", "", publishing.to_agent_closure(closure))
        digest_ms.append((time.perf_counter() - started) * 1000)
    for _ in range(3):
        started = time.perf_counter()
        for d in drafts:
            publishing.digest_component(d)
        validate_ms.append((time.perf_counter() - started) * 1000)
    return size, statistics.median(digest_ms), statistics.median(validate_ms)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    print("| engine / call | calls/s | p50 ms | p99 ms | rate vs empty | p50 vs empty |")
    print("|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        for row in asyncio.run(run_engine(engine, args.calls, args.repetitions)):
            print(row, flush=True)
    size, digest_ms, validate_ms = digest_1mb()
    print(
        f"\nDigest of a {size / 1e6:.2f} MB definition (normalisation, RFC 8785, SHA-256 of "
        f"every component and the agent): median {digest_ms:.1f} ms over 15 runs"
    )
    print(
        f"Full publish-time validation of the same components (adds JSON Schema "
        f"meta-validation of 50 tool schemas): median {validate_ms:.0f} ms"
    )


if __name__ == "__main__":
    main()
