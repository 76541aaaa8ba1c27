// The console's only script (the CSP allows no inline script and no other origin).
// Pages work without it; it only adds what a browser with scripts does better.
"use strict";

// Whether the person is writing in this part of the page (a reason, a comment): it is then
// left as it is until the next refresh.
function typing(part) {
  if (part.contains(document.activeElement) && document.activeElement !== document.body) {
    return true;
  }
  return [...part.querySelectorAll("input:not([type=hidden]), textarea")].some(
    (field) => field.type !== "radio" && field.type !== "checkbox" && field.value !== "",
  );
}

// A run page follows its run: the server streams the run's ledger events (WatchRun) as
// server-sent events; on each, the page's main part is fetched again and swapped in, at
// most every 300 ms. EventSource reconnects by itself after a drop, sending the last event
// id it saw, and the server resumes the watch after it.
function followRun(main) {
  const source = new EventSource(main.dataset.events);
  let pending = null;
  const refresh = async () => {
    pending = null;
    const response = await fetch(window.location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.querySelector("main");
    if (!fresh) return;
    // Keep what the person is typing: only the parts that show the ledger are replaced.
    for (const part of fresh.querySelectorAll("[data-live-part]")) {
      const here = main.querySelector(`[data-live-part="${part.dataset.livePart}"]`);
      if (!here || typing(here)) continue;
      here.replaceWith(part);
    }
    main.dataset.lastSequence = fresh.dataset.lastSequence || main.dataset.lastSequence;
    document.dispatchEvent(new CustomEvent("agentrt:refreshed"));
  };
  source.addEventListener("ledger", () => {
    if (pending === null) pending = window.setTimeout(refresh, 300);
  });
}

// The record's verification takes seconds on a long run: the run page shows its first screen
// at once and puts the verdict in when it comes (without script, a link opens it).
async function loadVerdict(slot) {
  const response = await fetch(slot.dataset.verdictSrc, { credentials: "same-origin" });
  if (!response.ok) return;
  const page = new DOMParser().parseFromString(await response.text(), "text/html");
  const verdict = page.querySelector("[data-verdict]");
  if (verdict) slot.replaceChildren(...verdict.childNodes);
}

document.addEventListener("DOMContentLoaded", () => {
  const main = document.querySelector("main[data-events]");
  if (main) followRun(main);
  for (const slot of document.querySelectorAll("[data-verdict-src]")) loadVerdict(slot);
});
