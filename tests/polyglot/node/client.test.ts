// A Node client and worker against a real `agentrt serve` (AGENTRT_TARGET, host:port), through
// code generated from protos/ by protobuf-es and called over connect-node's gRPC transport:
// publish a definition (recomputing every digest it is given), create a thread and a run, work
// the run as a worker (acquire, heartbeat, a model step, a tool step, a checkpoint, a completion
// check, finish), watch it live, drop the stream and resume from the last sequence (and the
// thread's stream from its cursor), recompute the hash chain of what was watched, read the
// provenance, and decode a refusal's ErrorInfo and BadRequest with connect and with grpc-js.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import { type DescMessage, type MessageShape, fromBinary, toBinary, toJson } from "@bufbuild/protobuf";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import canonicalize from "canonicalize";
import { AuditService } from "./gen/agentrt/audit/v1/audit_service_pb.js";
import { ComponentKind, PermissionDecision } from "./gen/agentrt/registry/v1/enum_pb.js";
import type { ComponentDraft } from "./gen/agentrt/registry/v1/message_pb.js";
import {
  type PublishComponentRequest,
  PublishComponentRequestSchema,
  type PublishComponentResponse,
  PublishComponentResponseSchema,
  RegistryService,
} from "./gen/agentrt/registry/v1/registry_service_pb.js";
import {
  AttemptOutcome,
  EventType,
  RunStatus,
  StepStatus,
  StepType,
} from "./gen/agentrt/runtime/v1/enum_pb.js";
import { type Event, EventSchema } from "./gen/agentrt/runtime/v1/event_pb.js";
import { RuntimeService } from "./gen/agentrt/runtime/v1/runtime_service_pb.js";
import { WorkerService } from "./gen/agentrt/runtime/v1/worker_service_pb.js";
import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "./gen/google/rpc/status_pb.js";
import { type JsonObject, digestOf, eventHash } from "./rules.js";
import { VerificationError, openEnvelope, parseVerifierKey } from "./tlog.js";

const target = process.env["AGENTRT_TARGET"];
if (!target) throw new Error("AGENTRT_TARGET (host:port of a running agentrt serve) is not set");

const transport = createGrpcTransport({ baseUrl: `http://${target}` });
const registry = createClient(RegistryService, transport);
const runtime = createClient(RuntimeService, transport);
const worker = createClient(WorkerService, transport);
const audit = createClient(AuditService, transport);
const timeoutMs = 10_000;

// Each component as published (the draft) beside its spec as the digest document spells it
// (docs/digest.md §1.1: proto field names, defaults omitted, enums by bare name, sets sorted),
// so the test recomputes the digest the registry answers from what it sent.
interface Published {
  draft: Omit<ComponentDraft, "$typeName" | "spec"> & { spec: ComponentDraft["spec"] };
  specDocument: JsonObject;
}

const READ_FILE_SCHEMA: JsonObject = {
  type: "object",
  properties: { path: { type: "string" } },
  required: ["path"],
  additionalProperties: false,
};

