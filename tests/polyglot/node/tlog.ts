// A verifier of the registry log (docs/audit.md, "The registry log") written from the public
// specifications alone, with no code of this repository, so that the tests that use it check
// the server against the specs rather than against itself:
//   - Merkle tree hashing: RFC 6962 section 2.1 (= RFC 9162 section 2.1.1);
//   - inclusion proofs: RFC 9162 section 2.1.3.2; consistency proofs: RFC 9162 section 2.1.4.2;
//   - signed notes and verifier keys: C2SP signed-note (Ed25519, signature type 0x01);
//   - checkpoints: C2SP tlog-checkpoint;
//   - DSSE envelopes (run attestations): secure-systems-lab/dsse protocol.md and envelope.md;
//   - leaves: RFC 8785 canonical JSON (the `canonicalize` package) of the documented fields.
// Every check throws a VerificationError naming what failed; nothing here returns a boolean
// that a caller could forget to test.
import { type KeyObject, createHash, createPublicKey, verify as verifySignature } from "node:crypto";
import canonicalize from "canonicalize";

export class VerificationError extends Error {
  override name = "VerificationError";
}

function fail(message: string): never {
  throw new VerificationError(message);
}

// ---------------------------------------------------------------------------------------------
// Bytes

function sha256(...parts: Uint8Array[]): Uint8Array {
  const hash = createHash("sha256");
  for (const part of parts) hash.update(part);
  return new Uint8Array(hash.digest());
}

export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

export function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("hex");
}

/** RFC 4648 section 4 base64, strictly: the alphabet, padding to a multiple of four, and no
 * non-zero bits past the data (Buffer.from alone accepts all of these and more). */
export function strictBase64(text: string): Uint8Array {
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) fail(`not base64: ${text}`);
  const bytes = Buffer.from(text, "base64");
  if (bytes.toString("base64") !== text) fail(`not canonical base64: ${text}`);
  return new Uint8Array(bytes);
}

const utf8 = new TextEncoder();

// ---------------------------------------------------------------------------------------------
// Merkle trees (RFC 6962 section 2.1)

const HASH_SIZE = 32;

/** MTH({}): the hash of an empty tree is SHA-256 of the empty string. */
export const EMPTY_ROOT = sha256();

/** MTH({d}) = SHA-256(0x00 || d). */
export function leafHash(leaf: Uint8Array): Uint8Array {
  return sha256(Uint8Array.of(0x00), leaf);
}

/** SHA-256(0x01 || left || right). */
export function nodeHash(left: Uint8Array, right: Uint8Array): Uint8Array {
  return sha256(Uint8Array.of(0x01), left, right);
}

function checkHashes(hashes: readonly Uint8Array[], what: string): void {
  for (const h of hashes) if (h.length !== HASH_SIZE) fail(`${what}: a hash of ${h.length} bytes`);
}

/** RFC 9162 section 2.1.3.2: that `leaf` (a leaf hash) is entry `index` of the tree of `size`
 * entries whose root is `root`, by the audit path `path`. */
