"""Benchmark of the doors: approval latency and live-stream latency, measured in one go.

    .venv/bin/python -m bench.doors [--runs 50] [--stream-runs 10] [--api-seconds 10]

Approval latency: `--runs` runs each park on an action call; once its
`approval_request` frame is on the stream, a signed decision is posted and the time
until the tool starts is measured — through pub/sub (PUBLISH) and through the stream
(XADD), each to a running `agent-jobs approvals listen`, one worker with 4 processes.
Stream latency: `--stream-runs` runs of a model that streams 20 deltas, each carrying
the time it was emitted, followed by `agent-jobs tail RUN_ID --json` in a subprocess;
the latency is the moment this process reads the delta from tail's output minus the
moment the model emitted it.
The HTTP API (`agent-jobs serve`, durable, a process of its own): the same `--stream-runs`
runs followed through `GET /v1/runs/{id}/stream` by an httpx client in this process
(model emits -> the client reads the event); how long a client that leaves keeps the
server's Redis reader (disconnect -> the reader's connection no longer blocked, polled
with CLIENT LIST every 10 ms); and `GET /v1/runs/{run_id}` requests per second, from
`--api-clients` concurrent keep-alive connections of an httpx AsyncClient for
`--api-seconds` (after a one-second warm-up), with each request's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
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
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.workers import Process, service_env, start_worker  # noqa: E402

SECRET = "bench-doors-secret"
CHANNEL = "agent_jobs:approvals"
API_TOKEN = f"bench-{uuid.uuid4().hex}"


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


def sse_latencies(client: Client, api: httpx.Client, n: int) -> list[float]:
    """Seconds from the model emitting a delta to an HTTP client reading its event."""
    samples = []
    for _ in range(n):
        run_id = client.enqueue_run("clock", "go", actor="bench")
        with api.stream("GET", f"/v1/runs/{run_id}/stream") as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: "):
                    continue
                read = time.time()
                frame = json.loads(line[len("data: ") :])
                if frame["type"] == "text_delta":
                    samples.append(read - float(frame["text"]))
    return samples


def release_times(client: Client, broker: redis.Redis, api: httpx.Client, n: int) -> list[float]:
    """Seconds from a client leaving a quiet stream to the server's reader letting go."""

    def blocked() -> int:
        clients: list[dict[str, Any]] = broker.client_list()
        return sum(c.get("name") == "agent-jobs-serve" and "b" in c["flags"] for c in clients)

    samples = []
    for _ in range(n):
        run_id = client.enqueue_run("gated", "go", actor="bench")
        wait(lambda: approval_request(broker, run_id), "an approval request")  # noqa: B023
        with api.stream("GET", f"/v1/runs/{run_id}/stream") as reply:
            for line in reply.iter_lines():
                if '"approval_request"' in line:
                    break
            wait(lambda: blocked() == 1, "the reader to block")
            left = time.monotonic()
        wait(lambda: blocked() == 0, "the reader to let go", every=0.01)
        samples.append(time.monotonic() - left)
        client.cancel(run_id)
    return samples


async def _throughput(base: str, path: str, clients: int, seconds: float) -> list[float]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits) as http:

        async def one(until: float, into: list[float]) -> None:
            while time.monotonic() < until:
                started = time.perf_counter()
                reply = await http.get(path)
                if reply.status_code != 200:
                    raise SystemExit(f"GET {path}: {reply.status_code} {reply.text}")
                into.append(time.perf_counter() - started)

        warm: list[float] = []
        await asyncio.gather(*(one(time.monotonic() + 1.0, warm) for _ in range(clients)))
        timed: list[float] = []
        until = time.monotonic() + seconds
        await asyncio.gather(*(one(until, timed) for _ in range(clients)))
    return timed


def api_throughput(base: str, run_id: str, clients: int, seconds: float) -> dict[str, float]:
    """`GET /v1/runs/{run_id}` requests a second from `clients` concurrent connections."""
    timed = asyncio.run(_throughput(base, f"/v1/runs/{run_id}", clients, seconds))
    return {"rps": len(timed) / seconds, "clients": clients, **summary(timed)}


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
    parser.add_argument("--api-clients", type=int, default=16)
    parser.add_argument("--api-seconds", type=float, default=10.0)
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
        AGENT_JOBS_API_TOKENS=json.dumps({API_TOKEN: "bench"}),
    )
    worker = start_worker(env, concurrency=4, name="doors")
    listener = Process(
        [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"], env, "listener"
    ).start(ready="listening on channel")
    port = free_port()
    serve = Process(
        [sys.executable, "-m", "agent_jobs.cli", "serve", "--port", str(port)], env, "serve"
    ).start(ready="Uvicorn running on")
    base = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60)
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
        figures["sse_delta"] = summary(sse_latencies(client, api, args.stream_runs))
        figures["sse_release"] = summary(release_times(client, broker, api, 5))
        finished = client.enqueue_run("clock", "go", actor="bench")
        wait(lambda: client.get_run(finished).finished, "a run to read", every=0.05)
        figures["api_get_run"] = api_throughput(base, finished, args.api_clients, args.api_seconds)
    finally:
        api.close()
        serve.stop()
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
        ("sse_delta", "SSE latency, model emits -> GET /v1/runs/{id}/stream client reads"),
        ("sse_release", "SSE client leaves -> the server's Redis reader lets go"),
    ):
        f = figures[name]
        print(
            f"{what}: p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms (n={f['n']})"
        )
    f = figures["api_get_run"]
    print(
        f"GET /v1/runs/{{run_id}}: {f['rps']:.0f} requests/s from {f['clients']} connections, "
        f"p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms (n={f['n']})"
    )


if __name__ == "__main__":
    main()
