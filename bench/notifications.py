"""Benchmark of notifications: delivery delay to a webhook, and what an idle sender costs.

    .venv/bin/python -m bench.notifications [--runs 300] [--polled 50] [--pool threads]

Delivery delay: `--runs` W1 runs enqueued one every `--every` seconds to one worker
(`--pool`, 4 processes or threads) whose processes send notifications to a webhook
receiver in this process (a threaded `http.server`, answering 204 at once); each
`run.completed` is timed from its `at` (stamped in the transaction that ends the run,
just before its commit) to the receiver reading its body. A worker's own commit wakes its
sender: this is the usual path. `--polled` more notifications are written by this
process, which runs no sender, one every 0.1 s: the worker finds them at its next poll
(`AGENT_JOBS_NOTIFY_POLL_INTERVAL`, 1 s), the path of rows another process wrote.

Idle cost: a sender in this process with nothing to send, on an outbox of
`--idle-rows` delivered rows: its CPU and Postgres transactions per poll, and the
server's own time for the poll's one query (`EXPLAIN ANALYZE`, on the undelivered
rows' index).
"""

from __future__ import annotations

import argparse
import atexit
import json
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.notify.sender import Sender  # noqa: E402
from agent_jobs.runs import RunRequest, create_run  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.store import outbox as outbox_rows  # noqa: E402
from agent_jobs.store import runs as run_rows  # noqa: E402
from agent_jobs.store.db import utcnow  # noqa: E402
from agent_jobs.store.schema import outbox  # noqa: E402
from bench.apps import app  # noqa: E402
from bench.durable import fresh_database, percentile  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.workers import service_env, start_worker  # noqa: E402

SECRET = "bench-notifications-secret"


class Receiver:
    """Records when each event arrived (wall clock, as the events' `at`)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrived: dict[str, tuple[float, dict[str, Any]]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                now = time.time()
                event = json.loads(body)
                with receiver.lock:
                    receiver.arrived.setdefault(event["event_id"], (now, event))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/notifications"

    def delays(self, run_ids: set[str]) -> list[float]:
        """Seconds from each run's notification `at` to its arrival."""
        with self.lock:
            found = [(t, e) for t, e in self.arrived.values() if e["run_id"] in run_ids]
        return [t - datetime.fromisoformat(e["at"]).timestamp() for t, e in found]

    def count(self, run_ids: set[str]) -> int:
        with self.lock:
            return sum(1 for _, e in self.arrived.values() if e["run_id"] in run_ids)


