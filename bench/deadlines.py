"""How late an approval's deadline is honoured: from `approval_deadline` to the timeout's
decision on the call's record.

    .venv/bin/python -m bench.deadlines [--runs 40]

On a database and a `redis-server` of its own, one worker (threads, as compose ships it)
and beat with the shipped sweep interval (30 s). `--runs` runs of an agent whose refund
times out after 1 s (`tests/support/apps`, `lapsing`), nobody deciding:

- wake-up: a deadline within a step's time limit (`AGENT_JOBS_STEP_TIME_LIMIT`, 300 s by
  default) wakes its run with a delayed re-drive, which decides it;
- sweep: with the step time limit below the deadline (no delayed message may wait that
  long), the sweep decides it; the runs are started spread over one sweep interval, so
  their deadlines fall anywhere in it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from bench.durable import fresh_database, percentile  # noqa: E402
from tests.support import apps  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import service_env, start_beat, start_worker  # noqa: E402

SWEEP_INTERVAL = 30.0  # the shipped AGENT_JOBS_SWEEP_INTERVAL


def lateness(store: Store, run_ids: list[str], timeout: float) -> list[float]:
    """Seconds from each run's call's deadline to its decision."""
    deadline = time.monotonic() + timeout
    late: list[float] = []
    for run_id in run_ids:
        while not (run := store.get_run(run_id)).finished:
            if time.monotonic() > deadline:
                raise SystemExit(f"run {run_id} still {run.status}")
            time.sleep(0.1)
        [call] = store.tool_calls(run_id)
        if call["decided_by"] != "agent-jobs":
            raise SystemExit(f"run {run_id}: decided by {call['decided_by']}, not the timeout")
        late.append((call["decided_at"] - call["approval_deadline"]).total_seconds())
    return late


def measure(
    mode: str, url: str, broker: str, runs: int, tmp: Path
) -> tuple[list[float], dict[str, Any]]:
    extra = {"AGENT_JOBS_STEP_TIME_LIMIT": "0.5"} if mode == "sweep" else {}
    env = service_env(
        broker,
        url,
        AGENT_JOBS_SWEEP_INTERVAL=str(SWEEP_INTERVAL),
        AGENT_JOBS_QUEUE=f"bench_deadlines_{mode}",
        **extra,
    )
    worker = start_worker(env, concurrency=20, name=f"deadlines-{mode}", pool="threads")
    beat = start_beat(env, tmp)
    store = Store.from_url(url)
    settings = Settings(broker_url=broker, database_url=url, queue=f"bench_deadlines_{mode}")
    client = Client(
        store, apps.app, settings, CeleryDispatcher(celery_client(broker, settings.queue))
    )
    try:
        ids = []
        spread = SWEEP_INTERVAL if mode == "sweep" else 2.0
        starts = sorted(random.uniform(0, spread) for _ in range(runs))
        began = time.monotonic()
        for at in starts:
            time.sleep(max(0.0, began + at - time.monotonic()))
            ids.append(client.enqueue_run("lapsing", "refund 42", actor="user-7"))
        late = lateness(store, ids, timeout=SWEEP_INTERVAL * 3 + 60)
    finally:
        worker.stop()
        beat.stop()
        store.engine.dispose()
    return late, {"runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = RedisServer().start()
    url = fresh_database(args.pg, "agent_jobs_bench_deadlines")
    os.environ["AGENT_JOBS_DATABASE_URL"] = url  # tests/support/apps side table
    figures: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for mode in ("wake-up", "sweep"):
                late, _ = measure(mode, url, server.url(0), args.runs, Path(tmp))
                figures[mode] = {
                    "p50_s": statistics.median(late),
                    "p95_s": percentile(late, 95),
                    "max_s": max(late),
                    "min_s": min(late),
                }
    finally:
        server.close()
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for mode, f in figures.items():
        print(
            f"{mode}: deadline -> timeout decision p50 {f['p50_s']:.2f} s, "
            f"p95 {f['p95_s']:.2f} s, max {f['max_s']:.2f} s ({args.runs} runs)"
        )


if __name__ == "__main__":
    main()
