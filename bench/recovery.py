"""How fast a step whose worker died runs again: SIGKILL to the step's next start.

    .venv/bin/python -m bench.recovery [--repeat 3] [--pool prefork|threads]

With the shipped settings (lease 30 s, sweep every 30 s, stale after 60 s), on a
database and a `redis-server` of its own:

- child: the pool process running a tool step is SIGKILLed; its worker lives on, and
  Celery hands the message back (`task_reject_on_worker_lost`).
- worker: the whole worker (main process and pool) is SIGKILLed while a second worker
  is up; nothing hands the message back: the other worker sees that the dead one's
  processes stopped beating (runners/durable/liveness.py). On a threads pool a worker is one
  process: only this case is measured.

Each figure is the time from the SIGKILL to the step's next start, as the tool itself
records it in the database.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from bench.durable import fresh_database  # noqa: E402
from tests.support import apps  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import Process, service_env, start_beat, start_worker  # noqa: E402


def one(client: Client, kill: str, workers: list[Process], timeout: float) -> float:
    run_id = client.enqueue_run("held", "go", actor="bench")
    pid, _ = apps.wait_held_starts(run_id, 1, 60)[0]
    time.sleep(0.3)
    killed_at = time.time()
    if kill == "child":
        os.kill(pid, signal.SIGKILL)
    else:
        victim = next(w for w in workers if w.proc is not None and _owns(w.proc.pid, pid))
        victim.kill()
        workers.remove(victim)
    _, again = apps.wait_held_starts(run_id, 2, timeout)[1]
    if client.wait(run_id, timeout=60).status != "completed":
        raise SystemExit(f"run {run_id} did not complete")
    return again - killed_at


def _owns(parent: int, pid: int) -> bool:
    if parent == pid:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pool", choices=["prefork", "threads"], default="prefork")
    args = parser.parse_args()

    url = fresh_database(args.pg, "agent_jobs_bench_recovery")
    server = RedisServer().start()
    broker = server.url(0)
    os.environ["AGENT_JOBS_DATABASE_URL"] = url
    store = Store.from_url(url)
    celery = celery_client(broker)
    settings = Settings(broker_url=broker, database_url=url)
    client = Client(store, apps.app, settings, CeleryDispatcher(celery))
    env = service_env(broker, url)
    env["PYTHONPATH"] = str(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    procs: list[Process] = [start_beat(env, tmp)]
    figures: dict[str, Any] = {}
    try:
        workers = [start_worker(env, concurrency=2, name="a", pool=args.pool)]
        procs.extend(workers)
        if args.pool == "prefork":
            figures["child"] = [
                one(client, "child", workers, args.timeout) for _ in range(args.repeat)
            ]
        figures["worker"] = []
        for i in range(args.repeat):
            spare = start_worker(env, concurrency=2, name=f"spare{i}", pool=args.pool)
            procs.append(spare)
            workers.append(spare)
            figures["worker"].append(one(client, "worker", workers, args.timeout))
    finally:
        for proc in procs:
            proc.kill()
        celery.close()
        store.engine.dispose()
        server.close()
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for kind, values in figures.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        median = statistics.median(values)
        print(f"{kind} killed: step ran again after {shown} s (median {median:.1f} s)")


if __name__ == "__main__":
    main()
