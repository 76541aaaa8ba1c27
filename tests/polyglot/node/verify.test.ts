// The registry log verified from Node against a real `agentrt serve` (AGENTRT_TARGET,
// host:port) with tlog.ts, a verifier written from the specifications (RFC 6962/9162, C2SP
// signed-note and tlog-checkpoint, RFC 8785) and no code of this repository. The one thing
// trusted is the server's active verifier key, parsed and checked here; everything else the
// server sends (checkpoint fields, leaves, proofs, prefix hashes) is recomputed or verified.
// Publishes, tag moves and deletions each come back with an entry proven against a signed
// checkpoint; GetInclusionProof, GetConsistencyProof and GetLogEntries are verified; and
// altered proofs, notes, roots and leaves must all fail the same verifier.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ComponentKind } from "./gen/agentrt/registry/v1/enum_pb.js";
import type { Checkpoint, LogInclusion } from "./gen/agentrt/registry/v1/message_pb.js";
import { RegistryService } from "./gen/agentrt/registry/v1/registry_service_pb.js";
import { newKey } from "./test_keys.js";
import {
  type CheckpointBody,
  CompactRange,
  type Leaf,
  type VerifierKey,
  VerificationError,
  equalBytes,
  hex,
  leafHash,
  openCheckpoint,
  openNote,
  parseLeaf,
  parseVerifierKey,
  verifyConsistency,
  verifyInclusion,
} from "./tlog.js";

const target = process.env["AGENTRT_TARGET"];
if (!target) throw new Error("AGENTRT_TARGET (host:port of a running agentrt serve) is not set");

const registry = createClient(RegistryService, createGrpcTransport({ baseUrl: `http://${target}` }));
const timeoutMs = 10_000;

// The server may be shared: names of this run alone.
const RUN = randomBytes(4).toString("hex");
const AGENT = `nodelog_${RUN}`;
const MODELS = `nodelog-models-${RUN}`;

// Set by the first test: the only key trusted, and the log's origin as first seen.
let trusted: VerifierKey[] = [];
let origin: string | undefined;

const rejects = (fn: () => unknown, what: RegExp) =>
  assert.throws(fn, (e: unknown) => e instanceof VerificationError && what.test(e.message));

/** The leaf has these members with these values (and whatever else its type has). */
function assertLeaf(leaf: Leaf, expected: Record<string, string | number>): void {
  assert.deepEqual(Object.fromEntries(Object.keys(expected).map((key) => [key, leaf[key]])), expected);
}

/** A checkpoint as a client may use it: its note verified with the trusted key, parsed, of
 * the one log seen so far; the message's convenience fields must say what the note says. */
function openCheckpointOf(checkpoint: Checkpoint | undefined): CheckpointBody {
  assert.ok(checkpoint, "no checkpoint");
  const body = openCheckpoint(checkpoint.note, trusted);
  origin ??= body.origin;
  assert.equal(body.origin, origin, "a checkpoint of another log");
  assert.deepEqual(
    { origin: checkpoint.origin, size: checkpoint.treeSize, root: hex(checkpoint.rootHash) },
    { origin: body.origin, size: body.size, root: hex(body.root) },
    "the Checkpoint fields disagree with its signed note",
  );
  return body;
}

interface Proven {
  index: bigint;
  leafBytes: Uint8Array;
  leaf: Leaf;
  checkpoint: CheckpointBody;
}

/** An entry with its audit path: the checkpoint verified, the leaf parsed and hashed, the path
 * from that hash leading to the checkpoint's root. */
function verifyLogInclusion(inclusion: LogInclusion | undefined): Proven {
  assert.ok(inclusion?.entry, "no log inclusion");
  const checkpoint = openCheckpointOf(inclusion.checkpoint);
  assert.equal(inclusion.treeSize, checkpoint.size, "the proof is not against its checkpoint's size");
  const { index, leaf: leafBytes } = inclusion.entry;
  const leaf = parseLeaf(leafBytes);
  verifyInclusion(index, checkpoint.size, leafHash(leafBytes), inclusion.hashes, checkpoint.root);
  return { index, leafBytes, leaf, checkpoint };
}

/** GetInclusionProof of the entry at `index` or publishing `digest`; tree size 0: current. */
async function inclusionProof(entry: bigint | string, treeSize = 0n): Promise<LogInclusion | undefined> {
  const target =
    typeof entry === "string"
      ? { case: "digest" as const, value: entry }
      : { case: "index" as const, value: entry };
  return (await registry.getInclusionProof({ target, treeSize }, { timeoutMs })).inclusion;
}

async function currentCheckpoint(): Promise<CheckpointBody> {
  return openCheckpointOf((await registry.getCheckpoint({}, { timeoutMs })).checkpoint);
}

