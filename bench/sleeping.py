"""Sleeping runs (docs/time.md): how late a sleeper wakes, and what 1,000 sleepers cost.

    .venv/bin/python -m bench.sleeping [--timers 200] [--sleepers 1000] [--quiet 60]

On a database and a `redis-server` of its own, one worker (threads pool, 8 at once, as
compose ships it) and beat with the shipped timers tick (`AGENT_JOBS_TIMER_INTERVAL`, 1 s).
The agent is the tests' `sleeper` (tests/support/apps/timers.py): its model calls `wait`
with the run's input as arguments, then answers.

- Precision: `--timers` runs sleep between 3 and 13 s (spread evenly, so their wake times
  fall anywhere between two ticks); lateness is the timer row's `at` (when the pass woke
  the run) minus its `wake_at`, as the journal says. p50, p95, max.
- Cost: `--sleepers` runs sleep for an hour. Once all sleep, over `--quiet` seconds with
  nothing else going on: the Redis commands run (INFO commandstats delta, by command),
  the keys Redis holds and the broker queue's length and unacknowledged messages, the
  tasks the worker has active, reserved or scheduled, the worker's RSS (every process) —
  each beside the same quiet window with no sleeper — and how long the tick's query takes
  with them all asleep.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.store import timers as timer_rows  # noqa: E402
from agent_jobs.store.db import utcnow  # noqa: E402
from bench.durable import (  # noqa: E402
    _descendants,
    _rss_bytes,
    fresh_database,
    percentile,
    redis_commands,
)
from tests.support import apps  # noqa: E402
from tests.support.apps.timers import NAP  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import service_env, start_beat, start_worker  # noqa: E402

QUEUE = "bench_sleeping"


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.2)


def statuses(store: Store, run_ids: list[str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for run_id in run_ids:
        status = store.get_run(run_id).status
        counted[status] = counted.get(status, 0) + 1
    return counted


def lateness(store: Store, run_id: str) -> float:
    row = {r["step"]: r for r in store.journal(run_id)}[f"timer:{NAP}"]
    if row["result"]["woke"] != "time":
        raise SystemExit(f"run {run_id} woke for {row['result']['woke']}")
    at = datetime.fromisoformat(row["result"]["at"])
    return (at - datetime.fromisoformat(row["intent"]["wake_at"])).total_seconds()


def precision(client: Client, store: Store, timers: int) -> dict[str, Any]:
    seconds = [3 + 10 * i / max(1, timers - 1) for i in range(timers)]
    run_ids = [client.enqueue_run("sleeper", json.dumps({"seconds": s})) for s in seconds]
    wait_for(lambda: all(store.get_run(r).finished for r in run_ids), 120 + timers, "the timers")
    late = [lateness(store, run_id) for run_id in run_ids]
    return {
        "timers": timers,
        "p50_s": statistics.median(late),
        "p95_s": percentile(late, 95),
        "max_s": max(late),
        "min_s": min(late),
    }


def quiet_window(broker: redis.Redis, celery: Any, pids: list[int], quiet: float) -> dict[str, Any]:
    inspect = celery.control.inspect(timeout=5.0)
    held = {
        name: sum(len(v) for v in (getattr(inspect, name)() or {}).values())
        for name in ("active", "reserved", "scheduled")
    }
    before = redis_commands(broker)
    time.sleep(quiet)
    after = redis_commands(broker)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    delta.pop("info", None)  # this measurement's own
    return {
        "seconds": quiet,
        "redis_commands": sum(delta.values()),
        "redis_by_command": dict(sorted(delta.items(), key=lambda kv: -kv[1])),
        "redis_keys": broker.dbsize(),
        "redis_keys_by_kind": keys_by_kind(broker),
        "queue_length": broker.llen(QUEUE),
        "unacked": broker.hlen("unacked"),
        "worker_tasks": held,
        "worker_rss_mb": round(_rss_bytes(pids) / 2**20, 1),
    }


def keys_by_kind(broker: redis.Redis) -> dict[str, int]:
    """The keys Redis holds, by what they are: a run's live stream, the rest by name."""
    kinds: dict[str, int] = {}
    for key in broker.scan_iter(count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        kind = "agent_jobs:stream:<run>" if name.startswith("agent_jobs:stream:") else name
        kind = "celery-task-meta / kombu binding" if kind.startswith("_kombu") else kind
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def tick_query_ms(store: Store, n: int = 200) -> float:
    started = time.perf_counter()
    for _ in range(n):
        with store.connect() as conn:
            timer_rows.due(conn, utcnow())
    return (time.perf_counter() - started) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--timers", type=int, default=200)
    parser.add_argument("--sleepers", type=int, default=1000)
    parser.add_argument("--quiet", type=float, default=60.0)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = RedisServer().start()
    url = fresh_database(args.pg, "agent_jobs_bench_sleeping")
    os.environ["AGENT_JOBS_DATABASE_URL"] = url  # tests/support/apps side table
    broker_url = server.url(0)
    env = service_env(broker_url, url, AGENT_JOBS_QUEUE=QUEUE)
    figures: dict[str, Any] = {}
    store = Store.from_url(url)
    celery = celery_client(broker_url, QUEUE)
    settings = Settings(broker_url=broker_url, database_url=url, queue=QUEUE)
    client = Client(store, apps.app, settings, CeleryDispatcher(celery))
    broker = redis.Redis.from_url(broker_url)
    with tempfile.TemporaryDirectory() as tmp:
        worker = start_worker(env, concurrency=8, name="sleeping", pool="threads")
        beat = start_beat(env, Path(tmp))
        try:
            pids = _descendants(worker.proc.pid) if worker.proc is not None else []
            figures["precision"] = precision(client, store, args.timers)
            figures["idle"] = quiet_window(broker, celery, pids, args.quiet)
            started = time.monotonic()
            run_ids = [
                client.enqueue_run("sleeper", json.dumps({"seconds": 3600}))
                for _ in range(args.sleepers)
            ]
            wait_for(
                lambda: statuses(store, run_ids).get("sleeping", 0) == len(run_ids),
                600,
                "every run to sleep",
            )
            figures["to_sleep_s"] = time.monotonic() - started
            figures["asleep"] = quiet_window(broker, celery, pids, args.quiet)
            figures["asleep"]["sleepers"] = statuses(store, run_ids).get("sleeping", 0)
            figures["tick_query_ms"] = tick_query_ms(store)
        finally:
            worker.stop()
            beat.stop()
            store.engine.dispose()
            server.close()
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    report(figures)


def keys_text(kinds: dict[str, int]) -> str:
    shown = [f"{k} {v}" for k, v in list(kinds.items())[:3]]
    rest = sum(list(kinds.values())[3:])
    return ", ".join(shown + ([f"{rest} others"] if rest else []))


def report(f: dict[str, Any]) -> None:
    p = f["precision"]
    print(
        f"wake-up lateness over {p['timers']} timers: p50 {p['p50_s'] * 1000:.0f} ms, "
        f"p95 {p['p95_s'] * 1000:.0f} ms, max {p['max_s'] * 1000:.0f} ms "
        f"(min {p['min_s'] * 1000:.0f} ms)"
    )
    for name in ("idle", "asleep"):
        w = f[name]
        who = f"{w.get('sleepers', 0)} sleepers" if name == "asleep" else "no sleeper"
        print(
            f"{who}, {w['seconds']:.0f} s quiet: {w['redis_commands']} Redis commands "
            f"({', '.join(f'{k} {v}' for k, v in list(w['redis_by_command'].items())[:6])}); "
            f"{w['redis_keys']} keys ({keys_text(w['redis_keys_by_kind'])}), "
            f"queue {w['queue_length']}, unacked {w['unacked']}; "
            f"worker tasks {w['worker_tasks']}; worker RSS {w['worker_rss_mb']} MB"
        )
    print(
        f"{f['asleep']['sleepers']} runs put to sleep in {f['to_sleep_s']:.1f} s; "
        f"the tick's query with them asleep: {f['tick_query_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
