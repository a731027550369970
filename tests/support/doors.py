"""Helpers for the tests of the system's doors: outside clients, the listener, a cluster.

What posts messages or enqueues runs here does it the way another service would: a
subprocess that imports Celery or redis-py but never `agent_jobs`, or `redis-cli`.
Signatures are computed with the standard library alone, from the README's words
("Approvals on the Redis channel").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import select

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.settings import Settings
from agent_jobs.store import RunView, Store
from agent_jobs.store.schema import journal, runs, threads, tool_calls
from tests.support import apps
from tests.support.services import truncate_all
from tests.support.waiting import TIMEOUT, eventually, wait_status
from tests.support.workers import ROOT, Process, service_env, start_beat, worker

SECRET = "test-approval-secret-" + uuid.uuid4().hex
FAST_SWEEP = {
    "AGENT_JOBS_SWEEP_INTERVAL": "0.5",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "1",
}


@contextmanager
def claim_db(redis_url: str, db: int) -> Iterator[str]:
    """A database of the session's own `redis-server`, emptied, for as long as the
    block runs (each module of doors takes its own number)."""
    url = redis_url.rsplit("/", 1)[0] + f"/{db}"
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
        yield url
    finally:
        client.close()


@contextmanager
def open_doors(
    pg_url: str, redis_url: str, db: int, tmp: Path, **extra_env: str
) -> Iterator[Doors]:
    """A `Doors` on a Redis database of our own and the session's Postgres; every
    process it started is killed at the end."""
    saved = os.environ.get("AGENT_JOBS_DATABASE_URL")
    os.environ["AGENT_JOBS_DATABASE_URL"] = pg_url  # tests.apps records executions here
    try:
        with claim_db(redis_url, db) as broker:
            doors = Doors(broker, pg_url, tmp, **extra_env)
            try:
                doors.reset()
                yield doors
            finally:
                doors.close()
    finally:
        if saved is None:
            os.environ.pop("AGENT_JOBS_DATABASE_URL", None)
        else:
            os.environ["AGENT_JOBS_DATABASE_URL"] = saved


def canonical(message: dict[str, Any]) -> bytes:
    body = {k: v for k, v in message.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signed(message: dict[str, Any], secret: str = SECRET) -> dict[str, Any]:
    """The message with `sig`: hex HMAC-SHA256 of its canonical JSON (sorted keys,
    separators `(",", ":")`, UTF-8, non-ASCII characters unescaped)."""
    sig = hmac.new(secret.encode(), canonical(message), hashlib.sha256).hexdigest()
    return {**message, "sig": sig}


def approval(run_id: str, call_id: str, decision: str = "approve", **extra: Any) -> dict[str, Any]:
    return {
        "type": "approval",
        "run_id": run_id,
        "call_id": call_id,
        "decision": decision,
        "actor": "alice",
        **extra,
    }


def redis_cli(url: str, *args: str) -> str:
    """Run `redis-cli -u URL ARGS…`; returns its output."""
    done = subprocess.run(
        ["redis-cli", "-u", url, *args], capture_output=True, text=True, timeout=TIMEOUT, check=True
    )
    return done.stdout.strip()


# A client of another service: Celery alone, never agent_jobs.
_PLAIN_CLIENT = """
import json, sys
import celery
broker, sends = sys.argv[1], json.loads(sys.stdin.read())
app = celery.Celery(broker=broker)
ids = []
for send in sends:
    ids.append(app.send_task("agent_jobs.start_run", **send).id)