export function verifyInclusion(
  index: bigint,
  size: bigint,
  leaf: Uint8Array,
  path: readonly Uint8Array[],
  root: Uint8Array,
): void {
  checkHashes([leaf, root, ...path], "inclusion");
  // 1. leaf_index must be below tree_size.
  if (index < 0n || index >= size) fail(`inclusion: index ${index} is not below tree size ${size}`);
  // 2.-3.
  let fn = index;
  let sn = size - 1n;
  let r = leaf;
  // 4.
  for (const p of path) {
    // a. A path longer than the tree is tall.
    if (sn === 0n) fail("inclusion: the path is too long");
    // b. The node is a right child, or the last node of its level (no right sibling).
    if ((fn & 1n) === 1n || fn === sn) {
      r = nodeHash(p, r);
      // ii. Climb past the levels where the node has no sibling.
      while ((fn & 1n) === 0n && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      r = nodeHash(r, p);
    }
    // c.
    fn >>= 1n;
    sn >>= 1n;
  }
  // 5.
  if (sn !== 0n) fail("inclusion: the path is too short");
  if (!equalBytes(r, root)) fail("inclusion: the path does not lead to the root");
}

/** RFC 9162 section 2.1.4.2: that the tree of `first` entries with root `firstRoot` is a
 * prefix of the tree of `second` entries with root `secondRoot`, by the proof `proof`. The
 * trivial cases (section 2.1.4: no proof when the sizes are equal or the first tree is empty)
 * are checked too, so a caller never has to special-case them. */
export function verifyConsistency(
  first: bigint,
  second: bigint,
  firstRoot: Uint8Array,
  secondRoot: Uint8Array,
  proof: readonly Uint8Array[],
): void {
  checkHashes([firstRoot, secondRoot, ...proof], "consistency");
  if (first < 0n || first > second) fail(`consistency: sizes ${first} and ${second}`);
  if (first === second) {
    if (proof.length !== 0) fail("consistency: a proof between equal sizes");
    if (!equalBytes(firstRoot, secondRoot)) fail("consistency: two roots for one size");
    return;
  }
  if (first === 0n) {
    if (proof.length !== 0) fail("consistency: a proof from the empty tree");
    if (!equalBytes(firstRoot, EMPTY_ROOT)) fail("consistency: the empty tree's root is wrong");
    return;
  }
  // 1.
  if (proof.length === 0) fail("consistency: an empty proof");
  // 2. When the first tree is a complete subtree its root is the proof's implied first node.
  const path = (first & (first - 1n)) === 0n ? [firstRoot, ...proof] : [...proof];
  // 3.-4.
  let fn = first - 1n;
  let sn = second - 1n;
  while ((fn & 1n) === 1n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  // 5.
  let fr = path[0] as Uint8Array;
  let sr = fr;
  // 6.
  for (const c of path.slice(1)) {
    // a.
    if (sn === 0n) fail("consistency: the proof is too long");
    // b.
    if ((fn & 1n) === 1n || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      while ((fn & 1n) === 0n && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      sr = nodeHash(sr, c);
    }
    // c.
    fn >>= 1n;
    sn >>= 1n;
  }
  // 7.
  if (sn !== 0n) fail("consistency: the proof is too short");
  if (!equalBytes(fr, firstRoot)) fail("consistency: the proof does not lead to the old root");
  if (!equalBytes(sr, secondRoot)) fail("consistency: the proof does not lead to the new root");
}

/** The complete subtrees that make up a tree's first `count` leaves (one per set bit of
 * `count`, largest first) — a "compact range" from 0, extended a leaf at a time like a binary
 * counter. The root of the tree of `count` leaves folds them from the right (RFC 6962's MTH
 * splits at the largest power of two below n, which is the first subtree). */
export class CompactRange {
  private readonly subtrees: { size: bigint; hash: Uint8Array }[] = [];
  private count = 0n;

  /** Starts after `count` leaves whose subtree hashes (largest first) are `hashes`. */
  constructor(count = 0n, hashes: readonly Uint8Array[] = []) {
    checkHashes(hashes, "compact range");
    const sizes: bigint[] = [];
    for (let bit = 1n; bit <= count; bit <<= 1n) if ((count & bit) !== 0n) sizes.unshift(bit);
    if (count < 0n || sizes.length !== hashes.length) {
      fail(`compact range: ${hashes.length} hashes for ${count} leaves (want ${sizes.length})`);
    }
    sizes.forEach((size, i) => this.subtrees.push({ size, hash: hashes[i] as Uint8Array }));
    this.count = count;
  }

  get size(): bigint {
    return this.count;
  }

  /** The subtree hashes, largest first. */
  get hashes(): Uint8Array[] {
    return this.subtrees.map((s) => s.hash);
  }

  /** Appends one leaf by its leaf hash, merging equal-sized neighbours. */
  append(leaf: Uint8Array): void {
    checkHashes([leaf], "compact range");
    this.subtrees.push({ size: 1n, hash: leaf });
    this.count += 1n;
    for (;;) {
      const right = this.subtrees.at(-1);
      const left = this.subtrees.at(-2);
      if (!right || !left || left.size !== right.size) break;
      this.subtrees.splice(-2, 2, { size: left.size * 2n, hash: nodeHash(left.hash, right.hash) });
    }
  }

  /** MTH of the leaves so far. */
  root(): Uint8Array {
    let root: Uint8Array | undefined;
    for (const { hash } of [...this.subtrees].reverse()) root = root ? nodeHash(hash, root) : hash;
    return root ?? EMPTY_ROOT;
  }
}

// ---------------------------------------------------------------------------------------------
// Signed notes (C2SP signed-note) and their verifier keys

const ED25519 = 0x01;
// At least 16 must be accepted; a bound keeps a hostile note from costing much.
const MAX_SIGNATURES = 64;

export interface VerifierKey {
  name: string;
  /** The 4-byte key ID: SHA-256(name || 0x0A || 0x01 || public key)[:4]. */
  id: Uint8Array;
  publicKey: Uint8Array;
  key: KeyObject;
}

function checkKeyName(name: string): void {
  // Non-empty, no Unicode spaces, no plus.
  if (name === "" || /[\s\p{Z}+]/u.test(name)) fail(`not a key name: ${JSON.stringify(name)}`);
}

export function ed25519KeyId(name: string, publicKey: Uint8Array): Uint8Array {
  return sha256(utf8.encode(name), Uint8Array.of(0x0a, ED25519), publicKey).subarray(0, 4);
}

/** Parses `<name>+<hex key ID>+<base64(0x01 || public key)>`, checking the key ID against the
 * name and key it claims to identify. */
export function parseVerifierKey(vkey: string): VerifierKey {
  // Neither the name nor the hex key ID holds a plus; the base64 after them may.
  const first = vkey.indexOf("+");
  const second = vkey.indexOf("+", first + 1);
  if (first < 0 || second < 0) fail(`verifier key: not name+id+key: ${vkey}`);
  const name = vkey.slice(0, first);
  const idHex = vkey.slice(first + 1, second);
  const material = vkey.slice(second + 1);
  checkKeyName(name);
  if (!/^[0-9a-f]{8}$/.test(idHex)) fail(`verifier key: key ID ${idHex} is not 8 lowercase hex digits`);
  const raw = strictBase64(material);
  if (raw[0] !== ED25519) fail(`verifier key: signature type ${raw[0]}, not Ed25519`);
  if (raw.length !== 33) fail(`verifier key: an Ed25519 key of ${raw.length - 1} bytes`);
  const publicKey = raw.slice(1);
  const id = ed25519KeyId(name, publicKey);
  if (hex(id) !== idHex) fail(`verifier key: key ID ${idHex}, but the key hashes to ${hex(id)}`);
  const key = createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(publicKey).toString("base64url") },
    format: "jwk",
  });
  return { name, id, publicKey, key };
}