const COMPONENTS: Record<string, Published> = {
  skill: {
    draft: {
      kind: ComponentKind.SKILL,
      name: "node-debug",
      version: "1.0.0",
      description: "Debugging notes.",
      spec: {
        $typeName: "agentrt.registry.v1.ComponentSpec",
        spec: {
          case: "skill",
          value: {
            $typeName: "agentrt.registry.v1.SkillSpec",
            description: "Debug a repository",
            instructions: "Reproduce first.",
            files: [
              { $typeName: "agentrt.registry.v1.SkillFile", path: "z.md", content: "last\n" },
              { $typeName: "agentrt.registry.v1.SkillFile", path: "a.md", content: "first\n" },
            ],
          },
        },
      },
    },
    // files is a set keyed by path: sorted.
    specDocument: {
      description: "Debug a repository",
      instructions: "Reproduce first.",
      files: [
        { path: "a.md", content: "first\n" },
        { path: "z.md", content: "last\n" },
      ],
    },
  },
  tool: {
    draft: {
      kind: ComponentKind.TOOL,
      name: "read_file",
      version: "1",
      description: "Reads a workspace file.",
      spec: {
        $typeName: "agentrt.registry.v1.ComponentSpec",
        spec: {
          case: "tool",
          value: {
            $typeName: "agentrt.registry.v1.ToolSpec",
            description: "Read a UTF-8 text file.",
            inputSchema: READ_FILE_SCHEMA,
            sideEffects: false,
          },
        },
      },
    },
    // side_effects false is a default: omitted.
    specDocument: { description: "Read a UTF-8 text file.", input_schema: READ_FILE_SCHEMA },
  },
  modelPolicy: {
    draft: {
      kind: ComponentKind.MODEL_POLICY,
      name: "node-models",
      version: "1",
      description: "",
      spec: {
        $typeName: "agentrt.registry.v1.ComponentSpec",
        spec: {
          case: "modelPolicy",
          value: {
            $typeName: "agentrt.registry.v1.ModelPolicySpec",
            candidates: [
              {
                $typeName: "agentrt.registry.v1.ModelCandidate",
                name: "primary",
                provider: "anthropic",
                modelId: "claude-sonnet-4",
                parameters: { temperature: 0.2, max_tokens: 4096 },
                maxContextTokens: 200000n,
                fallbackOn: [],
              },
            ],
          },
        },
      },
    },
    // An int64 of a spec is a JSON number in the document (not the mapping's string).
    specDocument: {
      candidates: [
        {
          name: "primary",
          provider: "anthropic",
          model_id: "claude-sonnet-4",
          parameters: { temperature: 0.2, max_tokens: 4096 },
          max_context_tokens: 200000,
        },
      ],
    },
  },
  permissionPolicy: {
    draft: {
      kind: ComponentKind.PERMISSION_POLICY,
      name: "node-perms",
      version: "1",
      description: "Reads only.",
      spec: {
        $typeName: "agentrt.registry.v1.ComponentSpec",
        spec: {
          case: "permissionPolicy",
          value: {
            $typeName: "agentrt.registry.v1.PermissionPolicySpec",
            rules: [
              {
                $typeName: "agentrt.registry.v1.PermissionRule",
                tool: "read_file",
                decision: PermissionDecision.ALLOW,
              },
            ],
            defaultDecision: PermissionDecision.DENY,
          },
        },
      },
    },
    // Enums by their bare name (protobuf-es strips the prefix from the TypeScript members too).
    specDocument: {
      rules: [{ tool: "read_file", decision: PermissionDecision[PermissionDecision.ALLOW] }],
      default_decision: PermissionDecision[PermissionDecision.DENY],
    },
  },
  completionPolicy: {
    draft: {
      kind: ComponentKind.COMPLETION_POLICY,
      name: "node-done",
      version: "1",
      description: "",
      spec: {
        $typeName: "agentrt.registry.v1.ComponentSpec",
        spec: {
          case: "completionPolicy",
          value: {
            $typeName: "agentrt.registry.v1.CompletionPolicySpec",
            checks: [
              {
                $typeName: "agentrt.registry.v1.CompletionCheck",
                name: "tests-pass",
                description: "The suite is green.",
                condition: 0,
                artifactKind: "",
                tool: "",
              },
            ],
          },
        },
      },
    },
    specDocument: { checks: [{ name: "tests-pass", description: "The suite is green." }] },
  },
};

function componentDocument(published: Published): JsonObject {
  const { draft, specDocument } = published;
  return {
    type: "agentrt.component.v1",
    kind: ComponentKind[draft.kind],
    name: draft.name,
    version: draft.version,
    description: draft.description,
    spec: specDocument,
  };
}

const SYSTEM_PROMPT = "You are an agent driven from Node.";

