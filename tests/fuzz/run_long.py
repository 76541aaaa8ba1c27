"""The fuzz suite's long mode, for nightly runs: the same session as the short mode in
``make test``, many more generated requests, and totals per engine.

    .venv/bin/python -m tests.fuzz.run_long --requests 50000            # both engines
    .venv/bin/python -m tests.fuzz.run_long --requests 50000 --engine sqlite
    .venv/bin/python -m tests.fuzz.run_long --requests 2000 --seed 7    # another sample

PostgreSQL is the one the tests use (``AGENTRT_TEST_POSTGRES_URL``, default
127.0.0.1:5432/test as admin); a database is created for the run and dropped after it. The
SQLite file lives in a temporary directory. Each engine prints: requests, the status-code
histogram, UNKNOWN and INTERNAL counts, tracebacks (server log and the step writer's
stderr), partial writes, hung calls, the step writer's and health's state, and every
UNKNOWN/INTERNAL grouped by RPC with example requests. The exit status is 1 if any engine
has a problem. The malformed-bytes and page-token parts run once per engine as in the short
mode; ``--requests`` counts the generated part, spread evenly over every RPC.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid

from tests.conftest import (
    DEFAULT_POSTGRES,
    ENV_POSTGRES,
    create_postgres_database,
    drop_postgres_database,
)
from tests.fuzz.harness import FuzzSession, Report


class StderrTap:
    """Points this process's stderr (fd 2) at a file, so the step writer process, which
    inherits it from its zygote (started with the first server), logs there: its tracebacks
    are counted too. The server's own log goes to the session's handler instead."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self._read = 0

    def tracebacks(self) -> list[str]:
        """Tracebacks written since the last call."""
        self._file.seek(self._read)
        text = self._file.read().decode(errors="replace")
        self._read += len(text.encode())
        marker = "Traceback (most recent call last)"
        return [f"stderr (step writer): {marker}{chunk}" for chunk in text.split(marker)[1:]]

    def close(self) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.close()


def run_engine(engine: str, requests: int, seed: int, chunk: int, tap: StderrTap) -> Report:
    with tempfile.TemporaryDirectory(prefix="agentrt-fuzz-") as tmp:
        admin = os.environ.get(ENV_POSTGRES, DEFAULT_POSTGRES)
        name = f"agentrt_fuzz_{uuid.uuid4().hex[:12]}"
        if engine == "sqlite":
            url = f"sqlite:///{tmp}/agentrt.db"
        else:
            url = create_postgres_database(admin, name)
        try:
            with FuzzSession(engine, url) as session:
                session.corpus()
                session.malformed()
                session.page_tokens()
                # In chunks, with a progress line each, and a different seed per chunk so a
                # long run is not the same few hundred requests repeated.
                done = 0
                while done < requests:
                    step = min(chunk, requests - done)
                    session.generated(step, seed=seed + done)
                    done += step
                    print(
                        f"[{engine}] {session.report.requests} requests,"
                        f" UNKNOWN {session.report.codes['UNKNOWN']},"
                        f" INTERNAL {session.report.codes['INTERNAL']}",
                        file=sys.__stdout__,
                        flush=True,
                    )
                report = session.finish()
            report.tracebacks += tap.tracebacks()
            return report
        finally:
            if engine == "postgres":
                drop_postgres_database(admin, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=50_000, help="generated requests per engine"
    )
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--chunk", type=int, default=2_350, help="requests per progress line")
    args = parser.parse_args(argv)
    engines = ["sqlite", "postgres"] if args.engine == "both" else [args.engine]
    tap = StderrTap()
    try:
        reports = [
            run_engine(engine, args.requests, args.seed, args.chunk, tap) for engine in engines
        ]
    finally:
        tap.close()
    failed = False
    for report in reports:
        print(report.render())
        problems = report.problems()
        print("RESULT:", "; ".join(problems) if problems else "no problem found")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
