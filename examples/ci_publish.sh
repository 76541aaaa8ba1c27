#!/usr/bin/env bash
# What a CI job does with agentrt: digest offline, publish (idempotently), move tags with
# compare-and-swap, then show and diff what it did.
#
#   make serve &                       # a server (fresh SQLite file in the working dir)
#   bash examples/ci_publish.sh        # AGENTRT_TARGET defaults to 127.0.0.1:50051
#
# AGENTRT names the command to run: by default this checkout's .venv/bin/agentrt (what
# `make serve` installs; it is not on PATH), else `agentrt` on PATH (an installed wheel). It
# may have arguments, e.g. AGENTRT=".venv/bin/python -m runtime_service.cli.main". Re-running
# against the same database works: publishes are idempotent and the tag steps check where
# `prod` points.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT_AGENTRT="$HERE/../.venv/bin/agentrt"
if [[ -z "${AGENTRT:-}" ]]; then
  if [[ -x "$CHECKOUT_AGENTRT" ]]; then AGENTRT="$CHECKOUT_AGENTRT"; else AGENTRT=agentrt; fi
fi
export AGENTRT_TARGET="${AGENTRT_TARGET:-127.0.0.1:50051}"
read -r -a AGENTRT_COMMAND <<<"$AGENTRT"
# `command` so that AGENTRT=agentrt runs the program, not this function again.
agentrt() { command "${AGENTRT_COMMAND[@]}" "$@"; }

V7_FILE="$HERE/coding_agent.yaml"
V8_FILE="$HERE/coding_agent_v8.yaml"
STDERR="$(mktemp)"
trap 'rm -f "$STDERR"' EXIT

step() { printf '\n== %s\n' "$*"; }
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

step "offline digest of coding_agent@agent_v7 (no server involved)"
V7="$(agentrt digest "$V7_FILE")"
echo "$V7"

step "publish coding_agent@agent_v7 to $AGENTRT_TARGET"
PUBLISHED="$(agentrt publish "$V7_FILE" 2>"$STDERR")"
cat "$STDERR"
[[ "$PUBLISHED" == "$V7" ]] || fail "published $PUBLISHED, but the offline digest is $V7"
echo "published digest equals the offline digest: $PUBLISHED"

step "publish agent_v7 again: identical content is idempotent"
AGAIN="$(agentrt publish "$V7_FILE" 2>"$STDERR")"
cat "$STDERR"
[[ "$AGAIN" == "$V7" ]] || fail "re-publish gave $AGAIN, expected $V7"
grep -q '^unchanged coding_agent@agent_v7$' "$STDERR" || fail "re-publish was not reported unchanged"
echo "same digest, nothing created"

step "tag prod -> agent_v7 (only if prod does not exist yet: --expect-absent)"
if CURRENT="$(agentrt show coding_agent:prod --digest 2>/dev/null)"; then
  # A re-run against the same database: prod was created (and maybe moved) before.
  echo "prod already exists (at $CURRENT): leaving it to the next step"
else
  agentrt tag coding_agent prod "$V7" --expect-absent --reason "first release of coding_agent"
fi

step "offline digest of agent_v8 (its unchanged components come from the v7 file)"
V8="$(agentrt digest "$V8_FILE" --with "$V7_FILE")"
echo "$V8"

step "publish coding_agent@agent_v8 (apply_patch@2 -> apply_patch@3)"
PUBLISHED="$(agentrt publish "$V8_FILE" 2>"$STDERR")"
cat "$STDERR"
[[ "$PUBLISHED" == "$V8" ]] || fail "published $PUBLISHED, but the offline digest is $V8"

step "move prod agent_v7 -> agent_v8, only if prod still points at agent_v7 (--expect)"
# If prod already points at agent_v8 (a re-run), SetTag succeeds without writing anything.
agentrt tag coding_agent prod "$V8" --expect "$V7" --reason "roll out apply_patch@3"

step "show coding_agent:prod"
agentrt show coding_agent:prod
[[ "$(agentrt show coding_agent:prod --digest)" == "$V8" ]] || fail "prod does not point at $V8"

step "diff coding_agent@agent_v7 coding_agent@agent_v8"
DIFF="$(agentrt diff coding_agent@agent_v7 coding_agent@agent_v8)"
echo "$DIFF"
grep -q '^MODIFIED tools\[apply_patch\]' <<<"$DIFF" || fail "the diff does not show apply_patch"

step "done: coding_agent:prod is $V8"
