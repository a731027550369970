"""The base of every agent-jobs task: how its messages are received and its requests run."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import redis
from celery import Task
from celery.exceptions import Reject
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agent_jobs.dispatch import BROKER_ERRORS
from agent_jobs.settings import get_settings

log = logging.getLogger(__name__)

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

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's retry, except that a retry the broker cannot take now is not dropped.

        Celery 5.7 publishes a retry as a new message and, when that publish fails, rejects
        the message it was running without requeueing it: a `start_run` whose database
        and broker were both cut off (a host cut off from the network) was lost so. Here
        the publish is tried again, half a second then up to five seconds apart, until the
        broker takes it, for as long as the task may run (its time limit ends it; then
        its message, unacknowledged, comes back).
        """
        for attempt in itertools.count():
            try:
                return super().retry(*args, **kwargs)
            except Reject as refused:
                reason = refused.args[0] if refused.args else None
                if not isinstance(reason, BROKER_ERRORS):
                    raise
                log.warning(
                    "task %s[%s]: the broker refused its retry (%s); trying again",
                    self.name,
                    self.request.id,
                    reason,
                )
                time.sleep(min(5.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover
