"""Benchmark of retention: `agent-jobs prune` of 100,000 old runs while W1 runs beside it.

    .venv/bin/python -m bench.prune [--old-runs 100000] [--runs 200] [--rounds 3]
        [--batch 100]

Builds a database of its own (and starts a `redis-server` of its own), runs W1 (the
agent of `bench.durable`: two turns of two reads, then an answer) on one worker with 2
processes, and takes one of its completed runs as the model of an old run: its run row,
thread, messages, tool calls, usage, journal, session-log events and its delivered
notification are copied `--old-runs` times in bulk (server-side `INSERT … SELECT` over
`generate_series`, 10,000 runs a transaction), each copy its own run id and thread, ended
40 days ago. Then W1's throughput (`--runs` runs enqueued at once, `bench.durable`'s
`run_all`) is measured `--rounds` times alone, then over and over while a prune of runs
older than 30 days runs beside it in a process of its own (`agent_jobs.retention.prune`,
`--batch` runs a transaction, Redis streams unlinked as the command does), then alone
again. Reported: W1 runs/s alone and during the prune (only the rounds that began and
ended while the prune ran), the prune's rows/s and runs/s, and its batches' durations
(p50, p95, the longest).
"""

from __future__ import annotations

import argparse
import atexit
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs import retention  # noqa: E402
from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from bench.apps import app  # noqa: E402
from bench.durable import fresh_database, libpq, percentile, run_all  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import service_env, start_worker  # noqa: E402

CHUNK = 10_000  # old runs copied in a transaction
ENDED_DAYS_AGO = 40
OLDER_THAN = 30


def _columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name, column_default FROM information_schema.columns "
        "WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    # Serial keys (messages, usage, outbox) take the next value of their sequence.
    return [name for name, default in rows if not (default or "").startswith("nextval(")]


# Per table: which template rows to copy, and the copy's value of a column where it is
# not the template's (`g` is the copy's number, `new` its run id, also its thread's).
_COPIES: dict[str, tuple[str, dict[str, str]]] = {
    "threads": ("id = %(thread)s", {"id": "new"}),
    "runs": (
        "id = %(run)s",
        {
            "id": "new",
            "thread_id": "new",
            "root_run_id": "new",
            "finished_at": f"now() - interval '{ENDED_DAYS_AGO} days'",
            "created_at": f"now() - interval '{ENDED_DAYS_AGO} days 1 second'",
            "updated_at": f"now() - interval '{ENDED_DAYS_AGO} days'",
        },
    ),
    "messages": ("thread_id = %(thread)s", {"thread_id": "new", "run_id": "new"}),
    "tool_calls": ("run_id = %(run)s", {"run_id": "new", "thread_id": "new"}),
    "usage": ("run_id = %(run)s", {"run_id": "new", "thread_id": "new"}),
    "journal": ("run_id = %(run)s", {"run_id": "new"}),
    "events": ("thread_id = %(thread)s", {"thread_id": "new", "run_id": "new"}),
    "outbox": (
        "run_id = %(run)s",
        {
            "run_id": "new",
            "event_id": "md5(src.event_id || g::text)",
            "delivered_at": "coalesce(src.delivered_at, now())",
            "streamed_at": "coalesce(src.streamed_at, now())",
        },
    ),
}


def replicate(url: str, template: str, n: int, tag: str = "bench-prune-") -> dict[str, int]:
    """Copy the template run `n` times as runs that ended 40 days ago (ids made of `tag`
    and the copy's number); rows per table."""
    written: dict[str, int] = {}
    with psycopg.connect(libpq(url)) as conn:
        thread = conn.execute("SELECT thread_id FROM runs WHERE id = %s", (template,)).fetchone()
        assert thread is not None
        for low in range(1, n + 1, CHUNK):
            high = min(n, low + CHUNK - 1)
            for table, (where, changed) in _COPIES.items():
                columns = _columns(conn, table)
                values = [
                    (
                        "md5(%(tag)s || g::text)"
                        if changed.get(c) == "new"
                        else changed.get(c, f"src.{c}")
                    )
                    for c in columns
                ]
                done = conn.execute(
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"SELECT {', '.join(values)} FROM {table} src, "
                    f"generate_series(%(low)s::int, %(high)s::int) g WHERE src.{where}",
                    {"run": template, "thread": thread[0], "low": low, "high": high, "tag": tag},
                )
                written[table] = written.get(table, 0) + done.rowcount
            conn.commit()
        conn.execute("ANALYZE")
        conn.commit()
    return written


def prune_alone(url: str, redis_url: str, batch: int, rest: float) -> dict[str, Any]:
    """Run in a process of its own (`--prune-only`): the prune, as beat or the command runs
    it, and its figures."""
    store = Store.from_url(url)
    client = redis.Redis.from_url(redis_url)
    began = time.time()
    report = retention.prune(
        store, older_than=OLDER_THAN, batch=batch, rest=rest, redis_client=client
    )
    ended = time.time()
    durations = report.durations
    figures = report.as_dict()
    figures.update(
        began=began,
        ended=ended,
        rows_per_s=report.rows / report.elapsed,
        runs_per_s=report.runs / report.elapsed,
        batch_p50_ms=statistics.median(durations) * 1000,
        batch_p95_ms=percentile(durations, 95) * 1000,
        batch_max_ms=max(durations) * 1000,
    )
    return figures


