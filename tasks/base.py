"""The base of every agent-jobs task: how its messages are received and its requests run."""

from __future__ import annotations

import threading

import redis
from celery import Task
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agent_jobs.settings import get_settings

_lock = threading.Lock()
_client: redis.Redis | None = None


def main_redis() -> redis.Redis:
    """Redis for the worker's main process, whose event loop must never wait long on it
    (refused messages kept aside, a dead pool process's leases released)."""
    global _client
    with _lock:
        if _client is None:
            url = get_settings().effective_redis_url or "redis://127.0.0.1:6379/0"
            _client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        return _client


class AgentJobsTask(Task):  # type: ignore[type-arg]
    """A task whose malformed messages are refused (tasks.strategy), and whose lease
    goes with a pool process that dies running it (tasks.requests)."""

    Strategy = "tasks.strategy:guarded"
    Request = "tasks.requests:StepRequest"
    # A database connection that died is dropped from the pool when it fails, and a
    # pool with no free connection for a while is busy: the task is tried again shortly
    # (every task here is safe to repeat).
    autoretry_for = (OperationalError, InterfaceError, PoolTimeout)
    retry_backoff = 1
    max_retries = 8