assert not [m for m in sys.modules if m.split(".")[0] in ("agent_jobs", "tasks")]
print(json.dumps(ids))
"""


def plain_celery_send(broker: str, sends: list[dict[str, Any]]) -> list[str]:
    """Send `agent_jobs.start_run` once per entry (`send_task` keyword arguments) from a
    process that never imports this project; returns the task ids."""
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_CLIENT, broker],
        input=json.dumps(sends),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ids: list[str] = json.loads(done.stdout)
    return ids


def wait_for(
    check: Callable[[], Any], what: str, timeout: float | None = None, every: float = 0.02
) -> Any:
    return eventually(check, timeout, what=what, every=every)


class Doors:
    """A worker, optionally beat, and the approvals listener on a broker of our own."""

    def __init__(self, broker: str, pg_url: str, tmp: Path, **extra_env: str) -> None:
        self.broker = broker
        self.pg_url = pg_url
        self.tmp = tmp
        self.channel = f"agent_jobs:approvals:{uuid.uuid4().hex[:8]}"
        self.env = service_env(
            broker,
            pg_url,
            AGENT_JOBS_APPROVALS_CHANNEL=self.channel,
            AGENT_JOBS_APPROVAL_SECRET=SECRET,
            **(FAST_SWEEP | extra_env),
        )
        self.procs: list[Process] = []
        self.listener: Process | None = None
        self.store = Store.from_url(pg_url)
        self.redis = redis.Redis.from_url(broker)
        self.celery = celery_client(broker)
        settings = Settings(broker_url=broker, database_url=pg_url)
        self.client = Client(self.store, apps.app, settings, CeleryDispatcher(self.celery))

    def reset(self) -> None:
        truncate_all(self.store)

    def worker(self, concurrency: int = 2, queues: str | None = "agent_jobs") -> Process:
        proc = worker(self.env, concurrency, "doors", queues)
        self.procs.append(proc.start(ready="ready."))
        return proc

    def beat(self) -> Process:
        proc = start_beat(self.env, self.tmp)
        self.procs.append(proc)
        return proc

    def start_listener(self, **extra_env: str) -> Process:
        args = [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen"]
        proc = Process(args, {**self.env, **extra_env}, "listener")
        self.listener = proc.start(ready="listening on channel")
        self.procs.append(proc)
        return proc

    def stop_listener(self) -> None:
        assert self.listener is not None
        self.listener.stop()
        self.listener = None

    def counters(self) -> dict[str, int]:
        raw: dict[bytes, bytes] = self.redis.hgetall(f"{self.channel}:counters")  # type: ignore[assignment]
        return {k.decode(): int(v) for k, v in raw.items()}

    def count(self, reason: str) -> int:
        return self.counters().get(reason, 0)

    def publish(self, payload: bytes | str | dict[str, Any]) -> int:
        data = json.dumps(payload) if isinstance(payload, dict) else payload
        return int(self.redis.publish(self.channel, data))  # type: ignore[arg-type]

    def xadd(self, payload: bytes | str | dict[str, Any], field: str = "message") -> str:
        data = json.dumps(payload) if isinstance(payload, dict) else payload
        entry = self.redis.xadd(self.channel, {field: data})
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def wait_status(self, run_id: str, status: str, timeout: float | None = None) -> RunView:
        return wait_status(
            self.store, run_id, status, timeout=timeout, strict=True, context=self.logs
        )

    def parked(self, agent: str = "gated") -> tuple[str, str]:
        """A run waiting for a decision on its one action call: (run id, call id)."""
        run_id = self.client.enqueue_run(agent, "go", actor="user-7")
        self.wait_status(run_id, "awaiting_approval")
        [call] = self.store.pending_calls(run_id)
        return run_id, str(call["call_id"])

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """Everything a decision on this run could change, to show that nothing did: once
        two reads in a row agree (a pass that parked the run may still be writing its last
        rows)."""
        last: list[dict[str, Any]] = [self._read(run_id)]

        def settled() -> dict[str, Any] | None:
            now = self._read(run_id)
            if now == last[0]:
                return now
            last[0] = now
            return None

        return eventually(settled, what=f"the store to settle around run {run_id}", every=0.2)

    def _read(self, run_id: str) -> dict[str, Any]:
        with self.store.connect() as conn:
            return {
                # This run's family in full; of the others only that they are there and no
                # new one: an earlier test's run may still be ending, which no decision on
                # this run changes. In a stated order: a row updated since comes back
                # elsewhere in an unordered scan.
                "runs": [
                    dict(r._mapping)
                    for r in conn.execute(
                        select(runs)
                        .where(
                            runs.c.root_run_id
                            == select(runs.c.root_run_id)
                            .where(runs.c.id == run_id)
                            .scalar_subquery()
                        )
                        .order_by(runs.c.id)
                    )
                ],
                "run_ids": conn.execute(select(runs.c.id).order_by(runs.c.id)).scalars().all(),
                "threads": conn.execute(select(threads.c.id).order_by(threads.c.id))
                .scalars()
                .all(),
                "calls": [
                    dict(r._mapping)
                    for r in conn.execute(
                        select(tool_calls)
                        .where(tool_calls.c.run_id == run_id)
                        .order_by(tool_calls.c.call_id)
                    )
                ],
                "journal": [
                    dict(r._mapping)
                    for r in conn.execute(
                        select(journal).where(journal.c.run_id == run_id).order_by(journal.c.seq)
                    )
                ],
            }

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.redis.delete(f"{self.channel}:counters", f"{self.channel}:dead", self.channel)
        self.redis.close()
        self.celery.close()
        self.store.engine.dispose()


def cli(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`agent-jobs ARGS…` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", *args],
        cwd=ROOT,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


__all__ = ["ROOT", "SECRET", "Doors", "approval", "service_env", "signed"]