/** Verifies a signed note against the trusted keys and returns its text (final newline
 * included). Signatures by unknown keys are ignored (key rotation, witnesses); a signature by a
 * trusted key must verify, and at least one must. */
export function openNote(note: string, trusted: readonly VerifierKey[]): string {
  if (!note.isWellFormed()) fail("note: not valid Unicode");
  // No ASCII control characters but newline.
  if (/[\u0000-\u0009\u000b-\u001f]/.test(note)) fail("note: a control character");
  // The text ends with a newline; the last blank line separates it from the signatures.
  const cut = note.lastIndexOf("\n\n");
  if (cut < 0) fail("note: no blank line before the signatures");
  const text = note.slice(0, cut + 1);
  const block = note.slice(cut + 2);
  if (block === "" || !block.endsWith("\n")) fail("note: no signature lines, or no final newline");
  const lines = block.slice(0, -1).split("\n");
  if (lines.length > MAX_SIGNATURES) fail(`note: ${lines.length} signatures`);
  const message = utf8.encode(text);
  let verified = 0;
  for (const line of lines) {
    // em dash, space, key name, space, base64(key ID || signature)
    if (!line.startsWith("\u2014 ")) fail(`note: not a signature line: ${JSON.stringify(line)}`);
    const fields = line.slice(2).split(" ");
    if (fields.length !== 2) fail(`note: not a signature line: ${JSON.stringify(line)}`);
    const [name, encoded] = fields as [string, string];
    checkKeyName(name);
    const signature = strictBase64(encoded);
    if (signature.length < 4) fail("note: a signature shorter than its key ID");
    const id = signature.subarray(0, 4);
    for (const key of trusted) {
      if (key.name !== name || !equalBytes(key.id, id)) continue;
      const ok =
        signature.length === 4 + 64 && verifySignature(null, message, key.key, signature.subarray(4));
      if (!ok) fail(`note: the signature of ${name}+${hex(id)} does not verify`);
      verified += 1;
    }
  }
  if (verified === 0) fail("note: no signature by a trusted key");
  return text;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints (C2SP tlog-checkpoint)

export interface CheckpointBody {
  origin: string;
  size: bigint;
  root: Uint8Array;
  extensions: string[];
}

/** Parses a checkpoint's note text: origin, decimal tree size, base64 root, then optional
 * extension lines, each non-empty and ending with a newline. */
export function parseCheckpoint(text: string): CheckpointBody {
  if (!text.endsWith("\n")) fail("checkpoint: no final newline");
  const lines = text.slice(0, -1).split("\n");
  if (lines.length < 3) fail(`checkpoint: ${lines.length} lines`);
  if (lines.some((line) => line === "")) fail("checkpoint: an empty line");
  const [origin, size, root, ...extensions] = lines as [string, string, string, ...string[]];
  // No leading zeroes (unless the tree is empty).
  if (!/^(0|[1-9][0-9]*)$/.test(size)) fail(`checkpoint: tree size ${JSON.stringify(size)}`);
  const rootHash = strictBase64(root);
  if (rootHash.length !== HASH_SIZE) fail(`checkpoint: a root of ${rootHash.length} bytes`);
  return { origin, size: BigInt(size), root: rootHash, extensions };
}

/** A checkpoint note verified with the trusted keys, then parsed. */
export function openCheckpoint(note: string, trusted: readonly VerifierKey[]): CheckpointBody {
  return parseCheckpoint(openNote(note, trusted));
}

// ---------------------------------------------------------------------------------------------
// Leaves: RFC 8785 canonical JSON of one of the documented records

type LeafValue = string | number;
export type Leaf = Record<string, LeafValue> & {
  type: "component" | "agent_version" | "tag" | "attestation";
};

const LEAF_FIELDS: Record<Leaf["type"], string[]> = {
  component: ["digest", "kind", "name", "principal", "time", "type", "version"],
  agent_version: ["agent_id", "digest", "principal", "time", "type", "version_label"],
  tag: [
    "agent_id",
    "event",
    "from_digest",
    "principal",
    "sequence",
    "tag",
    "time",
    "to_digest",
    "type",
  ],
  attestation: ["digest", "envelope_digest", "key_id", "predicate_type", "principal", "time", "type"],
};
const DIGEST = /^sha256:[0-9a-f]{64}$/;
const UTC_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$/;

/** Parses a leaf: UTF-8 JSON, byte for byte its own RFC 8785 form (so its hash is a function
 * of its content), with exactly the fields of its type. */
export function parseLeaf(bytes: Uint8Array): Leaf {
  let text: string;
  let value: unknown;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
    value = JSON.parse(text);
  } catch (error) {
    fail(`leaf: not UTF-8 JSON: ${String(error)}`);
  }
  // Duplicate members, whitespace, member order, escapes and number forms all show here.
  if (canonicalize(value) !== text) fail(`leaf: not in RFC 8785 form: ${text}`);
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail("leaf: not an object");
  const leaf = value as Record<string, unknown>;
  const type = leaf["type"];
  if (typeof type !== "string" || !Object.hasOwn(LEAF_FIELDS, type)) fail(`leaf: type ${String(type)}`);
  const fields = LEAF_FIELDS[type as Leaf["type"]];
  const keys = Object.keys(leaf).sort();
  if (keys.join() !== fields.join()) fail(`leaf: ${type} with fields ${keys.join(", ")}`);
  for (const key of fields) {
    const member = leaf[key];
    if (key === "sequence") {
      if (!Number.isSafeInteger(member) || (member as number) < 1) fail(`leaf: sequence ${String(member)}`);
    } else if (typeof member !== "string") {
      fail(`leaf: ${key} is not a string`);
    }
  }
  const time = leaf["time"] as string;
  if (!UTC_TIME.test(time) || Number.isNaN(Date.parse(time))) fail(`leaf: time ${time}`);
  if (type === "tag") {
    if (leaf["event"] !== "SET" && leaf["event"] !== "DELETE") fail(`leaf: event ${String(leaf["event"])}`);
    // A SET may start the tag (no from); a DELETE ends it (no to).
    const from = leaf["from_digest"] as string;
    const to = leaf["to_digest"] as string;
    if (from !== "" && !DIGEST.test(from)) fail(`leaf: from_digest ${from}`);
    if (leaf["event"] === "SET" ? !DIGEST.test(to) : to !== "") fail(`leaf: to_digest ${to}`);
    if (leaf["event"] === "DELETE" && !DIGEST.test(from)) fail(`leaf: from_digest ${from}`);
  } else if (!DIGEST.test(leaf["digest"] as string)) {
    fail(`leaf: digest ${String(leaf["digest"])}`);
  }
  return leaf as Leaf;
}