def w1_rounds(client: Client, runs: int, rounds: int) -> list[float]:
    """W1's runs/s, `rounds` times."""
    return [runs / run_all(client, "w1", runs, 600)[0] for _ in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--old-runs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=200, help="W1 runs a round")
    parser.add_argument("--rounds", type=int, default=3, help="W1 rounds alone, before and after")
    parser.add_argument("--batch", type=int, default=100, help="runs a prune transaction")
    parser.add_argument(
        "--rest", type=float, default=1.0, help="the prune's rest after a batch, times the batch"
    )
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--prune-only", nargs=2, metavar=("DATABASE_URL", "REDIS_URL"))
    args = parser.parse_args()
    if args.prune_only:
        database_url, redis_url = args.prune_only
        print(json.dumps(prune_alone(database_url, redis_url, args.batch, args.rest)))
        return

    own_redis = RedisServer().start()
    atexit.register(own_redis.close)
    broker = own_redis.url(9)
    url = fresh_database(args.pg, "agent_jobs_bench_prune")
    store = Store.from_url(url)
    celery = celery_client(broker)
    client = Client(
        store, app, Settings(broker_url=broker, database_url=url), CeleryDispatcher(celery)
    )
    env = service_env(broker, url, AGENT_JOBS_APP="bench.apps:app")
    env["PYTHONPATH"] = str(ROOT)
    figures: dict[str, Any] = {"old_runs": args.old_runs, "w1_runs": args.runs, "rest": args.rest}
    worker = start_worker(env, concurrency=2, name="w1")
    try:
        _, warm = run_all(client, "w1", 10, 60)  # forks, connections, imports
        started = time.perf_counter()
        figures["rows_copied"] = replicate(url, warm[0], args.old_runs)
        figures["copy_s"] = time.perf_counter() - started
        figures["w1_alone_before"] = w1_rounds(client, args.runs, args.rounds)
        command = ["-m", "bench.prune", "--batch", str(args.batch), "--rest", str(args.rest)]
        command += ["--prune-only", url, broker]
        prune = subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        rounds: list[tuple[float, float, float]] = []  # (began, ended, runs/s)
        while prune.poll() is None:
            began = time.time()
            rate = w1_rounds(client, args.runs, 1)[0]
            rounds.append((began, time.time(), rate))
        out, _ = prune.communicate()
        if prune.returncode != 0:
            raise SystemExit(f"the prune failed ({prune.returncode})")
        figures["prune"] = pruned = json.loads(out)
        # Only the rounds that began and ended while the prune pruned.
        figures["w1_during_prune"] = during = [
            rate
            for began, ended, rate in rounds
            if began >= pruned["began"] and ended <= pruned["ended"]
        ]
        figures["w1_alone_after"] = w1_rounds(client, args.runs, args.rounds)
    finally:
        worker.stop()
        celery.close()
        store.engine.dispose()
    alone = figures["w1_alone_before"] + figures["w1_alone_after"]
    figures["w1_alone_runs_per_s"] = statistics.mean(alone)
    figures["w1_during_runs_per_s"] = statistics.mean(during) if during else None
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures)


def report(f: dict[str, Any]) -> None:
    p = f["prune"]
    print(f"old runs copied: {f['old_runs']} in {f['copy_s']:.0f} s ({f['rows_copied']})")
    alone = ", ".join(f"{r:.1f}" for r in f["w1_alone_before"] + f["w1_alone_after"])
    during = ", ".join(f"{r:.1f}" for r in f["w1_during_prune"])
    print(
        f"W1 ({f['w1_runs']} runs a round) alone: {f['w1_alone_runs_per_s']:.1f} runs/s ({alone})"
    )
    if f["w1_during_runs_per_s"] is not None:
        ratio = f["w1_during_runs_per_s"] / f["w1_alone_runs_per_s"]
        print(
            f"W1 during the prune: {f['w1_during_runs_per_s']:.1f} runs/s ({during}): "
            f"{ratio:.2f} of alone"
        )
    else:
        print("W1 during the prune: no round fit inside it (more --old-runs)")
    print(
        f"prune: {p['runs']} runs, {p['rows']} rows ({p['journal_rows']} journal, "
        f"{p['events']} events, {p['outbox']} notifications) in {p['elapsed']:.1f} s: "
        f"{p['rows_per_s']:.0f} rows/s, {p['runs_per_s']:.0f} runs/s"
    )
    print(
        f"its {p['batches']} batches: p50 {p['batch_p50_ms']:.1f} ms, p95 "
        f"{p['batch_p95_ms']:.1f} ms, longest {p['batch_max_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
