"""The fuzz suite's short mode, part of ``make test``: a real server on each engine takes
generated requests for every RPC, malformed bytes and tampered page tokens, and must answer
every one with a deliberate code, log no traceback, keep its step writer and health, and
write nothing for a refused call (see :mod:`tests.fuzz.harness` for the exact checks).

The generated part is seeded, so a CI run sends the same requests (up to the ids the server
hands out) every time. ``AGENTRT_FUZZ_REQUESTS`` raises its size; the nightly long mode is
``python -m tests.fuzz.run_long`` (docs/reliability.md).
"""

from __future__ import annotations

import os

from tests.fuzz.harness import FuzzSession

GENERATED = int(os.environ.get("AGENTRT_FUZZ_REQUESTS", "300"))


def test_no_request_crashes_wedges_or_half_writes(engine: str, database_url: str) -> None:
    """One server per engine (a server and its witness cost seconds: the three parts share
    them). Every RPC must be reached by generated requests, and every List RPC must have
    handed out a real page token to tamper with, or the test would prove nothing for it."""
    with FuzzSession(engine, database_url) as session:
        session.corpus()
        session.malformed()
        session.page_tokens()
        session.generated(GENERATED)
        report = session.finish()
    print(report.render())
    assert not report.tokens_missing, f"no page token to tamper with: {report.tokens_missing}"
    covered = {rpc for rpc, _ in report.by_rpc}
    assert covered == {rpc.label for rpc in session.rpcs}
    problems = report.problems()
    assert not problems, "; ".join(problems) + "\n" + report.render()
