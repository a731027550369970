"""Benchmark of the model adapters on the durable path: first byte to first frame.

    .venv/bin/python -m bench.adapters [--calls 100]

For each adapter (OpenAI-compatible, Anthropic), a worker subprocess (one process)
runs `--calls` runs of a text-only agent whose model is the real adapter pointed at
the fake provider of the tests, served from this process. Each model call is the
durable `agent_jobs.model_turn` step. Per call:

- the fake provider takes `perf_counter()` as it writes the first chunk of the
  response body, which carries the first text piece (for Anthropic the message start,
  the block start and the first delta go out together, as they do from the API); the
  rest follows 20 ms a piece, about a model's token rate;
- a reader thread, blocked in `XREAD BLOCK` on the run's stream before the run is
  enqueued, takes `perf_counter()` when the first `text_delta` frame arrives.

Both clocks are this process's, so the difference is the adapter's overhead: the
SDK parsing the server-sent events, the adapter, the frame's XADD from the worker,
and Redis waking the reader. The floor printed beside it is the last part alone: an
XADD from this process to the blocked reader. The XADD entry id (the Redis server's
millisecond clock) gives a cross-check at 1 ms resolution.

It starts its own database (`agent_jobs_bench_adapters`), Redis database 15 and
worker; nothing leaves this machine.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
MODEL_TESTS = ROOT / "tests" / "models"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(MODEL_TESTS))

from e2e_app import build_app  # noqa: E402
from fakeprovider import FakeProvider, Recorded, Reply, anthropic_reply, openai_reply  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from agent_jobs.client import Client  # noqa: E402
from agent_jobs.dispatch import CeleryDispatcher, celery_client  # noqa: E402
from agent_jobs.models.registry import ProviderSettings  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs.store import Store  # noqa: E402
from agent_jobs.streams.base import stream_key  # noqa: E402
from bench.durable import fresh_database, percentile  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import Process, service_env, start_worker  # noqa: E402

ADAPTERS = ("openai", "anthropic")
PIECES = ["Order 42 ", "has shipped ", "and arrives ", "tomorrow."]
FAKE_KEY = "sk-bench-not-a-real-key-0000"
TOKEN_INTERVAL = 0.02  # seconds between two streamed pieces, about a model's token rate


def respond(request: Recorded) -> Reply:
    """Every call gets the same short streamed answer in its provider's protocol."""
    if request.path.endswith("/chat/completions"):
        reply = openai_reply(PIECES, prompt_tokens=40, completion_tokens=12)
    else:
        reply = anthropic_reply(PIECES, input_tokens=40, output_tokens=12, head=3)
    reply.interval = TOKEN_INTERVAL
    return reply


@dataclass
class FirstFrame:
    """A reader blocked on one run's stream until its first text delta."""

    client: redis.Redis
    run_id: str
    ready: threading.Event = field(default_factory=threading.Event)
    arrived: float | None = None
    entry_ms: int | None = None
    error: BaseException | None = None

    def run(self) -> None:
        key = stream_key(self.run_id)
        last = "0-0"
        try:
            while self.arrived is None:
                self.ready.set()
                batch: Any = self.client.xread({key: last}, block=20_000, count=100)
                now = time.perf_counter()
                if not batch:
                    raise TimeoutError(f"no frame of run {self.run_id} in 20 s")
                for entry, fields in batch[0][1]:
                    last = entry.decode()
                    frame = json.loads(fields[b"frame"])
                    if frame.get("type") == "text_delta":
                        self.arrived = now
                        self.entry_ms = int(last.split("-", 1)[0])
                        break
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def one_call(
    client: Client, reader_client: redis.Redis, fake: FakeProvider, agent: str
) -> tuple[float, float, float]:
    """(first byte → frame read, first byte → XADD by the entry id, run latency), seconds."""
    run_id = uuid.uuid4().hex
    reader = FirstFrame(reader_client, run_id)
    thread = threading.Thread(target=reader.run, name="first-frame")
    thread.start()
    reader.ready.wait(5)
    time.sleep(0.002)  # let the reader reach its XREAD
    seen = len(fake.requests)
    offset = time.time() - time.perf_counter()
    started = time.perf_counter()
    client.enqueue_run(agent, "Where is order 42?", actor="bench", run_id=run_id)
    thread.join(30)
    if reader.error is not None or reader.arrived is None:
        raise SystemExit(f"run {run_id}: no text frame: {reader.error}")
    run = client.wait(run_id, timeout=30, poll=0.005)
    finished = time.perf_counter()
    if run.status != "completed":
        raise SystemExit(f"run {run_id} {run.status}: {run.error}")
    requests = fake.requests[seen:]
    if len(requests) != 1 or requests[0].first_chunk_at is None:
        raise SystemExit(f"run {run_id}: expected one streamed model call, got {len(requests)}")
    first_byte = requests[0].first_chunk_at
    assert reader.entry_ms is not None
    by_entry = reader.entry_ms / 1000 - (first_byte + offset)
    return reader.arrived - first_byte, by_entry, finished - started


