"""A worker host cut off from the network: what it costs, from outside.

    .venv/bin/python -m bench.partition [--runs 42] [--every 2.0]

Needs root (network namespaces, `tc`), as CI has. Host A is a threads worker in a
network namespace of its own (its own hostname), joined to the lab's Postgres (a cluster
of its own) and Redis by a veth pair on a /30; host B, this host, runs a threads worker
and beat; a plain Celery client sends `start_run`s on the `celery` queue throughout, and
a person approves each `ship` action and says how each call whose outcome is unknown
ended. Host A is cut off six times, each while it runs a step: frames dropped for 10 s,
its link down for 8 s, frames dropped for 12 s while one of its reads holds its run's
journal rows in an open transaction, a 1 s blip, frames dropped for 14 s, its link down
for 9 s (tests/support/partition.py, `CYCLES`). Every figure is read from outside: the
runs' rows, the journal, what each step noted of where and when it ran, and each of
host B's beats as Redis scored it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.partition import CYCLES, experiment, lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=42, help="start_runs sent")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between two")
    args = parser.parse_args()
    # Stopped (SIGTERM), the lab still takes its namespace, cluster and workers down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    with lab() as made:
        found = experiment(made, CYCLES, args.runs, args.every)
        cuts = [(c.how, round(c.healed - c.at, 1)) for c in made.cuts]
    summary = found.summary() | {"cuts (how, s)": cuts}
    summary["takeovers s"] = sorted(round(t, 2) for t in found.takeovers)
    summary["each step in flight on A at a cut"] = found.detail
    summary["took s"] = round(time.monotonic() - began)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
