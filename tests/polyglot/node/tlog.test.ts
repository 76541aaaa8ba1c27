// The log verifier of tlog.ts against the specifications' own vectors and against trees built
// here from RFC 6962's recursive definitions (MTH, PATH, PROOF), which share nothing with the
// iterative RFC 9162 verification algorithms they check: every honest proof must verify and
// every altered one must fail, for every index and pair of sizes of small trees. Then the
// worked example of docs/audit.md (tests/vectors/log/), as the Python side wrote it. No server.
import assert from "node:assert/strict";
import { createHash, createPrivateKey, createPublicKey, sign } from "node:crypto";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  CompactRange,
  EMPTY_ROOT,
  VerificationError,
  hex,
  leafHash,
  nodeHash,
  openCheckpoint,
  openNote,
  parseCheckpoint,
  strictBase64,
  parseLeaf,
  parseVerifierKey,
  verifyConsistency,
  verifyInclusion,
} from "./tlog.js";
import { newKey } from "./test_keys.js";

const fromHex = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "hex"));
const rejects = (fn: () => unknown, what: RegExp) =>
  assert.throws(fn, (e: unknown) => e instanceof VerificationError && what.test(e.message));
const utf8 = (text: string) => new TextEncoder().encode(text);

// The reference leaves of Certificate Transparency's merkle_tree_test.cc, and its roots of
// their first 1..8 leaves.
const CT_LEAVES = [
  "",
  "00",
  "10",
  "2021",
  "3031",
  "40414243",
  "5051525354555657",
  "606162636465666768696a6b6c6d6e6f",
].map(fromHex);
const CT_ROOTS = [
  "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
  "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
  "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
  "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
  "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
  "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
  "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
  "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

// RFC 6962 section 2.1.1-2.1.2, as written: recursive over the leaf list.
function largestPowerOfTwoBelow(n: number): number {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}
function mth(leaves: Uint8Array[]): Uint8Array {
  if (leaves.length === 0) return createHash("sha256").digest();
  if (leaves.length === 1) return leafHash(leaves[0] as Uint8Array);
  const k = largestPowerOfTwoBelow(leaves.length);
  return nodeHash(mth(leaves.slice(0, k)), mth(leaves.slice(k)));
}
function path(m: number, leaves: Uint8Array[]): Uint8Array[] {
  if (leaves.length <= 1) return [];
  const k = largestPowerOfTwoBelow(leaves.length);
  return m < k
    ? [...path(m, leaves.slice(0, k)), mth(leaves.slice(k))]
    : [...path(m - k, leaves.slice(k)), mth(leaves.slice(0, k))];
}
function subproof(m: number, leaves: Uint8Array[], complete: boolean): Uint8Array[] {
  const n = leaves.length;
  if (m === n) return complete ? [] : [mth(leaves)];
  const k = largestPowerOfTwoBelow(n);
  return m <= k
    ? [...subproof(m, leaves.slice(0, k), complete), mth(leaves.slice(k))]
    : [...subproof(m - k, leaves.slice(k), false), mth(leaves.slice(0, k))];
}
const proof = (m: number, leaves: Uint8Array[]) => (m === 0 ? [] : subproof(m, leaves, true));

// A larger tree for the exhaustive checks: the CT leaves, then more.
const LEAVES = [...CT_LEAVES, ...Array.from({ length: 13 }, (_, i) => utf8(`leaf ${i + 8}`))];

/** Copies of `hashes` with one bit flipped, one per hash. */
function flipped(hashes: Uint8Array[]): Uint8Array[][] {
  const flip = (h: Uint8Array) => h.map((b, at) => (at === 7 ? b ^ 0x10 : b));
  return hashes.map((_, i) => hashes.map((h, j) => (i === j ? flip(h) : h)));
}

test("RFC 6962: the reference roots, and the empty tree is SHA-256 of nothing", () => {
  assert.equal(hex(EMPTY_ROOT), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  assert.deepEqual(CT_ROOTS.map((_, n) => hex(mth(CT_LEAVES.slice(0, n + 1)))), CT_ROOTS);
});

// Certificate Transparency's reference audit paths and consistency proofs over CT_LEAVES.
const H = {
  a: "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
  b: "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
  c: "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
  d: "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
  e: "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
  f: "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
};
const ROOT = (n: number) => fromHex(CT_ROOTS[n - 1] as string);

test("RFC 9162 2.1.3.2: the reference audit paths verify", () => {
  const vectors: [number, number, string[]][] = [
    [0, 8, [H.a, H.b, H.c]],
    [5, 8, [H.d, H.e, CT_ROOTS[3]!]],
    [2, 3, [CT_ROOTS[1]!]],
    [1, 5, [CT_ROOTS[0]!, H.b, H.d]],
  ];
  for (const [m, n, expected] of vectors) {
    assert.deepEqual(path(m, CT_LEAVES.slice(0, n)).map(hex), expected);
    const leaf = leafHash(CT_LEAVES[m] as Uint8Array);
    verifyInclusion(BigInt(m), BigInt(n), leaf, expected.map(fromHex), ROOT(n));
  }
});

test("RFC 9162 2.1.4.2: the reference consistency proofs verify", () => {
  const vectors: [number, number, string[]][] = [
    [1, 1, []],
    [1, 8, [H.a, H.b, H.c]],
    [6, 8, [H.f, H.e, CT_ROOTS[3]!]],
    [2, 5, [H.b, H.d]],
  ];
  for (const [m, n, expected] of vectors) {
    assert.deepEqual(proof(m, CT_LEAVES.slice(0, n)).map(hex), expected);
    verifyConsistency(BigInt(m), BigInt(n), ROOT(m), ROOT(n), expected.map(fromHex));
  }
});

test("inclusion: every honest path verifies; every altered one fails", () => {
  for (let n = 1; n <= LEAVES.length; n++) {
    const tree = LEAVES.slice(0, n);
    const root = mth(tree);
    for (let m = 0; m < n; m++) {
      const leaf = leafHash(tree[m] as Uint8Array);
      const hashes = path(m, tree);
      const [N, M] = [BigInt(n), BigInt(m)];
      verifyInclusion(M, N, leaf, hashes, root);
      const check = (hs: Uint8Array[], l = leaf, r = root, at = M) => () => verifyInclusion(at, N, l, hs, r);
      for (const bad of flipped(hashes)) rejects(check(bad), /root/);
      rejects(check(hashes, leafHash(Uint8Array.of(0xff))), /root/);
      rejects(check(hashes, leaf, nodeHash(root, root)), /root/);
      rejects(check([...hashes, root]), /long/);
      if (hashes.length > 0) rejects(check(hashes.slice(0, -1)), /short|root/);
      if (n > 1) rejects(check(hashes, leaf, root, BigInt((m + 1) % n)), /root|short|long/);
      rejects(check(hashes, leaf, root, N), /below/);
    }
  }
});

test("consistency: every honest proof verifies; an altered proof or a rewritten past fails", () => {
  for (let n = 0; n <= LEAVES.length; n++) {
    const newRoot = mth(LEAVES.slice(0, n));
    for (let m = 0; m <= n; m++) {
      const oldRoot = mth(LEAVES.slice(0, m));
      const hashes = proof(m, LEAVES.slice(0, n));
      const [N, M] = [BigInt(n), BigInt(m)];
      verifyConsistency(M, N, oldRoot, newRoot, hashes);
      const check = (hs: Uint8Array[], o = oldRoot, r = newRoot) => () => verifyConsistency(M, N, o, r, hs);
      for (const bad of flipped(hashes)) rejects(check(bad), /root/);
      // The old tree with one leaf rewritten: a fork, whatever proof the log sends with it.
      rejects(check(hashes, mth([Uint8Array.of(0xee), ...LEAVES.slice(1, m)])), /root/);
      // (From the empty tree there is nothing to prove, so nothing to get wrong.)
      if (m > 0 && m < n) rejects(check(hashes, oldRoot, nodeHash(newRoot, newRoot)), /root/);
      if (hashes.length > 0) rejects(check(hashes.slice(0, -1)), /short|root|empty/);
    }
  }
  rejects(() => verifyConsistency(3n, 2n, EMPTY_ROOT, EMPTY_ROOT, []), /sizes/);
});

test("compact range: the subtrees of a prefix plus the following leaves give the root", () => {
  for (let end = 0; end <= LEAVES.length; end++) {
    for (let start = 0; start <= end; start++) {
      // The complete subtrees of the first `start` leaves, largest first.
      const prefix: Uint8Array[] = [];
      for (let at = 0, bit = 1 << 5; bit > 0; bit >>= 1) {
        if ((start & bit) !== 0) {
          prefix.push(mth(LEAVES.slice(at, at + bit)));
          at += bit;
        }
      }
      const range = new CompactRange(BigInt(start), prefix);
      for (const leaf of LEAVES.slice(start, end)) range.append(leafHash(leaf));
      assert.equal(hex(range.root()), hex(mth(LEAVES.slice(0, end))), `${start}..${end}`);
    }
  }
  rejects(() => new CompactRange(3n, [EMPTY_ROOT]), /hashes for 3 leaves/);
});

// ---------------------------------------------------------------------------------------------
// Signed notes and checkpoints

// C2SP signed-note's own example.
const SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k";
const SPEC_TEXT = "This is an example message.\n";
const SPEC_NOTE =
  SPEC_TEXT +
  "\n— example.com/foo " +
  "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n";

test("signed note: the specification's example verifies with its verifier key", () => {
  const key = parseVerifierKey(SPEC_VKEY);
  assert.equal(key.name, "example.com/foo");
  assert.equal(openNote(SPEC_NOTE, [key]), SPEC_TEXT);
  const altered = SPEC_NOTE.replace("example message", "example massage");
  rejects(() => openNote(altered, [key]), /does not verify/);
  rejects(() => parseVerifierKey(SPEC_VKEY.replace("+530d903a+", "+530d903b+")), /hashes to 530d903a/);
  rejects(() => parseVerifierKey(SPEC_VKEY.replace("example.com/foo", "example.com/bar")), /key ID/);
});

test("signed note: unknown signatures are ignored, but one trusted signature is required", () => {
  const ours = newKey("example.com/foo");
  const trusted = [parseVerifierKey(SPEC_VKEY)];
  // Same name, another key: an unknown key, so no trusted signature.
  rejects(() => openNote(ours.sign(SPEC_TEXT), trusted), /no signature by a trusted key/);
  // Our signature beside the trusted one: ignored (a witness, a rotated key).
  const both = SPEC_NOTE + ours.sign(SPEC_TEXT).split("\n\n")[1];
  assert.equal(openNote(both, trusted), SPEC_TEXT);
  assert.equal(openNote(both, [parseVerifierKey(ours.vkey)]), SPEC_TEXT);
  rejects(() => openNote(SPEC_TEXT, trusted), /blank line/);
  rejects(() => openNote(SPEC_NOTE.replace("— ", "- "), trusted), /not a signature line/);
  rejects(() => openNote(SPEC_NOTE.replace(".\n", ".\r\n"), trusted), /control/);
});

test("checkpoint: the specification's example parses; malformed texts do not", () => {
  // C2SP tlog-checkpoint's own example.
  const body = parseCheckpoint(
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
  );
  assert.equal(body.origin, "example.com/behind-the-sofa");
  assert.equal(body.size, 20852163n);
  assert.equal(body.root.length, 32);
  const root = Buffer.from(EMPTY_ROOT).toString("base64");
  const malformed = [
    `o\n01\n${root}\n`, // a leading zero
    `o\n-1\n${root}\n`,
    `o\n1\n${root}`, // no final newline
    `o\n1\n`, // no root
    `o\n1\n${root}\n\n`, // an empty extension line
    `o\n1\n${root.slice(4)}\n`, // not 32 bytes
  ];
  for (const bad of malformed) rejects(() => parseCheckpoint(bad), /checkpoint|base64/);
  const key = newKey("example.com/log");
  const opened = openCheckpoint(key.sign(`example.com/log\n0\n${root}\n`), [parseVerifierKey(key.vkey)]);
  assert.equal(opened.size, 0n);
});

// ---------------------------------------------------------------------------------------------
// Leaves

test("leaf: canonical records of each type parse; anything else fails", () => {
  const digest = `sha256:${"ab".repeat(32)}`;
  const time = "2026-01-02T03:04:05.123456Z";
  const by = { principal: "anonymous", time };
  const tag = { type: "tag", agent_id: "a", tag: "prod", ...by };
  const leaves: Record<string, string | number>[] = [
    { type: "component", digest, kind: "TOOL", name: "t", version: "1", ...by },
    { type: "agent_version", digest, agent_id: "a", version_label: "v1", ...by },
    { ...tag, event: "SET", sequence: 1, from_digest: "", to_digest: digest },
    { ...tag, event: "DELETE", sequence: 2, from_digest: digest, to_digest: "" },
  ];
  for (const leaf of leaves) {
    // Members sorted, no whitespace (the values need no escapes).
    const members = Object.keys(leaf).sort().map((k) => `${JSON.stringify(k)}:${JSON.stringify(leaf[k])}`);
    const canonical = `{${members.join(",")}}`;
    assert.deepEqual(parseLeaf(utf8(canonical)), leaf);
    // Not canonical: members out of order, whitespace.
    rejects(() => parseLeaf(utf8(JSON.stringify(leaf))), /RFC 8785/);
    rejects(() => parseLeaf(utf8(canonical.replace(",", ", "))), /RFC 8785/);
    // A member more.
    rejects(() => parseLeaf(utf8(canonical.replace("{", '{"a":1,'))), /fields/);
  }
  rejects(() => parseLeaf(Uint8Array.of(0xff)), /UTF-8/);
  rejects(() => parseLeaf(utf8('{"type":"run"}')), /type run/);
});


// ---------------------------------------------------------------------------------------------
// The registry log's worked example (docs/audit.md), as the Python side wrote it

interface LogVector {
  private_key_seed_hex: string;
  verifier_key: string;
  entries: { index: number; leaf: string; leaf_hash_hex: string }[];
  checkpoints: Record<string, string>;
  inclusion: { index: number; tree_size: number; hashes_base64: string[] };
  consistency: { old_size: number; new_size: number; hashes_base64: string[] };
}

test("the registry log's worked example verifies, and its key and signatures recompute", () => {
  const vector = JSON.parse(
    readFileSync(new URL("../../../vectors/log/registry_log.json", import.meta.url), "utf8"),
  ) as LogVector;
  const key = parseVerifierKey(vector.verifier_key);
  // The example key from its seed (an RFC 8410 PKCS#8 wrapping of the 32 bytes): the verifier
  // key names its public key, and Ed25519 being deterministic, re-signing each checkpoint's text
  // gives its note byte for byte.
  const prefix = Buffer.from("302e020100300506032b657004220420", "hex");
  const pkcs8 = Buffer.concat([prefix, fromHex(vector.private_key_seed_hex)]);
  const privateKey = createPrivateKey({ key: pkcs8, format: "der", type: "pkcs8" });
  const jwk = createPublicKey(privateKey).export({ format: "jwk" });
  assert.equal(hex(new Uint8Array(Buffer.from(jwk.x as string, "base64url"))), hex(key.publicKey));

  const leaves = vector.entries.map((entry, i) => {
    assert.equal(entry.index, i);
    const bytes = utf8(entry.leaf);
    parseLeaf(bytes);
    assert.equal(hex(leafHash(bytes)), entry.leaf_hash_hex);
    return bytes;
  });
  const roots = new Map<bigint, Uint8Array>();
  for (const [size, note] of Object.entries(vector.checkpoints)) {
    const body = openCheckpoint(note, [key]);
    assert.equal(body.size, BigInt(size));
    assert.equal(hex(body.root), hex(mth(leaves.slice(0, Number(size)))));
    const text = note.slice(0, note.lastIndexOf("\n\n") + 1);
    const signature = Buffer.concat([key.id, sign(null, Buffer.from(text), privateKey)]);
    assert.equal(note, `${text}\n— ${key.name} ${signature.toString("base64")}\n`);
    roots.set(body.size, body.root);
  }
  const { inclusion, consistency } = vector;
  verifyInclusion(
    BigInt(inclusion.index),
    BigInt(inclusion.tree_size),
    leafHash(leaves[inclusion.index] as Uint8Array),
    inclusion.hashes_base64.map(strictBase64),
    roots.get(BigInt(inclusion.tree_size)) as Uint8Array,
  );
  const [from, to] = [BigInt(consistency.old_size), BigInt(consistency.new_size)];
  const hashes = consistency.hashes_base64.map(strictBase64);
  verifyConsistency(from, to, roots.get(from) as Uint8Array, roots.get(to) as Uint8Array, hashes);
});
