"""Workers and beat of a test's own, on a broker of its own: for tests that kill them."""

from __future__ import annotations

from pathlib import Path

from agent_jobs import RunView
from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from tests.support import apps
from tests.support.redis_server import RedisServer
from tests.support.services import SESSION_QUEUE, truncate_all
from tests.support.waiting import eventually
from tests.support.workers import DEFAULT_QUEUES, Process, service_env, start_beat, start_worker

FAST_RECOVERY = {
    "AGENT_JOBS_STEP_LEASE": "1.5",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "1",
    "AGENT_JOBS_SWEEP_INTERVAL": "0.5",
}


class Cluster:
    """Workers and beat of our own on a broker of our own, started and killed at will."""

    def __init__(self, redis: RedisServer, pg_url: str, tmp: Path) -> None:
        self.redis = redis
        self.broker = redis.url(0)
        self.pg_url = pg_url
        self.tmp = tmp
        self.procs: list[Process] = []
        self.store = Store.from_url(pg_url)
        truncate_all(self.store)
        self.celery = celery_client(self.broker, SESSION_QUEUE)
        settings = Settings(broker_url=self.broker, database_url=pg_url, queue=SESSION_QUEUE)
        self.client = Client(self.store, apps.app, settings, CeleryDispatcher(self.celery))

    def env(self, **extra: str) -> dict[str, str]:
        env = FAST_RECOVERY | {"AGENT_JOBS_QUEUE": SESSION_QUEUE} | extra
        return service_env(self.broker, self.pg_url, **env)

    def worker(
        self,
        concurrency: int = 2,
        queues: str | None = DEFAULT_QUEUES,
        pool: str | None = None,
        restart: bool = False,
        **extra: str,
    ) -> Process:
        """A worker of the cluster; with `restart`, started again whenever it dies."""
        proc = start_worker(
            self.env(**extra), concurrency=concurrency, queues=queues, pool=pool, restart=restart
        )
        self.procs.append(proc)
        return proc

    def beat(self) -> Process:
        proc = start_beat(self.env(), self.tmp)
        self.procs.append(proc)
        return proc

    def step_state(self, run_id: str, step: str) -> str | None:
        row = {j["step"]: j for j in self.store.journal(run_id)}.get(step)
        return row["state"] if row else None

    def wait_step(self, run_id: str, step: str, state: str, timeout: float | None = None) -> None:
        eventually(
            lambda: self.step_state(run_id, step) == state,
            timeout,
            what=f"{step} of {run_id} to be {state}",
            context=lambda: self.store.journal(run_id),
        )

    def wait(self, run_id: str, timeout: float | None = None) -> RunView:
        return eventually(
            lambda: (run := self.store.get_run(run_id)).finished and run,
            timeout,
            what=f"run {run_id} to end",
            every=0.05,
            context=self.logs,
        )

    def logs(self) -> str:
        return "\n".join(p.log()[-3000:] for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.celery.close()
        self.store.engine.dispose()
