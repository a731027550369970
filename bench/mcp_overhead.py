"""Benchmark: what an MCP tool call costs over a plain tool's, in the same run.

    .venv/bin/python -m bench.mcp_overhead [--runs 100] [--pool threads]

Each run of the MCP test app's `bench` agent (tests/support/apps/mcp.py) calls a plain
read tool (`lookup`, a Python function), then an MCP read tool (`files.stat`, on the stdio
server of tests/support/mcp_server.py, written with the SDK), one model turn each, on
one worker (`--pool`, 4 processes or threads) of the durable runner, with Postgres and a
Redis server of its own. A tool step's duration is its journal row's `finished_at -
started_at` (the call itself, in the worker: its dispatch is the same for both); the
overhead is the MCP step's minus the plain step's, run by run. `--warm` runs first,
unmeasured, so that each worker process has its connection (the list, and a stdio
server's start, are paid once per process and connection, not per call). `--runner
inline` measures the same on the inline runner (SQLite, this process).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TEST_MCP_LOG", str(Path(tempfile.mkdtemp()) / "calls.log"))

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from bench.durable import fresh_database, percentile  # noqa: E402
from tests.support.apps.mcp import app  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import service_env, start_worker  # noqa: E402

PLAIN, MCP = "tool:call_1", "tool:call_2"


def durations(store: Store, run_id: str) -> tuple[float, float]:
    """(plain, MCP) tool step durations of a finished run, in milliseconds."""
    rows = {row["step"]: row for row in store.journal(run_id)}
    for step in (PLAIN, MCP):
        assert rows[step]["state"] == "done" and rows[step]["result"]["ok"], rows[step]

    def ms(step: str) -> float:
        row = rows[step]
        return float((row["finished_at"] - row["started_at"]).total_seconds() * 1000)

    return ms(PLAIN), ms(MCP)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "mean_ms": sum(values) / len(values),
    }


def durable(args: argparse.Namespace) -> tuple[list[str], Store]:
    own_redis = RedisServer().start()
    atexit.register(own_redis.close)
    broker_url = own_redis.url(0)
    url = fresh_database(args.pg, "agent_jobs_bench_mcp")
    store = Store.from_url(url)
    celery = celery_client(broker_url)
    settings = Settings(broker_url=broker_url, database_url=url)
    client = Client(store, app, settings, CeleryDispatcher(celery))
    env = service_env(broker_url, url, AGENT_JOBS_APP="tests.support.apps.mcp:app")
    worker = start_worker(env, concurrency=4, name="mcp-bench", pool=args.pool)
    atexit.register(worker.stop)

    def one_by_one(n: int) -> list[str]:
        done = []
        for _ in range(n):
            run_id = client.enqueue_run("bench", "go", actor="user-7")
            run = client.wait(run_id, timeout=60, poll=0.01)
            assert run.status == "completed", (run.status, run.error, worker.log()[-3000:])
            done.append(run_id)
        return done

    one_by_one(args.warm)
    return one_by_one(args.runs), store


def inline(args: argparse.Namespace) -> tuple[list[str], Store]:
    from agent_jobs import InlineRunner

    store = Store.from_url(f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    runner = InlineRunner(app, store, settings=Settings(), poll_interval=0.01)
    for _ in range(args.warm):
        runner.run("bench", "go", actor="user-7", timeout=60)
    runs = []
    for _ in range(args.runs):
        run = runner.run("bench", "go", actor="user-7", timeout=60)
        assert run.status == "completed", run.error
        runs.append(run.run_id)
    return runs, store


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--runner", default="durable", choices=["durable", "inline"])
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork"])
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    started = time.monotonic()
    runs, store = durable(args) if args.runner == "durable" else inline(args)
    pairs = [durations(store, run_id) for run_id in runs]
    figures: dict[str, Any] = {
        "runner": args.runner if args.runner == "inline" else f"durable ({args.pool})",
        "runs": len(runs),
        "plain": summary([p for p, _ in pairs]),
        "mcp": summary([m for _, m in pairs]),
        "overhead": summary([m - p for p, m in pairs]),
        "seconds": time.monotonic() - started,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{figures['runner']}, {len(runs)} runs, each a plain tool step then an MCP one")
    for name, what in (
        ("plain", "plain tool step (lookup)"),
        ("mcp", "MCP tool step (files.stat, stdio)"),
        ("overhead", "MCP minus plain, run by run"),
    ):
        f = figures[name]
        print(
            f"  {what}: p50 {f['p50_ms']:.2f} ms, p95 {f['p95_ms']:.2f} ms, "
            f"mean {f['mean_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