async function publish(): Promise<{ digest: string; componentDigests: Map<string, string> }> {
  const componentDigests = new Map<string, string>();
  const entries: Record<string, JsonObject> = {};
  for (const [role, published] of Object.entries(COMPONENTS)) {
    const { component } = await registry.publishComponent(
      { component: published.draft },
      { timeoutMs },
    );
    assert.ok(component);
    const digest = digestOf(componentDocument(published));
    assert.equal(component.digest, digest, `${role}: the registry's digest is not ours`);
    componentDigests.set(digest, role);
    entries[role] = { name: published.draft.name, version: published.draft.version, digest };
  }
  const { agentVersion } = await registry.publishAgentVersion(
    {
      definition: {
        agentId: "node_agent",
        versionLabel: "v1",
        description: "Published from Node.",
        systemPrompt: { source: { case: "text", value: SYSTEM_PROMPT } },
        modelPolicy: "node-models@1",
        skills: ["node-debug@^1.0"],
        tools: ["read_file@1"],
        permissionPolicy: "node-perms@1",
        completionPolicy: "node-done@1",
      },
    },
    { timeoutMs },
  );
  assert.ok(agentVersion);
  // The inline system prompt is an anonymous PROMPT: no name, no version.
  const prompt = { type: "agentrt.component.v1", kind: "PROMPT", description: "", spec: { text: SYSTEM_PROMPT } };
  componentDigests.set(digestOf(prompt), "systemPrompt");
  const agentDocument = {
    type: "agentrt.agent.v1",
    agent_id: "node_agent",
    version_label: "v1",
    description: "Published from Node.",
    system_prompt: { digest: digestOf(prompt) },
    model_policy: entries["modelPolicy"],
    skills: [entries["skill"]],
    tools: [{ ...entries["tool"], schema_digest: digestOf(READ_FILE_SCHEMA) }],
    permission_policy: entries["permissionPolicy"],
    completion_policy: entries["completionPolicy"],
  };
  assert.equal(agentVersion.digest, digestOf(agentDocument));
  return { digest: agentVersion.digest, componentDigests };
}

/** Uploads `content` with PutBlob (a client stream: a header, then the bytes). */
async function putBlob(content: string, mediaType: string): Promise<string> {
  const bytes = new TextEncoder().encode(content);
  async function* messages() {
    yield { content: { case: "header" as const, value: { mediaType, size: BigInt(bytes.length) } } };
    yield { content: { case: "chunk" as const, value: bytes } };
  }
  const { blob } = await runtime.putBlob(messages(), { timeoutMs });
  assert.ok(blob);
  assert.equal(blob.digest, "sha256:" + createHash("sha256").update(bytes).digest("hex"));
  return blob.digest;
}

/** Events of `runId` after `afterSequence`, until `stop` says so or the stream ends. */
async function watchRun(
  runId: string,
  afterSequence: bigint,
  stop: (events: Event[]) => boolean = () => false,
): Promise<Event[]> {
  const events: Event[] = [];
  const abort = new AbortController();
  try {
    for await (const { event } of runtime.watchRun(
      { runId, afterSequence },
      { signal: abort.signal },
    )) {
      assert.ok(event);
      events.push(event);
      if (stop(events)) {
        abort.abort(); // drop the stream, as a client that goes away does
        break;
      }
    }
  } catch (error) {
    if (!(error instanceof ConnectError && error.code === Code.Canceled)) throw error;
  }
  return events;
}

/** Every event's hash recomputes from its wire form and links to the one before. */
function checkChain(events: Event[]): void {
  let previous = "";
  for (const event of events) {
    const wire = toJson(EventSchema, event, { useProtoFieldName: true }) as JsonObject;
    assert.equal(eventHash(wire), event.hash, `event ${event.sequence} does not recompute`);
    assert.equal(event.prevHash, previous, `event ${event.sequence} does not link`);
    previous = event.hash;
  }
}

