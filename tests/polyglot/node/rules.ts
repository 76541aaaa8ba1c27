// The digest rule (docs/digest.md) and the event-hash rule (docs/audit.md, "Recomputing an
// event's hash from the wire") as a Node client implements them: written from the documents
// alone, with no code of this repository, so the tests that use them check the documented
// rules against what the Python server computes. RFC 8785 is the `canonicalize` package (by
// the RFC's co-author); SHA-256 is node:crypto.
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** The RFC 8785 (JCS) text of `value`. */
export function jcs(value: unknown): string {
  const text = canonicalize(value);
  if (text === undefined) throw new Error("no JSON text for this value");
  return text;
}

/** `sha256:<hex>` of a text's UTF-8 bytes. */
export function sha256Text(text: string): string {
  return "sha256:" + createHash("sha256").update(text, "utf8").digest("hex");
}

/** A document's digest: SHA-256 of its JCS form. */
export function digestOf(document: unknown): string {
  return sha256Text(jcs(document));
}

const TYPE_PREFIX = "EVENT_TYPE_";

/** `EVENT_TYPE_RUN_STATUS_CHANGED` -> `run.status_changed`: drop the prefix, lowercase, and
 * make the first `_` a `.`. */
export function dottedEventType(enumName: string): string {
  if (!enumName.startsWith(TYPE_PREFIX)) throw new Error(`${enumName} is not an EventType name`);
  const words = enumName.slice(TYPE_PREFIX.length).toLowerCase();
  const cut = words.indexOf("_");
  return cut < 0 ? words : `${words.slice(0, cut)}.${words.slice(cut + 1)}`;
}

// The proto3 JSON mapping prints a Timestamp in UTC with 0, 3, 6 or 9 fractional digits.
const WIRE_TIME = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?Z$/;

/** A Timestamp's JSON text as the hash spells it: exactly six fractional digits and `Z`. */
export function hashedTime(rfc3339: string): string {
  const match = WIRE_TIME.exec(rfc3339);
  if (match === null) throw new Error(`not a proto3 JSON Timestamp: ${rfc3339}`);
  const fraction = (match[2] ?? "").padEnd(9, "0");
  // Event times are recorded to the microsecond; finer digits would not be the stored time.
  if (fraction.slice(6) !== "000") throw new Error(`finer than a microsecond: ${rfc3339}`);
  return `${match[1]}.${fraction.slice(0, 6)}Z`;
}

function text(event: JsonObject, key: string): string {
  const value = event[key] ?? "";
  if (typeof value !== "string") throw new Error(`${key} is not a string`);
  return value;
}

/** The document an event's hash covers, from the Event in the proto3 JSON mapping with proto
 * field names (protobuf-es: `toJson(EventSchema, event, { useProtoFieldName: true })`). */
export function eventDocument(event: JsonObject): JsonObject {
  const set = Object.keys(event).filter((key) => key.endsWith("_attributes"));
  if (set.length !== 1) throw new Error(`expected one attributes member, got ${set.join(", ")}`);
  return {
    attributes: event[set[0] as string] ?? null,
    event_time: hashedTime(text(event, "event_time")),
    event_type: dottedEventType(text(event, "event_type")),
    id: text(event, "id"),
    prev_hash: text(event, "prev_hash"),
    run_id: text(event, "run_id"),
    // An int64 is a string in the mapping; the document has it as a number.
    sequence: Number(BigInt(text(event, "sequence"))),
    thread_id: text(event, "thread_id"),
    type: "agentrt.event.v1",
  };
}

/** An event's hash, recomputed from its wire form. */
export function eventHash(event: JsonObject): string {
  return digestOf(eventDocument(event));
}
