// The cross-language vectors of tests/vectors/ recomputed in Node, byte for byte: every
// canonical text is JCS, every digest is SHA-256 of it, every agent vector is a Merkle tree over
// the component vectors, and every event vector's hash recomputes from the Event as a Node
// client receives it (protobuf-es's proto3 JSON mapping of the message, which must print the
// vector's input exactly as the Python server's does).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { fromJson, toJson } from "@bufbuild/protobuf";
import { EventSchema } from "./gen/agentrt/runtime/v1/event_pb.js";
import { type JsonObject, digestOf, eventDocument, eventHash, jcs, sha256Text } from "./rules.js";

interface Vector {
  description: string;
  kind: "component" | "agent" | "schema" | "event";
  input: JsonObject;
  canonical: string;
  digest: string;
}

const DIR = new URL("../../../vectors/", import.meta.url);
const vectors = new Map<string, Vector>(
  readdirSync(DIR)
    .filter((name) => name.endsWith(".json"))
    .sort()
    .map((name) => [name, JSON.parse(readFileSync(new URL(name, DIR), "utf8")) as Vector]),
);

test("the vector set is there, with several event vectors", () => {
  assert.ok(vectors.size >= 16, `only ${vectors.size} vectors`);
  const kinds = new Set([...vectors.values()].map((v) => v.kind));
  assert.deepEqual([...kinds].sort(), ["agent", "component", "event", "schema"]);
  assert.ok([...vectors.values()].filter((v) => v.kind === "event").length >= 5);
});

for (const [name, vector] of vectors) {
  test(`${name}: the canonical text is JCS and the digest is its SHA-256`, () => {
    // JSON.parse reads every number as a double, as JCS does.
    assert.equal(jcs(JSON.parse(vector.canonical)), vector.canonical);
    assert.equal(sha256Text(vector.canonical), vector.digest);
    if (vector.kind === "schema") assert.equal(digestOf(vector.input["schema"]), vector.digest);
  });
}

for (const [name, vector] of vectors) {
  if (vector.kind !== "event") continue;
  test(`${name}: the event hash recomputes from the wire`, () => {
    assert.equal(jcs(eventDocument(vector.input)), vector.canonical);
    assert.equal(eventHash(vector.input), vector.digest);
    assert.equal(vector.input["hash"], vector.digest);
    // What a protobuf-es client holds prints as the vector's input, member for member.
    const event = fromJson(EventSchema, vector.input);
    assert.deepEqual(toJson(EventSchema, event, { useProtoFieldName: true }), vector.input);
  });
}

test("agent vectors are Merkle trees over the component vectors", () => {
  const byDigest = new Map([...vectors.values()].map((v) => [v.digest, v]));
  const agents = [...vectors.values()].filter((v) => v.kind === "agent");
  assert.ok(agents.length >= 2);
  for (const agent of agents) {
    const document = JSON.parse(agent.canonical) as JsonObject;
    const entries: JsonObject[] = [];
    for (const key of ["system_prompt", "model_policy", "permission_policy", "completion_policy"]) {
      if (document[key] !== undefined) entries.push(document[key] as JsonObject);
    }
    entries.push(...(document["skills"] as JsonObject[]), ...(document["tools"] as JsonObject[]));
    for (const entry of entries) {
      const component = byDigest.get(entry["digest"] as string);
      assert.ok(component, `no component vector for ${JSON.stringify(entry)}`);
      const body = JSON.parse(component.canonical) as JsonObject;
      assert.equal(body["name"], entry["name"]);
      assert.equal(body["version"], entry["version"]);
      if (entry["schema_digest"] !== undefined) {
        const spec = body["spec"] as JsonObject;
        assert.equal(digestOf(spec["input_schema"]), entry["schema_digest"]);
      }
    }
  }
});