test("a Node client and worker drive a run end to end", async () => {
  const { digest, componentDigests } = await publish();

  const { thread } = await runtime.createThread({ title: "from node" }, { timeoutMs });
  assert.ok(thread);
  const { run } = await runtime.createRun(
    {
      threadId: thread.id,
      agentRef: "node_agent@v1",
      goal: { objective: "read the app", scope: ["src/"] },
      requestId: "node-run-1",
    },
    { timeoutMs },
  );
  assert.ok(run?.agent);
  assert.equal(run.agent.agentDigest, digest);

  // A live watcher, started before the worker: it drops its stream after three events.
  const firstWatch = watchRun(run.id, 0n, (events) => events.length === 3);

  const acquired = await worker.acquireRun(
    {
      workerId: "node-worker",
      filter: { agentIds: ["node_agent"] },
      leaseTtl: { seconds: 30n },
      wait: { seconds: 5n },
    },
    { timeoutMs: 15_000 },
  );
  const { fence, agent } = acquired;
  assert.ok(fence && agent);
  assert.equal(acquired.run?.id, run.id);

  // The bound definition: the agent document and every component document, JCS bytes whose
  // digests recompute to the one published (docs/digest.md §1.5).
  const bound = JSON.parse(new TextDecoder().decode(agent.definitionJson)) as JsonObject;
  assert.equal(bound["agent_digest"], digest);
  assert.equal(digestOf(bound["agent"]), digest);
  const components = bound["components"] as Record<string, JsonObject>;
  assert.deepEqual(Object.keys(components).sort(), [...componentDigests.keys()].sort());
  for (const [componentDigest, document] of Object.entries(components)) {
    assert.equal(digestOf(document), componentDigest);
  }

  const beat = await worker.heartbeat({ fence }, { timeoutMs });
  assert.equal(beat.cancelRequested, false);
  assert.equal(beat.pauseRequested, false);

  const { turn } = await worker.beginTurn({ fence }, { timeoutMs });
  assert.ok(turn);

  const model = await worker.beginStep(
    {
      fence,
      turnId: turn.id,
      type: StepType.MODEL_CALL,
      idempotencyKey: "model-1",
      details: {
        case: "modelCall",
        value: { estimatedInputTokens: 100n, skills: ["node-debug"], tools: ["read_file"] },
      },
    },
    { timeoutMs },
  );
  assert.equal(model.resolved?.model?.candidateName, "primary");
  assert.equal(model.resolved?.systemPromptText, SYSTEM_PROMPT);
  assert.ok(model.step);
  await worker.endStep(
    {
      fence,
      stepId: model.step.id,
      status: StepStatus.SUCCEEDED,
      usage: { inputTokens: 100n, outputTokens: 20n, costUsd: 0.0015 },
      reportedModelId: "claude-sonnet-4-20250514",
    },
    { timeoutMs },
  );

  const tool = await worker.beginStep(
    {
      fence,
      turnId: turn.id,
      type: StepType.TOOL_CALL,
      idempotencyKey: "read-1",
      details: { case: "toolCall", value: { tool: "read_file", arguments: { path: "src/app.py" } } },
    },
    { timeoutMs },
  );
  assert.equal(tool.step?.type, StepType.TOOL_CALL);
  assert.ok(tool.step);
  const output = await putBlob("def app():\n    return 42\n", "text/x-python");
  await worker.endStep(
    { fence, stepId: tool.step.id, status: StepStatus.SUCCEEDED, outputRef: output },
    { timeoutMs },
  );
  const { artifact } = await worker.createArtifact(
    { fence, stepId: tool.step.id, name: "app.py", blobDigest: output, labels: { kind: "src" } },
    { timeoutMs },
  );
  assert.ok(artifact);

  const state = await putBlob('{"read":["src/app.py"]}', "application/json");
  const { checkpoint } = await worker.writeCheckpoint(
    { fence, stateRef: state, afterSequence: tool.step.sequence, requestId: "cp-1" },
    { timeoutMs },
  );
  assert.equal(checkpoint?.stateRef, state);

  const check = await worker.beginStep(
    {
      fence,
      turnId: turn.id,
      type: StepType.COMPLETION_CHECK,
      details: { case: "completionCheck", value: { check: "tests-pass" } },
    },
    { timeoutMs },
  );
  assert.ok(check.step);
  await worker.endStep({ fence, stepId: check.step.id, status: StepStatus.SUCCEEDED }, { timeoutMs });
  await worker.endTurn({ fence, turnId: turn.id }, { timeoutMs });
  const finished = await worker.finishAttempt(
    { fence, outcome: AttemptOutcome.SUCCEEDED_COMPLETE_RUN, resultSummary: "read it" },
    { timeoutMs },
  );
  assert.equal(finished.run?.status, RunStatus.COMPLETED);

  // The live watch saw the first three events; resuming after the last sequence it saw gives
  // the rest, each once, and the stream ends with OK after run.ended.
  const first = await firstWatch;
  assert.deepEqual(first.map((e) => e.sequence), [1n, 2n, 3n]);
  const rest = await watchRun(run.id, first[2]!.sequence);
  const events = [...first, ...rest];
  assert.deepEqual(
    events.map((e) => e.sequence),
    events.map((_, i) => BigInt(i + 1)),
  );
  assert.equal(events[0]!.eventType, EventType.RUN_CREATED);
  assert.equal(events.at(-1)!.eventType, EventType.RUN_ENDED);
  const types = new Set(events.map((e) => e.eventType));
  for (const type of [EventType.ATTEMPT_STARTED, EventType.STEP_ENDED, EventType.CHECKPOINT_WRITTEN]) {
    assert.ok(types.has(type), `no ${EventType[type]} event`);
  }
  checkChain(events);

  // The thread's stream, dropped after two events and resumed from the cursor of the second.
  const threadEvents: Event[] = [];
  let cursor = "";
  for (const resume of [false, true]) {
    const abort = new AbortController();
    try {
      for await (const response of runtime.watchThread(
        { threadId: thread.id, afterCursor: cursor },
        { signal: abort.signal },
      )) {
        assert.ok(response.event);
        threadEvents.push(response.event);
        cursor = response.cursor;
        const done = resume
          ? response.event.eventType === EventType.RUN_ENDED
          : threadEvents.length === 2;
        if (done) {
          abort.abort();
          break;
        }
      }
    } catch (error) {
      if (!(error instanceof ConnectError && error.code === Code.Canceled)) throw error;
    }
  }
  assert.equal(threadEvents[0]!.eventType, EventType.THREAD_CREATED);
  // The run's events, in order and each once, after the thread's own first event.
  assert.deepEqual(
    threadEvents.slice(1).map((e) => e.id),
    events.map((e) => e.id),
  );
  checkChain(threadEvents.slice(0, 1));

  // The server agrees about the chain it served.
  const verified = await audit.verifyRun({ runId: run.id }, { timeoutMs });
  assert.equal(verified.intact, true);
  assert.equal(verified.headHash, events.at(-1)!.hash);

  // Provenance of the artifact: the step that made it, its attempt, the run, the agent version.
  const { records } = await audit.getProvenance(
    { target: { case: "artifactId", value: artifact.id } },
    { timeoutMs },
  );
  assert.equal(records.length, 1);
  const record = records[0]!;
  assert.equal(record.step?.id, tool.step.id);
  assert.equal(record.run?.id, run.id);
  assert.equal(record.agentVersion?.digest, digest);
  assert.equal(record.attempt?.workerId, "node-worker");
  const recordedModel = record.steps.find((s) => s.id === model.step!.id)?.versions?.model;
  assert.equal(recordedModel?.requestedModelId, "claude-sonnet-4");
  assert.equal(recordedModel?.reportedModelId, "claude-sonnet-4-20250514");

  // The run's attestation, signed when it ended (issue 31, item 3), checked from the DSSE
  // and in-toto specs (tlog.ts) with the server's key alone: it names this chain head, this
  // agent and these steps, and a changed payload no longer verifies.
  const { keys } = await registry.getSigningKeys({}, { timeoutMs });
  const trusted = [parseVerifierKey(keys[0]!.verifierKey)];
  const attestation = await audit.getRunAttestation({ runId: run.id }, { timeoutMs });
  assert.equal(attestation.final, true);
  const text = new TextDecoder().decode(openEnvelope(attestation.envelope, trusted));
  assert.equal(canonicalize(JSON.parse(text)), text);
  const statement = JSON.parse(text);
  assert.equal(statement._type, "https://in-toto.io/Statement/v1");
  assert.equal(statement.predicateType, "https://agentrt.dev/run-provenance/v1");
  const runSubject = statement.subject.find(
    (s: { name: string }) => s.name === `agentrt-run:${run.id}`,
  );
  assert.equal(runSubject.digest.sha256, verified.headHash.replace("sha256:", ""));
  assert.equal(statement.predicate.agent.digest, digest);
  assert.deepEqual(
    statement.predicate.steps.map((s: { id: string }) => s.id),
    record.steps.map((s) => s.id),
  );
  const forged = JSON.parse(attestation.envelope);
  forged.payload = Buffer.from(text.replace(digest, "sha256:" + "0".repeat(64))).toString("base64");
  assert.throws(() => openEnvelope(JSON.stringify(forged), trusted), VerificationError);
  const otherType = { ...JSON.parse(attestation.envelope), payloadType: "application/json" };
  assert.throws(() => openEnvelope(JSON.stringify(otherType), trusted), VerificationError);
});

