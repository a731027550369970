"""Per-process resources of a worker, built on first use after the fork."""

from __future__ import annotations

import logging
import os
import sys
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import redis
from celery import Celery, Task, current_app
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from agent_jobs import startup
from agent_jobs.dispatch import START_RUN, CeleryDispatcher
from agent_jobs.errors import ConfigurationError
from agent_jobs.leases import Leases, beat_client
from agent_jobs.loading import load_app
from agent_jobs.observability import metrics, scrape, tracing
from agent_jobs.runners.durable import DurableRunner, Liveness, give_up, recover_process
from agent_jobs.settings import Settings, get_settings
from agent_jobs.store import Store
from agent_jobs.streams.redis_streams import RedisStreams

from .app import DEFAULT_BROKER
from .events import ChainEvents
from .watchdog import Watchdog, limits

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    runner: DurableRunner


_lock = threading.Lock()
_runtime: Runtime | None = None
_pid: int | None = None


def runtime(celery: Celery) -> Runtime:
    """The process's runner; rebuilt in a forked child so no connection is shared."""
    global _runtime, _pid
    with _lock:
        if _runtime is None or _pid != os.getpid():
            settings = get_settings()
            redis_url = settings.effective_redis_url or DEFAULT_BROKER
            # Leases and live frames: a Redis that is down must cost a step little time
            # (redis-py's default retries wait up to ~10 s on every call).
            redis_client = redis.Redis.from_url(
                redis_url,
                socket_connect_timeout=2,
                socket_timeout=10,
                retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 2),
                health_check_interval=30,
                max_connections=redis_pool_size(),
            )
            runner = DurableRunner(
                load_app(settings.app),
                Store.from_url(
                    settings.database_url, auto_upgrade=False, pool_size=db_pool_size(settings)
                ),
                CeleryDispatcher(celery),
                RedisStreams(redis_client, maxlen=settings.stream_maxlen, ttl=settings.stream_ttl),
                settings,
                Leases(redis_client),
            )
            runner.eager_events = ChainEvents(celery)
            # This process's beat: if it dies, another process sends its steps again.
            recover = partial(recover_process, runner.store, runner.leases, runner.dispatcher)
            # Beats over a client of their own, whose calls fail fast in a cut.
            # Every task notes its run there too: as many connections as the runtime's.
            beats = Leases(
                beat_client(redis_url, settings.process_timeout, max_connections=redis_pool_size())
            )
            runner.liveness = Liveness(beats, recover, settings.process_timeout)
            runner.liveness.start()
            # Notifications this process (or another) wrote, to Redis and the webhook;
            # diagnostics; tracing, after the app (it may have set OpenTelemetry up).
            startup.start(runner.store, settings, redis_client=redis_client)
            log.info(
                "agent-jobs runner ready in process %d: up to %d database connections, "
                "%d Redis connections (and %d for its beats and the runs its tasks hold)",
                os.getpid(),
                runner.store.engine.pool.size(),  # type: ignore[attr-defined]
                redis_client.connection_pool.max_connections,
                beats.client.connection_pool.max_connections,
            )
            _runtime, _pid = Runtime(settings, runner), os.getpid()
        return _runtime


# The worker's pool and concurrency, as its main process started them (`worker_init`).
_pool: tuple[str, int] | None = None
_IN_PROCESS_POOLS = ("thread", "gevent", "eventlet")  # the modules of the pools


@worker_init.connect
def _note_pool(sender: object = None, **_: object) -> None:
    global _pool
    pool_cls = getattr(sender, "pool_cls", None)
    name = getattr(pool_cls, "__module__", "").rsplit(".", 1)[-1]
    _pool = (name, int(getattr(sender, "concurrency", 0) or 0))


# Metrics and traces, as the settings say (agent_jobs/observability/).
_metrics_dir: str | None = None  # the prefork worker's own directory, removed as it stops


@worker_init.connect
def _observe(**_: object) -> None:
    """The worker's main process, before its pool forks: metrics on (a prefork pool's
    processes each count in files of a directory of the worker's own, which this process
    sums for a scrape) and their port taken. A missing extra or a port in use ends the
    start with one line."""
    global _metrics_dir
    settings = get_settings()
    try:
        if settings.metrics_port is None:
            return
        directory = None
        if _pool is not None and _pool[0] == "prefork":
            directory, own = scrape.multiprocess_dir()
            _metrics_dir = directory if own else None
        metrics.setup(settings, multiprocess_dir=directory)
        metrics.bind(settings)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


