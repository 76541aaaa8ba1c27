// The offline bundle viewer (issue 30, item 10): reads an audit bundle file chosen in the
// page, shows the run, its attempts and steps, and checks its hash chain here, in the
// browser, with no request to any server.
//
// What it checks, from docs/audit.md ("Bundles") and docs/lifecycle.md (the event hash):
//   * every event's hash recomputes: SHA-256 of the RFC 8785 (JCS) text of its document
//     {attributes, event_time, event_type, id, prev_hash, run_id, sequence, thread_id,
//     type: "agentrt.event.v1"};
//   * the chain links: sequences 1, 2, 3 ..., each prev_hash the previous event's hash ("" for
//     the first), every event of the bundle's run and thread, and the last one is the
//     chain_head the run row recorded;
//   * the binding: the run's agent digest is the bundle's agent digest, and the chain's
//     run.created event bound the run to it.
// What it leaves to `agentrt audit verify FILE` (the reference checker, agentrt_core/
// audit_bundle.py) is said on the page: the components' and the agent's digests recomputed
// from their documents (they need the normalisation rules of docs/digest.md), and every row
// compared with what the chain committed to.
//
// Every string from the file reaches the page as text (textContent), never as markup.
"use strict";

(() => {
  const BUNDLE_TYPE = "agentrt.audit.bundle.v1";
  const EVENT_TYPE = "agentrt.event.v1";
  // JSON Lines: the record tag of each list, in the order the file holds them.
  const RECORDS = [
    ["attempts", "attempt"],
    ["steps", "step"],
    ["artifacts", "artifact"],
    ["checkpoints", "checkpoint"],
    ["inputs", "input"],
    ["components", "component"],
    ["events", "event"],
  ];
  // Lists a bundle written before they existed may lack (docs/audit.md).
  const ADDED_LATER = new Set(["inputs"]);

  class BundleError extends Error {}

  // RFC 8785: members sorted by key in UTF-16 code units (what Array.prototype.sort does
  // with no comparator), no whitespace, strings and numbers as ECMAScript serialises them.
  function jcs(value) {
    if (value === null || typeof value === "boolean" || typeof value === "string") {
      return JSON.stringify(value);
    }
    if (typeof value === "number") {
      if (!Number.isFinite(value)) throw new BundleError("a number JSON cannot hold");
      return JSON.stringify(value);
    }
    if (Array.isArray(value)) return "[" + value.map(jcs).join(",") + "]";
    if (typeof value === "object") {
      const keys = Object.keys(value).sort();
      return "{" + keys.map((k) => JSON.stringify(k) + ":" + jcs(value[k])).join(",") + "}";
    }
    throw new BundleError("a value JSON cannot hold");
  }

  async function sha256(text) {
    const bytes = new TextEncoder().encode(text);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    return "sha256:" + Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function parse(text) {
    const cut = text.indexOf("\n");
    let header = null;
    try {
      header = JSON.parse(cut < 0 ? text : text.slice(0, cut));
    } catch (_) {
      header = null;
    }
    if (header !== null && typeof header === "object" && header.format === "jsonl") {
      return parseLines(header, cut < 0 ? "" : text.slice(cut + 1));
    }
    let document;
    try {
      document = JSON.parse(text);
    } catch (error) {
      throw new BundleError(`not a complete JSON document (truncated?): ${error.message}`);
    }
    return checkLists(checkType(document));
  }

  function parseLines(header, rest) {
    const counts = header.counts;
    if (counts === null || typeof counts !== "object") {
      throw new BundleError("the JSON Lines header has no record counts");
    }
    const document = checkType(Object.assign({}, header));
    delete document.counts;
    delete document.format;
    const sections = new Map(RECORDS.map(([section, tag]) => [tag, section]));
    for (const [section] of RECORDS) document[section] = [];
    rest.split("\n").forEach((line, index) => {
      if (!line.trim()) return;
      let record = null;
      try {
        record = JSON.parse(line);
      } catch (_) {
        record = null;
      }
      if (record === null || typeof record !== "object" || !sections.has(record.record)) {
        throw new BundleError(`line ${index + 2} is not a bundle record (truncated?)`);
      }
      document[sections.get(record.record)].push(record.value);
    });
    for (const [section] of RECORDS) {
      const expected = counts[section];
      const found = document[section].length;
      if (ADDED_LATER.has(section) && expected === undefined && found === 0) {
        delete document[section];
        continue;
      }
      if (expected !== found) {
        throw new BundleError(
          `the header announces ${expected} ${section} but the file holds ${found} (truncated?)`,
        );
      }
    }
    return document;
  }

  function checkType(document) {
    if (document === null || typeof document !== "object" || document.type !== BUNDLE_TYPE) {
      throw new BundleError(`not an agentrt audit bundle (type is not "${BUNDLE_TYPE}")`);
    }
    for (const key of ["run", "agent", "chain_head"]) {
      if (document[key] === null || typeof document[key] !== "object") {
        throw new BundleError(`the bundle has no ${key}`);
      }
    }
    return document;
  }

  function checkLists(document) {
    for (const [section] of RECORDS) {
      if (ADDED_LATER.has(section) && document[section] === undefined) continue;
      if (!Array.isArray(document[section])) throw new BundleError(`the bundle has no ${section}`);
    }
    return document;
  }

  function eventDocument(event) {
    return {
      attributes: event.attributes,
      event_time: event.event_time,
      event_type: event.event_type,
      id: event.id,
      prev_hash: event.prev_hash,
      run_id: event.run_id,
      sequence: Number(event.sequence),
      thread_id: event.thread_id,
      type: EVENT_TYPE,
    };
  }

  // Every problem found, in order; an empty list is a chain that verifies.
  async function verify(bundle) {
    const problems = [];
    const run = bundle.run;
    const events = bundle.events;
    let previous = "";
    for (let i = 0; i < events.length; i++) {
      const event = events[i];
      const where = `event ${i + 1}`;
      if (event === null || typeof event !== "object") {
        problems.push(`${where}: not an event`);
        continue;
      }
      if (Number(event.sequence) !== i + 1) {
        problems.push(`${where}: its sequence is ${event.sequence}`);
      }
      if (event.run_id !== run.id || event.thread_id !== run.thread_id) {
        problems.push(`${where}: it belongs to another chain (${event.thread_id}/${event.run_id})`);
      }
      if (event.prev_hash !== previous) {
        problems.push(`${where}: its prev_hash is not the hash of the event before it`);
      }
      let recomputed;
      try {
        recomputed = await sha256(jcs(eventDocument(event)));
      } catch (error) {
        problems.push(`${where}: ${error.message}`);
        previous = event.hash;
        continue;
      }
      if (recomputed !== event.hash) {
        problems.push(`${where} (${event.event_type}): its hash recomputes to ${recomputed}, the bundle says ${event.hash}`);
      }
      previous = event.hash;
    }
    const head = bundle.chain_head;
    const last = events.length ? events[events.length - 1] : null;
    if (last === null || Number(head.sequence) !== Number(last.sequence) || head.hash !== last.hash) {
      problems.push(`the chain does not end at the head the run recorded (sequence ${head.sequence}, ${head.hash})`);
    }
    const bound = run.agent ? run.agent.agent_digest : undefined;
    if (bound !== bundle.agent.digest) {
      problems.push(`the run is bound to ${bound}, the bundle's agent is ${bundle.agent.digest}`);
    }
    const created = events.length ? events[0] : null;
    const createdAgent = created && created.attributes && created.attributes.agent;
    if (!created || created.event_type !== "run.created" || !createdAgent || createdAgent.agent_digest !== bound) {
      problems.push("the chain's run.created event did not bind the run to its agent digest");
    }
    return problems;
  }

  // ---------------------------------------------------------------- drawing, as text only

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function short(name, prefix) {
    return typeof name === "string" && name.startsWith(prefix) ? name.slice(prefix.length) : name || "";
  }

  function table(caption, headings, rows) {
    const node = element("table", undefined, "bundle-table");
    node.appendChild(element("caption", caption));
    const head = node.appendChild(element("thead")).appendChild(element("tr"));
    for (const heading of headings) {
      const cell = head.appendChild(element("th", heading));
      cell.scope = "col";
    }
    const body = node.appendChild(element("tbody"));
    for (const row of rows) {
      const line = body.appendChild(element("tr"));
      for (const value of row) line.appendChild(element("td", value));
    }
    return node;
  }

  function facts(pairs) {
    const list = element("dl", undefined, "facts");
    for (const [term, value] of pairs) {
      list.appendChild(element("dt", term));
      list.appendChild(element("dd", value));
    }
    return list;
  }

  function draw(bundle, file) {
    const view = document.getElementById("bundle-view");
    view.replaceChildren();
    const run = bundle.run;
    const agent = run.agent || {};
    view.appendChild(element("h2", `Run ${run.id}`));
    view.appendChild(
      facts([
        ["File", file.name],
        ["Status", short(run.status, "RUN_STATUS_")],
        ["Goal", run.goal ? run.goal.objective : ""],
        ["Agent", `${agent.agent_id || ""} ${agent.version_label || ""}`],
        ["Requested as", agent.requested_ref || ""],
        ["Digest", agent.agent_digest || ""],
        ["Namespace", run.namespace || ""],
        ["Created", run.create_time || ""],
        ["Created by", run.creator_principal || ""],
        ["Exported", `${bundle.export_time || ""} from installation ${bundle.installation_id || ""}`],
      ]),
    );
    view.appendChild(
      table(
        "Attempts",
        ["#", "Reason", "Status", "Worker", "Lease epoch", "Started", "Ended"],
        bundle.attempts.map((a) => [
          a.number,
          short(a.reason, "ATTEMPT_REASON_"),
          short(a.status, "ATTEMPT_STATUS_"),
          `${a.worker_id || ""} (${a.worker_principal || ""})`,
          a.lease_epoch,
          a.start_time || "",
          a.end_time || "",
        ]),
      ),
    );
    view.appendChild(
      table(
        "Steps",
        ["#", "Type", "Status", "Model or tool", "Tokens in/out", "Summary"],
        bundle.steps.map((s) => {
          const model = (s.versions && s.versions.model) || {};
          const usage = s.usage || {};
          const what =
            s.tool_name ||
            [model.requested_model_id, model.reported_model_id].filter(Boolean).join(" → ");
          return [
            s.sequence,
            short(s.type, "STEP_TYPE_"),
            short(s.status, "STEP_STATUS_"),
            what,
            `${usage.input_tokens || 0}/${usage.output_tokens || 0}`,
            s.summary || "",
          ];
        }),
      ),
    );
    view.appendChild(
      table(
        "Events",
        ["#", "Type", "Time", "Hash"],
        bundle.events.map((e) => [e.sequence, e.event_type, e.event_time, e.hash]),
      ),
    );
  }

  function say(verdict, className, lines) {
    const box = document.getElementById("bundle-verdict");
    box.replaceChildren(element("p", verdict, className));
    if (lines.length) {
      const list = box.appendChild(element("ul"));
      for (const line of lines) list.appendChild(element("li", line));
    }
  }

  async function open(file) {
    document.getElementById("bundle-view").replaceChildren();
    say(`Reading ${file.name}…`, "", []);
    if (!(window.crypto && crypto.subtle)) {
      say(
        "This browser offers no SHA-256 here: open the page over HTTPS, from localhost or from a file.",
        "error",
        [],
      );
      return;
    }
    let bundle;
    try {
      bundle = parse(await file.text());
    } catch (error) {
      say(`${file.name}: ${error.message}`, "error", []);
      return;
    }
    draw(bundle, file);
    const problems = await verify(bundle);
    const leftToCli =
      "Not checked here: the components' and the agent's digests recomputed from their " +
      "documents, and every row against the chain: run agentrt audit verify FILE.";
    if (problems.length === 0) {
      say(
        `Chain verified: ${bundle.events.length} events recompute and link up to the head ` +
          `the run recorded (${bundle.chain_head.hash}), and the run's agent digest is the one ` +
          "its run.created event bound.",
        "verified",
        [leftToCli],
      );
    } else {
      say(`Verification failed (${problems.length} problems):`, "error", [...problems, leftToCli]);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const input = document.getElementById("bundle-file");
    input.addEventListener("change", () => {
      if (input.files && input.files.length) open(input.files[0]);
    });
  });
})();