// A component whose name breaks the name grammar: INVALID_ARGUMENT with ErrorInfo and a
// BadRequest violation naming the field.
const BAD: Omit<PublishComponentRequest, "$typeName"> = {
  component: {
    ...COMPONENTS["tool"]!.draft,
    $typeName: "agentrt.registry.v1.ComponentDraft",
    name: "Read File!",
  },
  requestId: "",
};

function assertRefusal(info: MessageShape<typeof ErrorInfoSchema>, bad: MessageShape<typeof BadRequestSchema>) {
  assert.equal(info.domain, "agentrt");
  assert.ok(info.reason.length > 0);
  assert.deepEqual(
    bad.fieldViolations.map((v) => v.field),
    ["component.name"],
  );
  assert.ok(bad.fieldViolations[0]!.description.length > 0);
}

test("a refusal's ErrorInfo and BadRequest decode with connect", async () => {
  const error = await registry.publishComponent(BAD, { timeoutMs }).then(
    () => assert.fail("the bad name was accepted"),
    (e: unknown) => ConnectError.from(e),
  );
  assert.equal(error.code, Code.InvalidArgument);
  const [info] = error.findDetails(ErrorInfoSchema);
  const [bad] = error.findDetails(BadRequestSchema);
  assert.ok(info && bad, "missing details");
  assertRefusal(info, bad);
});

