"""The Celery app factory: JSON only, acks late, no result backend, events for Flower."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import beat_init
from kombu import Exchange, Queue

from agent_jobs.dispatch import SWEEP, routing_config
from agent_jobs.loading import load_app
from agent_jobs.retention import PRUNE
from agent_jobs.runners.durable import TIMERS
from agent_jobs.schedules.tick import TASK as SCHEDULES
from agent_jobs.settings import Settings, get_settings
from agent_jobs.transport import transport_for, transport_options

from . import logs
from .reaper import ReapDeadProcesses

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"


def create_app(settings: Settings | None = None) -> Celery:
    """Build the worker's Celery app. Opens no connection: that waits for the worker."""
    settings = settings or get_settings()
    logs.install()
    broker = settings.broker_url or DEFAULT_BROKER
    app = Celery("agent_jobs", broker=broker, set_as_current=True)
    if (transport := transport_for(broker)) is not None:
        app.conf.broker_transport = transport  # kombu's, guarded against a worker crash
    # A task may run a chain of steps (see DurableRunner._chain): it starts no step after
    # `eager_budget` seconds, so one more step always fits in its limit.
    hard_limit = settings.step_time_limit + (settings.eager_budget if settings.eager_steps else 0)
    # JSON only (nothing that crosses the broker can execute code when decoded), one
    # queue on the anonymous exchange; and the queue plain Celery clients send to.
    app.conf.update(routing_config(settings.queue))
    if settings.external_queue and settings.external_queue != settings.queue:
        external = settings.external_queue
        app.conf.task_queues = [
            *app.conf.task_queues,
            Queue(external, Exchange(external, type="direct"), routing_key=external),
        ]
    app.conf.update(
        # The journal is the truth: no result backend, no result on the hot path.
        result_backend=None,
        task_store_errors_even_if_ignored=False,
        # A task is acknowledged when it ends, and requeued if its worker dies.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Celery waits this long for the result of a pool process that died before it
        # hands the message back; ours is in Postgres already, or never came.
        worker_lost_wait=1.0,
        worker_prefetch_multiplier=1,
        # A step that runs when the broker connection drops goes on to its end: its
        # result goes to Postgres, its lease is kept (and taken back if Redis lost it),
        # and a duplicate delivery finds the lease. Cancelling it would throw the work
        # away and leave the step to the sweep, its message gone with a restarted Redis.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_time_limit=hard_limit,
        task_soft_time_limit=max(1.0, hard_limit - 5),
        # Redis hands an unacknowledged message to another worker after this long; it
        # must outlast the longest step, or a slow step would run twice.
        # A half-open broker connection is dropped in seconds (agent_jobs/transport.py).
        # An idle worker waits for messages on the deployment's queue (agent_jobs/transport.py).
        broker_transport_options=transport_options(
            visibility_timeout=int(hard_limit * 2 + 60), fetch_wait_queue=settings.queue
        ),
        # Operators watch Flower: workers send task events (received, started,
        # succeeded). No "sent" event: it would cost a publish on every enqueue.
        worker_send_task_events=True,
        task_send_sent_event=False,
        task_track_started=True,
        worker_hijack_root_logger=False,
        # Reconnects to the broker at most a second apart (kombu's: up to 30 s).
        worker_consumer="tasks.consumer:Consumer",
        beat_schedule={
            "agent-jobs-sweep": {"task": SWEEP, "schedule": settings.sweep_interval},
            # Sleeping runs whose time comes before the next tick (agent_jobs/timers.py).
            "agent-jobs-timers": {"task": TIMERS, "schedule": settings.timer_interval},
        },
    )
    if settings.prune_after_days is not None:  # retention is off unless asked for
        app.conf.beat_schedule["agent-jobs-prune"] = {
            "task": PRUNE,
            "schedule": settings.prune_interval,
        }
    app.steps["worker"].add(ReapDeadProcesses)
    app.autodiscover_tasks(["tasks"], related_name="steps", force=True)
    return app


def schedules_entry(settings: Settings) -> dict[str, Any]:
    """Beat's entry for the schedules' tick (agent_jobs/schedules/tick.py). Exactly once
    per occurrence is kept by Postgres, so two beats may run; a tick nobody took in time
    is dropped, the next one doing its work."""
    return {
        "task": SCHEDULES,
        "schedule": settings.schedule_interval,
        "options": {"expires": max(10.0, settings.schedule_interval * 5)},
    }


@beat_init.connect
def _tick_schedules(sender: Any = None, **_: Any) -> None:
    """Beat ticks the schedules only for an app that defines some: a deployment without
    them pays no message a second."""
    settings = get_settings()
    if sender is not None and load_app(settings.app).schedules:
        sender.scheduler.update_from_dict({"agent-jobs-schedules": schedules_entry(settings)})