// ---------------------------------------------------------------------------------------------
// DSSE envelopes (secure-systems-lab/dsse, protocol.md and envelope.md)

/** PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, lengths in ASCII
 * decimal bytes. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  const type = utf8.encode(payloadType);
  const head = utf8.encode(`DSSEv1 ${type.length} ${payloadType} ${payload.length} `);
  const out = new Uint8Array(head.length + payload.length);
  out.set(head);
  out.set(payload, head.length);
  return out;
}

/** Verifies a DSSE envelope (JSON) whose signatures name their key by keyid
 * `<name>+<hex key ID>`; returns its payload. Signatures by unknown keyids are ignored, one by
 * a trusted key must verify, and at least one must. */
export function openEnvelope(
  json: string,
  trusted: readonly VerifierKey[],
  payloadType = "application/vnd.in-toto+json",
): Uint8Array {
  let envelope: unknown;
  try {
    envelope = JSON.parse(json);
  } catch (error) {
    fail(`envelope: not JSON: ${String(error)}`);
  }
  const e = envelope as Record<string, unknown>;
  if (e["payloadType"] !== payloadType) fail(`envelope: payload type ${String(e["payloadType"])}`);
  if (typeof e["payload"] !== "string") fail("envelope: no payload");
  const payload = strictBase64(e["payload"]);
  const signatures = e["signatures"];
  if (!Array.isArray(signatures) || signatures.length === 0) fail("envelope: no signatures");
  const message = pae(payloadType, payload);
  let verified = 0;
  for (const entry of signatures as Array<Record<string, unknown>>) {
    const keyid = String(entry["keyid"] ?? "");
    for (const key of trusted) {
      if (keyid !== `${key.name}+${hex(key.id)}`) continue;
      const signature = strictBase64(String(entry["sig"] ?? ""));
      if (signature.length !== 64 || !verifySignature(null, message, key.key, signature)) {
        fail(`envelope: the signature of ${keyid} does not verify`);
      }
      verified += 1;
    }
  }
  if (verified === 0) fail("envelope: no signature by a trusted key");
  return payload;
}
