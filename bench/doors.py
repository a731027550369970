"""Benchmark of the doors: approval latency and live-stream latency, measured in one go.

    .venv/bin/python -m bench.doors [--runs 50] [--stream-runs 10]

Approval latency: `--runs` runs each park on an action call; once its
`approval_request` frame is on the stream, a signed decision is posted and the time
until the tool starts is measured — through pub/sub (PUBLISH) and through the stream
(XADD), each to a running `agent-jobs approvals listen`, one worker with 4 processes.
Stream latency: `--stream-runs` runs of a model that streams 20 deltas, each carrying
the time it was emitted, followed by `agent-jobs tail RUN_ID --json` in a subprocess;
the latency is the moment this process reads the delta from tail's output minus the
moment the model emitted it.
"""

from __future__ import annotations

import argparse
import atexit
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_jobs.approvals.signing import sign  # noqa: E402
from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from bench.doors_app import app, started_key  # noqa: E402
from bench.durable import fresh_database, percentile  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402
from tests.workers import Process, service_env, start_worker  # noqa: E402

SECRET = "bench-doors-secret"
CHANNEL = "agent_jobs:approvals"


def wait(check: Any, what: str, timeout: float = 30, every: float = 0.002) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every)
    return value


def approval_request(broker: redis.Redis, run_id: str) -> dict[str, Any] | None:
    for _, fields in broker.xrange(f"agent_jobs:stream:{run_id}"):
        frame: dict[str, Any] = json.loads(fields[b"frame"])
        if frame["type"] == "approval_request":
            return frame
    return None


def approval_latencies(client: Client, broker: redis.Redis, n: int, door: str) -> list[float]:
    """Seconds from posting a decision to the approved tool starting, one run at a time."""
    samples = []
    for _ in range(n):
        run_id = client.enqueue_run("gated", "go", actor="bench")
        request = wait(lambda: approval_request(broker, run_id), "an approval request")  # noqa: B023
        message = {
            "type": "approval",
            "run_id": run_id,
            "call_id": request["call_id"],
            "decision": "approve",
            "actor": "approver",
            "args_sha256": request["args_sha256"],
        }
        body = json.dumps({**message, "sig": sign(message, SECRET)})
        posted = time.time()
        if door == "pubsub":
            if broker.publish(CHANNEL, body) != 1:
                raise SystemExit("the listener is not subscribed")
        else:
            broker.xadd(CHANNEL, {"message": body})
        started = wait(lambda: broker.get(started_key(run_id)), "the tool to start")  # noqa: B023
        samples.append(float(started) - posted)
        wait(lambda: client.get_run(run_id).finished, "the run to finish", every=0.01)  # noqa: B023
    return samples


def stream_latencies(client: Client, env: dict[str, str], n: int) -> list[float]:
    """Seconds from the model emitting a delta to `agent-jobs tail` printing it."""
    samples = []
    for _ in range(n):
        run_id = client.enqueue_run("clock", "go", actor="bench")
        tail = subprocess.Popen(
            [sys.executable, "-m", "agent_jobs.cli", "tail", run_id, "--json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert tail.stdout is not None
        for line in tail.stdout:
            read = time.time()
            frame = json.loads(line)["frame"]
            if frame["type"] == "text_delta":
                samples.append(read - float(frame["text"]))
        if tail.wait(timeout=30) != 0:
            raise SystemExit(f"tail of {run_id} failed")
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "max_ms": max(ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--stream-runs", type=int, default=10)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--redis",
        help="a Redis base URL (its databases are flushed); default: a redis-server of its own",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.redis is None:
        own_redis = RedisServer().start()
        atexit.register(own_redis.close)
        args.redis = own_redis.url(0).rsplit("/", 1)[0]

    url = fresh_database(args.pg, "agent_jobs_bench_doors")
    broker_url = f"{args.redis}/8"
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    store = Store.from_url(url)
    celery = celery_client(broker_url)
    client = Client(
        store, app, Settings(broker_url=broker_url, database_url=url), CeleryDispatcher(celery)
    )
    env = service_env(
        broker_url,
        url,
        AGENT_JOBS_APP="bench.doors_app:app",
        AGENT_JOBS_APPROVAL_SECRET=SECRET,
        AGENT_JOBS_APPROVALS_CHANNEL=CHANNEL,
    )
    worker = start_worker(env, concurrency=4, name="doors")
    listener = Process(
        [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"], env, "listener"
    ).start(ready="listening on channel")
    figures: dict[str, Any] = {}
    try:
        approval_latencies(client, broker, 5, "pubsub")  # warm up: forks, connections
        figures["approval_pubsub"] = summary(
            approval_latencies(client, broker, args.runs, "pubsub")
        )
        figures["approval_stream"] = summary(
            approval_latencies(client, broker, args.runs, "stream")
        )
        figures["stream_delta"] = summary(stream_latencies(client, env, args.stream_runs))
    finally:
        listener.stop()
        worker.stop()
        celery.close()
        store.engine.dispose()
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, what in (
        ("approval_pubsub", "approval latency, PUBLISH -> tool starts"),
        ("approval_stream", "approval latency, XADD -> tool starts"),
        ("stream_delta", "stream latency, model emits -> tail prints"),
    ):
        f = figures[name]
        print(
            f"{what}: p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms (n={f['n']})"
        )


if __name__ == "__main__":
    main()