async function publishModels(): Promise<{ digest: string; proven: Proven; again: Proven }> {
  const component = {
    kind: ComponentKind.MODEL_POLICY,
    name: MODELS,
    version: "1",
    description: "",
    spec: {
      spec: {
        case: "modelPolicy" as const,
        value: {
          candidates: [{ name: "primary", provider: "anthropic", modelId: "claude-4", fallbackOn: [] }],
        },
      },
    },
  };
  const first = await registry.publishComponent({ component }, { timeoutMs });
  assert.ok(first.created && first.component);
  // Publishing the same content again writes nothing and proves the earlier entry.
  const second = await registry.publishComponent({ component }, { timeoutMs });
  assert.equal(second.created, false);
  return {
    digest: first.component.digest,
    proven: verifyLogInclusion(first.logInclusion),
    again: verifyLogInclusion(second.logInclusion),
  };
}

async function publishVersion(label: string): Promise<{ digest: string; proven: Proven }> {
  const { agentVersion, created, logInclusion } = await registry.publishAgentVersion(
    {
      definition: {
        agentId: AGENT,
        versionLabel: label,
        systemPrompt: { source: { case: "text", value: `You are ${label} of a logged agent.` } },
        modelPolicy: `${MODELS}@1`,
      },
    },
    { timeoutMs },
  );
  assert.ok(created && agentVersion);
  return { digest: agentVersion.digest, proven: verifyLogInclusion(logInclusion) };
}

async function moveTag(digest: string): Promise<Proven> {
  const request = { agentId: AGENT, tag: "prod", digest };
  const { event, logInclusion } = await registry.setTag(request, { timeoutMs });
  assert.ok(event);
  const proven = verifyLogInclusion(logInclusion);
  assert.equal(proven.leaf["sequence"], Number(event.sequence));
  return proven;
}

// What this run's publishes and moves were proven to be, by index, for GetLogEntries to match.
const ours = new Map<bigint, Uint8Array>();
const seen: CheckpointBody[] = [];
let digests: { models: string; v1: string; v2: string } | undefined;

function keep(proven: Proven): Proven {
  ours.set(proven.index, proven.leafBytes);
  seen.push(proven.checkpoint);
  return proven;
}

test("the server's active key is a C2SP Ed25519 verifier key whose key hash checks out", async () => {
  const { keys } = await registry.getSigningKeys({}, { timeoutMs });
  const active = keys.filter((key) => key.active);
  assert.equal(active.length, 1, "not exactly one active key");
  assert.equal(keys[0], active[0], "the active key is not listed first");
  const key = active[0]!;
  // parseVerifierKey recomputes the key hash from the name and the key.
  const parsed = parseVerifierKey(key.verifierKey);
  assert.equal(key.keyId, `${parsed.name}+${hex(parsed.id)}`);
  assert.ok(equalBytes(key.publicKey, parsed.publicKey));
  // A verifier key whose key hash does not match its name and key is refused.
  const material = key.verifierKey.slice(parsed.name.length + 10);
  const otherId = hex(parsed.id).replace(/^./, (c) => (c === "0" ? "1" : "0"));
  rejects(() => parseVerifierKey(`${parsed.name}+${otherId}+${material}`), /key ID/);
  trusted = [parsed];
});

test("every publish, tag move and deletion comes back proven in a signed checkpoint", async () => {
  const models = await publishModels();
  keep(models.proven);
  const { digest } = models;
  const kind = "MODEL_POLICY";
  assertLeaf(models.proven.leaf, { type: "component", digest, kind, name: MODELS, version: "1" });
  assert.equal(models.again.index, models.proven.index, "a republish proved another entry");
  assert.ok(equalBytes(models.again.leafBytes, models.proven.leafBytes));

  const v1 = await publishVersion("v1");
  const v2 = await publishVersion("v2");
  for (const [label, { digest, proven }] of [["v1", v1], ["v2", v2]] as const) {
    keep(proven);
    assertLeaf(proven.leaf, { type: "agent_version", digest, agent_id: AGENT, version_label: label });
  }
  digests = { models: models.digest, v1: v1.digest, v2: v2.digest };

  // The tag moved twice, then deleted: each move is an entry naming where it came from.
  const set = keep(await moveTag(v1.digest));
  const tag = { type: "tag", agent_id: AGENT, tag: "prod" };
  assertLeaf(set.leaf, { ...tag, event: "SET", from_digest: "", to_digest: v1.digest });
  const moved = keep(await moveTag(v2.digest));
  assertLeaf(moved.leaf, { ...tag, event: "SET", from_digest: v1.digest, to_digest: v2.digest });
  // Pointing the tag where it already points writes no event, so no entry.
  const unchanged = await registry.setTag({ agentId: AGENT, tag: "prod", digest: v2.digest }, { timeoutMs });
  assert.equal(unchanged.event, undefined);
  assert.equal(unchanged.logInclusion, undefined);
  const deleted = await registry.deleteTag({ agentId: AGENT, tag: "prod" }, { timeoutMs });
  const gone = keep(verifyLogInclusion(deleted.logInclusion));
  assertLeaf(gone.leaf, { ...tag, event: "DELETE", from_digest: v2.digest, to_digest: "" });

  // Appended in the order made (others may interleave on a shared server).
  const indexes = [models.proven, v1.proven, v2.proven, set, moved, gone].map((p) => p.index);
  assert.deepEqual([...indexes].sort((a, b) => (a < b ? -1 : 1)), indexes);
  assert.equal(new Set(indexes).size, indexes.length);
});

