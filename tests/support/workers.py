"""Real Celery workers (and beat) as subprocesses, killable with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from tests.support import encryption as test_encryption
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def service_env(broker_url: str, database_url: str, **extra: str) -> dict[str, str]:
    env = test_encryption.bare_environ()
    env.update(
        AGENT_JOBS_BROKER_URL=broker_url,
        AGENT_JOBS_DATABASE_URL=database_url,
        AGENT_JOBS_APP="tests.support.apps:app",
        PYTHONPATH=str(ROOT),
        # One idle connection a pool process keeps: three test processes, each with
        # workers of eight, stay inside Postgres's 100 connections.
        AGENT_JOBS_DB_POOL_SIZE="1",
    )
    env.update(test_encryption.env())
    env.update(extra)
    # An empty value unsets a setting: the worker then sizes it as a user's would.
    return {k: v for k, v in env.items() if v or not k.startswith("AGENT_JOBS_")}


class Process:
    """A subprocess in its own process group, its output in a log file. With `restart`,
    it is started again whenever it dies on its own (as compose's `restart:` or systemd
    would), until the test kills or stops it."""

    def __init__(
        self, args: list[str], env: dict[str, str], name: str, *, restart: bool = False
    ) -> None:
        self.args = args
        self.env = env
        self.name = name
        handle, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        os.close(handle)
        self.log_path = Path(path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart = restart
        self.restarts = 0
        self._ended = threading.Event()

    def _spawn(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _supervise(self) -> None:
        while not self._ended.wait(0.1):
            if self.proc is not None and self.proc.poll() is not None and not self._ended.is_set():
                self.restarts += 1
                self._spawn()

    def start(self, ready: str | None = None, timeout: float | None = None) -> Process:
        self._spawn()
        assert self.proc is not None
        proc = self.proc
        if self.restart:
            threading.Thread(target=self._supervise, daemon=True).start()
        if ready is not None:

            def up() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited early:\n{self.log()}")
                return ready in self.log()

            eventually(
                up, timeout, what=f"{self.name} to log {ready!r}", every=0.05, context=self.log
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, no acknowledgements."""
        self._ended.set()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM to the main process, as `docker compose stop` sends it: a worker's
        warm shutdown lets its running tasks finish. Killed if it takes too long."""
        self._ended.set()
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


DEFAULT_QUEUES = "from the environment"


# The pools the tests' workers run on, each test that starts workers once on each
# (conftest's `worker_pool`); `TEST_WORKER_POOL=threads` runs them on that pool alone.
_ONE_POOL = os.environ.get("TEST_WORKER_POOL")
TEST_POOLS: tuple[str, ...] = (_ONE_POOL,) if _ONE_POOL else ("prefork", "threads")
_pool = TEST_POOLS[0]


def use_pool(pool: str) -> None:
    """The pool of the workers started from now on that name none."""
    global _pool
    _pool = pool


def worker(
    env: dict[str, str],
    concurrency: int = 2,
    name: str = "worker",
    queues: str | None = DEFAULT_QUEUES,
    pool: str | None = None,
    restart: bool = False,
) -> Process:
    """A worker process (not started), on Celery's `pool`. `queues=None` leaves Celery's
    choice: every queue the app declares."""
    if queues == DEFAULT_QUEUES:
        queues = env.get("AGENT_JOBS_QUEUE", "agent_jobs")
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks",
        "worker",
        "--loglevel=INFO",
        f"--concurrency={concurrency}",
        f"--pool={pool or _pool}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        f"--hostname={name}-{uuid.uuid4().hex[:6]}@%h",
    ]
    return Process([*args, f"--queues={queues}"] if queues else args, env, name, restart=restart)


def start_worker(
    env: dict[str, str],
    concurrency: int = 2,
    name: str = "worker",
    queues: str | None = DEFAULT_QUEUES,
    pool: str | None = None,
    restart: bool = False,
) -> Process:
    return worker(env, concurrency, name, queues, pool, restart).start(ready="ready.")


def start_beat(env: dict[str, str], tmp: Path) -> Process:
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks",
        "beat",
        "--loglevel=INFO",
        f"--schedule={tmp / 'beat-schedule'}",
        f"--pidfile={tmp / 'beat.pid'}",
    ]
    return Process(args, env, "beat").start(ready="beat: Starting")