def wait(check: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def summary(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "max_ms": max(ms),
    }


def woken(client: Client, receiver: Receiver, runs: int, every: float) -> list[float]:
    """W1 runs, each ending in a worker whose commit wakes that process's sender."""
    run_ids: set[str] = set()
    for _ in range(runs):
        run_ids.add(client.enqueue_run("w1", "go", actor="bench"))
        time.sleep(every)
    wait(lambda: receiver.count(run_ids) == runs, f"{runs} notifications")
    return receiver.delays(run_ids)


def polled(store: Store, receiver: Receiver, n: int) -> list[float]:
    """Runs ended by this process (no sender here): a worker's poll finds their rows."""
    run_ids: set[str] = set()
    for _ in range(n):
        run_id = uuid.uuid4().hex
        with store.begin() as conn:
            request = RunRequest(agent="w1", input="go", actor="bench")
            create_run(conn, request, run_id=run_id, runner="durable", status="running")
        with store.begin() as conn:
            run_rows.finish_run(conn, run_id, "completed", output="done elsewhere")
        run_ids.add(run_id)
        time.sleep(0.1)
    wait(lambda: receiver.count(run_ids) == n, f"{n} polled notifications")
    return receiver.delays(run_ids)


def idle_cost(url: str, rows: int, seconds: float) -> dict[str, float]:
    """A sender with nothing to send, on an outbox of `rows` delivered rows."""
    store = Store.from_url(url)
    long_ago = utcnow() - timedelta(days=1)
    with store.begin() as conn:
        conn.execute(outbox.delete())
        for start in range(0, rows, 10_000):
            conn.execute(
                insert(outbox),
                [
                    {
                        "event_id": uuid.uuid4().hex,
                        "type": "run.completed",
                        "run_id": uuid.uuid4().hex,
                        "body": {},
                        "created_at": long_ago,
                        "next_attempt_at": long_ago,
                        "streamed_at": long_ago,
                        "delivered_at": long_ago,
                    }
                    for _ in range(min(10_000, rows - start))
                ],
            )
    with store.begin() as conn:
        conn.execute(text("ANALYZE outbox"))
        plan = conn.execute(
            text(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT next_attempt_at FROM outbox "
                "WHERE delivered_at IS NULL ORDER BY next_attempt_at LIMIT 1"
            )
        ).scalar_one()
    top = plan[0]
    uses_index = "ix_outbox_undelivered" in json.dumps(top["Plan"])

    store.engine.dispose()

    def commits() -> int:
        """The database's committed transactions (a backend reports its own when it
        ends: every connection here is closed before the count is read)."""
        counter = Store.from_url(url)
        with counter.connect() as conn:
            found = conn.execute(
                text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        counter.engine.dispose()
        time.sleep(0.5)
        return int(found)

    # A poll every 10 ms (the shipped interval is 1 s): the cost of each is what matters.
    settings = Settings(database_url=url, notify_poll_interval=0.01, redis_url=None)
    looker = Store.from_url(url)
    sender = Sender(looker, settings)  # nowhere to deliver: it only looks
    with looker.connect() as conn:
        outbox_rows.next_due(conn)  # the pool's connection, made before the clock starts
    before_commits = commits()
    before_cpu = time.process_time()
    sender.start()
    time.sleep(seconds)
    sender.stop()
    cpu = time.process_time() - before_cpu
    polls = sender.polls
    looker.engine.dispose()
    time.sleep(1.0)
    # Less the first count's own look and the warm-up's (its connection reported it later).
    transactions = commits() - before_commits - 2
    return {
        "polls": polls,
        "cpu_us_per_poll": cpu / polls * 1e6,
        "transactions_per_poll": transactions / polls,
        "query_server_ms": float(top["Execution Time"]),
        "index": 1.0 if uses_index else 0.0,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--every", type=float, default=0.05, help="seconds between enqueues")
    parser.add_argument("--polled", type=int, default=50)
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork"])
    parser.add_argument("--idle-rows", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    own_redis = RedisServer().start()
    atexit.register(own_redis.close)
    broker_url = own_redis.url(0)

    url = fresh_database(args.pg, "agent_jobs_bench_notify")
    receiver = Receiver()
    store = Store.from_url(url)
    celery = celery_client(broker_url)
    client = Client(
        store, app, Settings(broker_url=broker_url, database_url=url), CeleryDispatcher(celery)
    )
    env = service_env(
        broker_url,
        url,
        AGENT_JOBS_APP="bench.apps:app",
        AGENT_JOBS_WEBHOOK_URL=receiver.url,
        AGENT_JOBS_WEBHOOK_SECRET=SECRET,
    )
    worker = start_worker(env, concurrency=4, name="notify", pool=args.pool)
    figures: dict[str, Any] = {}
    try:
        woken(client, receiver, 10, args.every)  # warm up: forks, connections
        figures["woken"] = summary(woken(client, receiver, args.runs, args.every))
        figures["polled"] = summary(polled(store, receiver, args.polled))
    finally:
        worker.stop()
        celery.close()
        store.engine.dispose()
        receiver.server.shutdown()
    figures["idle"] = idle_cost(url, args.idle_rows, args.idle_seconds)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, what in (
        ("woken", f"run ended in a worker ({args.pool}) -> webhook receiver reads it"),
        ("polled", "row written by a process with no sender -> a worker's poll delivers it"),
    ):
        f = figures[name]
        print(
            f"{what}: p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms (n={f['n']})"
        )
    f = figures["idle"]
    print(
        f"idle sender: {f['cpu_us_per_poll']:.0f} µs of CPU and "
        f"{f['transactions_per_poll']:.2f} Postgres transactions a poll (n={f['polls']}); "
        f"the poll's query {f['query_server_ms']:.3f} ms on the server over {f['rows']} "
        f"delivered rows ({'on' if f['index'] else 'NOT on'} ix_outbox_undelivered)"
    )


if __name__ == "__main__":
    main()