@worker_init.connect
def _check(**_: object) -> None:
    """Settings the worker could not run with (a webhook without a secret, tracing
    without its extra) stop the start with one line."""
    try:
        startup.check(get_settings())
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


@worker_ready.connect
def _serve_metrics(**_: object) -> None:
    """Scrapes are answered by the main process, once its pool has forked."""
    metrics.start_serving()


@worker_shutdown.connect
def _stop_metrics(**_: object) -> None:
    metrics.close()
    tracing.flush()
    if _metrics_dir is not None:
        scrape.remove_dir(_metrics_dir)


@worker_process_shutdown.connect
def _flush_spans(**_: object) -> None:
    tracing.flush()  # a pool process's buffered spans, before it exits


# A `start_run` task runs in the trace context its message headers carry (put there by
# the sender's OpenTelemetry Celery instrumentation, or by hand): the run keeps it.
_incoming = threading.local()


@task_prerun.connect
def _trace_context(task: Task | None = None, **_: object) -> None:  # type: ignore[type-arg]
    if tracing.enabled() and task is not None and task.name == START_RUN:
        stack = ExitStack()
        stack.enter_context(tracing.extracted(tracing.task_headers(task.request)))
        _incoming.stack = stack


@task_postrun.connect
def _trace_context_ends(**_: object) -> None:
    stack: ExitStack | None = getattr(_incoming, "stack", None)
    if stack is not None:
        _incoming.stack = None
        stack.close()


# A task holds a connection only while a pass commits (milliseconds) and waits on the
# model or the tool without one, so a large threads or gevent pool shares a bounded set:
# Postgres allows 100 connections by default.
MAX_DB_POOL = 20


def db_pool_size(settings: Settings) -> int:
    """Connections to keep: the setting; else one per task a threads or gevent pool runs
    at once, up to `MAX_DB_POOL`, and two for the heartbeat; else 5."""
    if settings.db_pool_size is not None:
        return settings.db_pool_size
    if _pool is not None and _pool[0] in _IN_PROCESS_POOLS and _pool[1] > 0:
        return min(_pool[1], MAX_DB_POOL) + 2
    return 5


def redis_pool_size() -> int:
    """Redis connections a process may open at once: one for each task a threads or
    gevent pool runs at once and some for its beats (redis-py 8 refuses more than 100 by
    default, which failed steps of a threads pool of 200 with "Too many connections");
    else redis-py's 100."""
    if _pool is not None and _pool[0] in _IN_PROCESS_POOLS and _pool[1] > 0:
        return max(100, _pool[1] + 16)
    return 100


# Celery enforces no time limit on a threads pool: this does (tasks/watchdog.py).
_watchdog: Watchdog | None = None


def watchdog() -> Watchdog:
    global _watchdog
    if _watchdog is not None:
        return _watchdog
    runner = runtime(current_app).runner
    with _lock:
        if _watchdog is None:
            _watchdog = Watchdog(partial(give_up, runner.store, runner.leases, runner.dispatcher))
        return _watchdog


@task_prerun.connect
def _watch(task_id: str = "", task: Task | None = None, **_: object) -> None:  # type: ignore[type-arg]
    if _pool is not None and _pool[0] == "thread" and task is not None:
        watchdog().watch(task_id, *limits(task))


@task_postrun.connect
def _task_ended(**_: object) -> None:
    """A task has ended: Flower hears of the last step of its chain now, and the
    watchdog lets it go."""
    current = _runtime
    if current is not None and isinstance(current.runner.eager_events, ChainEvents):
        current.runner.eager_events.flush()
    if _watchdog is not None:
        _watchdog.unwatch()


@worker_process_init.connect
def _warm(**_: object) -> None:
    """Build the runner as each worker process starts, not on its first task."""
    runtime(current_app)


@worker_ready.connect
def _warm_in_process(**_: object) -> None:
    """A threads or gevent worker is its one process: build its runner (and start its
    beat, which at once recovers the processes of this machine that died) as it starts."""
    if _pool is not None and _pool[0] in _IN_PROCESS_POOLS:
        runtime(current_app)