test("a refusal's ErrorInfo and BadRequest decode with grpc-js", async () => {
  const client = new grpc.Client(target, grpc.credentials.createInsecure());
  const codec = <Desc extends DescMessage>(schema: Desc) => ({
    serialize: (message: MessageShape<Desc>) => Buffer.from(toBinary(schema, message)),
    deserialize: (bytes: Buffer) => fromBinary(schema, bytes),
  });
  const request = codec(PublishComponentRequestSchema);
  const response = codec(PublishComponentResponseSchema);
  try {
    const error = await new Promise<grpc.ServiceError>((resolve, reject) => {
      client.makeUnaryRequest<PublishComponentRequest, PublishComponentResponse>(
        "/agentrt.registry.v1.RegistryService/PublishComponent",
        request.serialize,
        response.deserialize,
        { $typeName: "agentrt.registry.v1.PublishComponentRequest", ...BAD },
        { deadline: Date.now() + timeoutMs },
        (err) => (err ? resolve(err) : reject(new Error("the bad name was accepted"))),
      );
    });
    assert.equal(error.code, grpc.status.INVALID_ARGUMENT);
    // google.rpc.Status, binary, in the grpc-status-details-bin trailer.
    const [trailer] = error.metadata.get("grpc-status-details-bin");
    assert.ok(trailer instanceof Buffer, "no grpc-status-details-bin trailer");
    const status = fromBinary(StatusSchema, trailer);
    assert.equal(status.code, grpc.status.INVALID_ARGUMENT);
    const info = status.details.map((d) => anyUnpack(d, ErrorInfoSchema)).find((m) => m);
    const bad = status.details.map((d) => anyUnpack(d, BadRequestSchema)).find((m) => m);
    assert.ok(info && bad, "missing details");
    assertRefusal(info, bad);
  } finally {
    client.close();
  }
});