def redis_floor(url: str, n: int = 200) -> list[float]:
    """Seconds from an XADD in this process to a reader blocked in XREAD waking."""
    writer = redis.Redis.from_url(url)
    reader_client = redis.Redis.from_url(url)
    samples = []
    try:
        for _ in range(n):
            key = f"bench:floor:{uuid.uuid4().hex}"
            woke: list[float] = []
            ready = threading.Event()

            def read(
                key: str = key, woke: list[float] = woke, ready: threading.Event = ready
            ) -> None:
                ready.set()
                reader_client.xread({key: "0-0"}, block=5000, count=1)
                woke.append(time.perf_counter())

            thread = threading.Thread(target=read)
            thread.start()
            ready.wait(5)
            time.sleep(0.002)
            sent = time.perf_counter()
            writer.xadd(key, {"frame": "{}"})
            thread.join(10)
            writer.delete(key)
            if woke:
                samples.append(woke[0] - sent)
    finally:
        writer.close()
        reader_client.close()
    return samples


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50_ms": statistics.median(ms),
        "p95_ms": percentile(ms, 95),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=100, help="measured calls per adapter")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured calls per adapter")
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

    url = fresh_database(args.pg, "agent_jobs_bench_adapters")
    broker = f"{args.redis}/15"
    broker_client = redis.Redis.from_url(broker)
    broker_client.flushdb()
    reader_client = redis.Redis.from_url(broker)

    figures: dict[str, Any] = {"calls": args.calls}
    fake = FakeProvider(responder=respond).start()
    store = Store.from_url(url)
    celery = celery_client(broker)
    unused = SecretStr("unused")
    app = build_app(ProviderSettings(openai_api_key=unused, anthropic_api_key=unused))
    client = Client(
        store, app, Settings(broker_url=broker, database_url=url), CeleryDispatcher(celery)
    )
    env = service_env(
        broker,
        url,
        AGENT_JOBS_APP="e2e_app:app",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(MODEL_TESTS)]),
        AGENT_JOBS_OPENAI_BASE_URL=f"{fake.url}/v1",
        AGENT_JOBS_OPENAI_API_KEY=FAKE_KEY,
        AGENT_JOBS_ANTHROPIC_BASE_URL=fake.url,
        AGENT_JOBS_ANTHROPIC_API_KEY=FAKE_KEY,
    )
    worker: Process | None = None
    try:
        worker = start_worker(env, concurrency=1, name="bench-adapters")
        for adapter in ADAPTERS:
            agent = f"{adapter}-chat"
            for _ in range(args.warmup):
                one_call(client, reader_client, fake, agent)
            samples = [one_call(client, reader_client, fake, agent) for _ in range(args.calls)]
            path = "/v1/chat/completions" if adapter == "openai" else "/v1/messages"
            sample = respond(Recorded(method="POST", path=path, headers={}, body=None))
            figures[adapter] = {
                "first_byte_to_frame": summary([s[0] for s in samples]),
                "first_byte_to_xadd_by_entry_id": summary([s[1] for s in samples]),
                "run": summary([s[2] for s in samples]),
                "pacing_ms": (len(sample.chunks) - 1) * sample.interval * 1000,
            }
        figures["floor_xadd_to_xread"] = summary(redis_floor(broker))
    finally:
        if worker is not None:
            worker.stop()
        fake.stop()
        celery.close()
        store.engine.dispose()
        reader_client.close()
        broker_client.close()

    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures)


def report(f: dict[str, Any]) -> None:
    print(f"adapter overhead on the durable path, {f['calls']} calls each (one worker process)")
    for adapter in ADAPTERS:
        frame = f[adapter]["first_byte_to_frame"]
        entry = f[adapter]["first_byte_to_xadd_by_entry_id"]
        run = f[adapter]["run"]
        print(
            f"  {adapter:9}  first byte -> first text_delta read: p50 {frame['p50_ms']:.2f} ms, "
            f"p95 {frame['p95_ms']:.2f} ms (min {frame['min_ms']:.2f}, max {frame['max_ms']:.2f})"
        )
        print(
            f"  {'':9}  first byte -> XADD by entry id (1 ms resolution): "
            f"p50 {entry['p50_ms']:.1f} ms, p95 {entry['p95_ms']:.1f} ms"
        )
        print(
            f"  {'':9}  whole run (enqueue -> completed, one model call): "
            f"p50 {run['p50_ms']:.1f} ms, p95 {run['p95_ms']:.1f} ms, of which "
            f"{f[adapter]['pacing_ms']:.0f} ms is the fake provider's pacing"
        )
    floor = f["floor_xadd_to_xread"]
    print(
        f"  floor: XADD -> blocked XREAD wakes, in this process: p50 {floor['p50_ms']:.3f} ms, "
        f"p95 {floor['p95_ms']:.3f} ms"
    )


if __name__ == "__main__":
    main()
