"""How the durable runner reaches Celery: by task name, JSON only, never importing `tasks`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from celery import Celery, group
from kombu import Exchange, Queue

START_RUN = "agent_jobs.start_run"
COORDINATE = "agent_jobs.coordinate"
MODEL_TURN = "agent_jobs.model_turn"
INVOKE_TOOL = "agent_jobs.invoke_tool"
SWEEP = "agent_jobs.sweep"
QUEUE = "agent_jobs"


def task_queues(queue: str) -> list[Queue]:
    """The queue every task goes to, on the anonymous exchange.

    Routing by queue name needs no binding kept in Redis, so a broker that lost
    everything (restarted empty, FLUSHALL) still delivers the sweep's re-drives.
    """
    return [Queue(queue, Exchange("", type="direct"), routing_key=queue)]


def routing_config(queue: str | None = None) -> dict[str, Any]:
    """Serialisation and routing settings every Celery app of this project shares.

    `queue` defaults to `AGENT_JOBS_QUEUE`.
    """
    if queue is None:
        from .settings import get_settings

        queue = get_settings().queue
    return {
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "event_serializer": "json",
        "task_queues": task_queues(queue),
        "task_default_queue": queue,
        "task_default_exchange": "",
        "task_default_routing_key": queue,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
    }


class Dispatcher(Protocol):
    """Enqueues work; called only after the transaction that scheduled it committed."""

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None: ...

    def steps(self, run_id: str, steps: Sequence[tuple[str, str]]) -> None:
        """Enqueue remote steps given as (task name, step name); several go as one group."""
        ...


def celery_client(broker_url: str, queue: str | None = None) -> Celery:
    """A Celery app that only sends: JSON only, no result backend."""
    client = Celery("agent_jobs_client", broker=broker_url, set_as_current=False)
    client.conf.update(routing_config(queue))
    return client


class CeleryDispatcher:
    """Sends tasks by name with `(run_id, step)` alone: the journal holds the rest."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery
        self.queue: str = celery.conf.task_default_queue or QUEUE

    def coordinate(self, run_id: str, *, countdown: float | None = None) -> None:
        self.celery.send_task(COORDINATE, args=[run_id], queue=self.queue, countdown=countdown)

    def steps(self, run_id: str, steps: Sequence[tuple[str, str]]) -> None:
        if not steps:
            return
        if len(steps) == 1:
            task, step = steps[0]
            self.celery.send_task(task, args=[run_id, step], queue=self.queue)
            return
        # A fan-out of reads: one group, every member re-drives the run when it ends.
        # No chord: the coordinator itself notices when all have settled.
        signatures: list[Any] = [
            self.celery.signature(task, args=[run_id, step], queue=self.queue)
            for task, step in steps
        ]
        group(signatures).apply_async()

    def start_run(self, kwargs: dict[str, Any], *, task_id: str | None = None) -> str:
        result = self.celery.send_task(START_RUN, kwargs=kwargs, task_id=task_id, queue=self.queue)
        return str(result.id)