test("inclusion by digest, consistency between two checkpoints, and the whole log verify", async () => {
  assert.ok(digests, "the publishing test did not run");
  const a = await currentCheckpoint();

  // By digest, at the current size and at an older one.
  for (const [digest, size] of [[digests.v1, 0n], [digests.models, a.size]] as const) {
    const proven = verifyLogInclusion(await inclusionProof(digest, size));
    assert.equal(proven.leaf["digest"], digest);
    const published = ours.get(proven.index) ?? new Uint8Array();
    assert.ok(equalBytes(published, proven.leafBytes), "another entry than the publish proved");
  }
  // By index at A's size: the same tree, so the same root as A.
  const index = [...ours.keys()][0]!;
  const atA = verifyLogInclusion(await inclusionProof(index, a.size));
  assert.ok(equalBytes(atA.checkpoint.root, a.root), "two roots for one size");

  // More entries, then checkpoint B: A (and every checkpoint seen before it) is a prefix of B.
  keep((await publishVersion("v3")).proven);
  keep(await moveTag(digests.v1));
  const b = await currentCheckpoint();
  assert.ok(b.size > a.size);
  for (const old of [...seen, a]) {
    const proof = await registry.getConsistencyProof({ oldSize: old.size, newSize: b.size }, { timeoutMs });
    assert.deepEqual([proof.oldSize, proof.newSize], [old.size, b.size]);
    const signed = openCheckpointOf(proof.checkpoint);
    assert.ok(signed.size === b.size && equalBytes(signed.root, b.root), "two roots for one size");
    verifyConsistency(old.size, b.size, old.root, b.root, proof.hashes);
  }

  // The whole log up to B, a page at a time: each page's prefix hashes must be the subtrees of
  // the entries before it (recomputed here from those entries), and appending the page's leaves
  // must give its checkpoint's root; the last page ends at B, with B's root.
  const whole = new CompactRange();
  while (whole.size < b.size) {
    const page = await registry.getLogEntries({ start: whole.size, end: b.size }, { timeoutMs });
    assert.ok(page.entries.length > 0);
    assert.deepEqual(page.prefixHashes.map(hex), whole.hashes.map(hex), `prefix hashes at ${whole.size}`);
    const signed = openCheckpointOf(page.checkpoint);
    const range = new CompactRange(whole.size, page.prefixHashes);
    for (const entry of page.entries) {
      assert.equal(entry.index, whole.size);
      parseLeaf(entry.leaf);
      const mine = ours.get(entry.index);
      if (mine) assert.ok(equalBytes(mine, entry.leaf), `entry ${entry.index} is not the one proven`);
      range.append(leafHash(entry.leaf));
      whole.append(leafHash(entry.leaf));
    }
    assert.equal(signed.size, range.size);
    assert.ok(equalBytes(range.root(), signed.root), `the page ending at ${range.size} misses its root`);
  }
  assert.ok(equalBytes(whole.root(), b.root), "the log's entries do not make B's root");

  // Pages starting inside the log, checked on their own (the loop above may have needed one page
  // only, with no prefix hashes): from each of the first few indexes, and from B's last entry.
  const first = Array.from({ length: Math.min(Number(b.size), 12) }, (_, i) => BigInt(i));
  const starts = new Set([...first, b.size - 1n]);
  for (const start of starts) {
    const page = await registry.getLogEntries({ start, end: start + 3n }, { timeoutMs });
    const range = new CompactRange(start, page.prefixHashes);
    for (const entry of page.entries) {
      parseLeaf(entry.leaf);
      range.append(leafHash(entry.leaf));
    }
    const signed = openCheckpointOf(page.checkpoint);
    assert.equal(signed.size, range.size);
    assert.ok(equalBytes(range.root(), signed.root), `the page from ${start} does not reach its root`);
  }
});

test("what a forger or a buggy server could send fails the verifier", async () => {
  assert.ok(digests, "the publishing test did not run");
  const inclusion = await inclusionProof(digests.v2);
  const { checkpoint, index, leafBytes } = verifyLogInclusion(inclusion);
  const note = inclusion!.checkpoint!.note;
  const path = inclusion!.hashes;
  const flipBit = (h: Uint8Array) => h.map((b, j) => (j === 0 ? b ^ 1 : b));
  const flip = (hashes: Uint8Array[], at: number) => hashes.map((h, i) => (i === at ? flipBit(h) : h));
  const include = (leaf: Uint8Array, hashes: Uint8Array[]) => () =>
    verifyInclusion(index, checkpoint.size, leafHash(leaf), hashes, checkpoint.root);

  // A flipped bit in any hash of the audit path.
  include(leafBytes, path)();
  assert.ok(path.length > 0);
  for (let at = 0; at < path.length; at++) rejects(include(leafBytes, flip(path, at)), /root/);

  // The checkpoint note with one character changed: in the origin, the size, the root.
  const [originLine, sizeLine, rootLine] = note.split("\n") as [string, string, string];
  const swapLast = (line: string) => line.slice(0, -1) + (line.endsWith("A") ? "B" : "A");
  for (const changed of [
    note.replace(originLine, swapLast(originLine)),
    note.replace(`\n${sizeLine}\n`, `\n${Number(sizeLine) + 1}\n`),
    note.replace(rootLine, rootLine.replace(/^./, (c) => (c === "A" ? "B" : "A"))),
  ]) {
    assert.notEqual(changed, note);
    rejects(() => openNote(changed, trusted), /does not verify|no signature by a trusted key/);
  }

  // A note signed by a key of our own, under the trusted key's name: an unknown key, so no
  // trusted signature — both for the genuine text and for a forged root.
  const forger = newKey(trusted[0]!.name);
  const text = note.slice(0, note.lastIndexOf("\n\n") + 1);
  rejects(() => openNote(forger.sign(text), trusted), /no signature by a trusted key/);
  const forged = forger.sign(text.replace(rootLine, Buffer.alloc(32).toString("base64")));
  rejects(() => openNote(forged, trusted), /no signature by a trusted key/);
  // And the genuine signature line moved under the forged text.
  const signatures = note.slice(note.lastIndexOf("\n\n"));
  const otherText = text.replace(`\n${sizeLine}\n`, "\n1\n");
  assert.notEqual(otherText, text);
  rejects(() => openNote(otherText + signatures.slice(1), trusted), /does not verify/);

  // A consistency proof checked against another old root (the one of a size before), and with
  // a flipped bit.
  const b = await currentCheckpoint();
  const old = seen.find((c) => c.size >= 2n)!;
  const proof = await registry.getConsistencyProof({ oldSize: old.size, newSize: b.size }, { timeoutMs });
  verifyConsistency(old.size, b.size, old.root, b.root, proof.hashes);
  const otherRoot = verifyLogInclusion(await inclusionProof(0n, old.size - 1n)).checkpoint.root;
  assert.ok(!equalBytes(otherRoot, old.root));
  // (When the old size is a power of two the old root starts the path, so a wrong one shows as
  // a path that does not lead to the new root.)
  rejects(() => verifyConsistency(old.size, b.size, otherRoot, b.root, proof.hashes), /root/);
  for (let at = 0; at < proof.hashes.length; at++) {
    rejects(() => verifyConsistency(old.size, b.size, old.root, b.root, flip(proof.hashes, at)), /root/);
  }

  // A leaf not in canonical form: refused as such, and its hash is not the logged one either.
  const document: unknown = JSON.parse(new TextDecoder().decode(leafBytes));
  const loose = new TextEncoder().encode(JSON.stringify(document, null, 1));
  rejects(() => parseLeaf(loose), /RFC 8785/);
  rejects(include(loose, path), /root/);
});

test("malformed and out-of-range requests are refused with the documented codes", async () => {
  const b = await currentCheckpoint();
  async function code(call: Promise<unknown>): Promise<Code> {
    try {
      await call;
    } catch (error) {
      assert.ok(error instanceof ConnectError);
      return error.code;
    }
    assert.fail("accepted");
  }
  // Past the log's size by far, so that concurrent appends on a shared server cannot reach it.
  const past = b.size + 1_000_000n;
  assert.equal(await code(inclusionProof(`sha256:${"0".repeat(64)}`)), Code.NotFound);
  assert.equal(await code(inclusionProof(0n, past)), Code.OutOfRange);
  const consistency = (oldSize: bigint, newSize: bigint) =>
    registry.getConsistencyProof({ oldSize, newSize }, { timeoutMs });
  assert.equal(await code(consistency(2n, 1n)), Code.InvalidArgument);
  assert.equal(await code(consistency(1n, past)), Code.OutOfRange);
  assert.equal(await code(registry.getLogEntries({ start: past }, { timeoutMs })), Code.OutOfRange);
});
