"""How long ``agentrt demo`` takes, as a newcomer runs it (issue 18: under 30 seconds).

Runs the real command ``--repetitions`` times (each starts its own server and two worker
processes on a fresh SQLite file) and reports the wall time of each whole command and the
demo's own timeline (seconds from its start to each milestone, read from ``--json``). Beside
it, the same machine's cost of starting one Python process that imports the server's CLI, the
floor under every process the demo starts: this machine is shared and noisy, so read the
demo's time against it.

    .venv/bin/python bench/demo_time.py --repetitions 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _timed(argv: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return time.monotonic() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    floor = [_timed([sys.executable, "-c", "import runtime_service.cli.main"])[0] for _ in range(3)]
    walls, timelines = [], []
    for _ in range(args.repetitions):
        wall, out = _timed([sys.executable, "-m", "runtime_service.cli.main", "demo", "--json"])
        walls.append(wall)
        timelines.append(json.loads(out)["timeline"])
    print(f"python + CLI import (floor of each process): {statistics.median(floor):.2f} s")
    print("| run | wall (whole command) | " + " | ".join(m for m, _ in timelines[0]) + " |")
    print("|---|---|" + "---|" * len(timelines[0]))
    for index, (wall, timeline) in enumerate(zip(walls, timelines, strict=True), 1):
        marks = " | ".join(f"{t:.2f}" for _, t in timeline)
        print(f"| {index} | {wall:.2f} | {marks} |")
    print(f"median wall: {statistics.median(walls):.2f} s; max {max(walls):.2f} s")


if __name__ == "__main__":
    main()
