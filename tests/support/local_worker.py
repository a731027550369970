"""The durable runner driven in the test's own process: the `durable-local` harness.

The same DurableRunner the workers build (replay against the Postgres journal, leases and
live frames in Redis, the fast path's chains) with a dispatcher that hands each task to a
pool of threads here instead of sending it through the broker. What a task adapter
(tasks/steps.py) does around the runner is done the same way: a step's `RetryLater` or
`Deferred` comes back after its delay, a database error is tried again with Celery's
backoff. What it leaves out is what only the real-worker layer can test: the broker,
Celery's pools, process deaths and the sweep.

It makes the middle loop (`-m "unit or processes or services"`) cover the durable runner on every
scenario of the `harness` fixture in seconds, without a worker subprocess.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agent_jobs import AgentApp
from agent_jobs.dispatch import MODEL_TURN, own_queue
from agent_jobs.errors import Deferred, RetryLater
from agent_jobs.leases import Leases
from agent_jobs.runners.durable.runner import DurableRunner
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from agent_jobs.streams.redis_streams import RedisStreams

log = logging.getLogger(__name__)

# tasks/base.py's AgentJobsTask: retried on these, 2**n seconds apart, up to 8 times.
DATABASE_ERRORS = (OperationalError, InterfaceError, PoolTimeout)
MAX_RETRIES = 8


class LocalDispatcher:
    """A Dispatcher whose tasks run on this process's threads."""

    def __init__(self, threads: int = 8) -> None:
        self.runner: DurableRunner | None = None
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="durable-local")
        self.errors: list[BaseException] = []
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._busy = 0  # tasks submitted and not yet ended

    # --- the Dispatcher protocol --------------------------------------------------------

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        self._later(countdown, lambda: self._coordinate(run_id))

    def steps(
        self,
        run_id: str,
        steps: Sequence[tuple[str, str]],
        *,
        countdown: float | None = None,
        tools: Mapping[str, str] | None = None,
    ) -> None:
        for name, step in steps:
            task, _queue = own_queue(name)
            self._later(countdown, lambda t=task, s=step: self._step(run_id, t, s, 0, 0))

    # --- the task adapters ----------------------------------------------------------------

    def _coordinate(self, run_id: str, failures: int = 0) -> None:
        assert self.runner is not None
        try:
            self.runner.continue_run(run_id)
        except DATABASE_ERRORS as exc:
            self._retry(exc, failures, lambda: self._coordinate(run_id, failures + 1))

    def _step(self, run_id: str, task: str, step: str, retries: int, failures: int) -> None:
        assert self.runner is not None
        try:
            if task == MODEL_TURN:
                self.runner.execute_step(run_id, step, task=task, retries=retries)
            else:
                self.runner.execute_step(run_id, step, task=task)
        except Deferred as later:  # no attempt made: the count stays
            self._later(later.delay, lambda: self._step(run_id, task, step, retries, 0))
        except RetryLater as later:
            self._later(later.delay, lambda: self._step(run_id, task, step, retries + 1, 0))
        except DATABASE_ERRORS as exc:
            again = failures + 1
            self._retry(exc, failures, lambda: self._step(run_id, task, step, retries, again))

    def _retry(self, exc: BaseException, failures: int, again: Callable[[], None]) -> None:
        if failures >= MAX_RETRIES:
            self.errors.append(exc)
            return
        log.warning("durable-local: database error, tried again: %s", exc)
        self._later(float(2**failures), again)

    # --- running --------------------------------------------------------------------------

    def _later(self, delay: float | None, job: Callable[[], None]) -> None:
        if delay:
            timer = threading.Timer(delay, lambda: self._submit(job))
            timer.daemon = True
            with self._lock:
                if self._closed:
                    return
                self._timers.add(timer)
            timer.start()
        else:
            self._submit(job)

    def _submit(self, job: Callable[[], None]) -> None:
        def run() -> None:
            try:
                job()
            except BaseException as exc:  # a task that raised: the test fails for it
                log.exception("durable-local: a task raised")
                self.errors.append(exc)
            finally:
                with self._lock:
                    self._busy -= 1

        with self._lock:
            if self._closed:
                return
            self._busy += 1
            self.pool.submit(run)

    def idle(self) -> bool:
        """No task is waiting for a thread or running (one due later may be waiting for
        its moment): every pass sent so far has ended, as a worker's log would say."""
        with self._lock:
            return self._busy == 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)


def local_runner(
    app: AgentApp, store: Store, redis_url: str, settings: Settings
) -> tuple[DurableRunner, LocalDispatcher, RedisStreams]:
    """A DurableRunner on `store` and the Redis at `redis_url`, its tasks run here."""
    import redis

    client: Any = redis.Redis.from_url(redis_url)
    streams = RedisStreams(client, maxlen=settings.stream_maxlen, ttl=settings.stream_ttl)
    dispatcher = LocalDispatcher()
    runner = DurableRunner(app, store, dispatcher, streams, settings, Leases(client))
    dispatcher.runner = runner
    return runner, dispatcher, streams
