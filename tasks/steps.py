"""The task adapters: each takes ids, loads state from Postgres, calls the runner.

What each returns is what Flower shows as its result, in a few words: where the run
stands (`waiting tool:call_3, tool:call_4`, `awaiting_approval refund call_3`), after a
step what became of it (`done → completed`). A task whose work was refused or failed
(a bad `start_run`, a step that failed, a step given up on) fails with the reason once
that work is committed: `TaskFailed`, which Celery logs without a traceback, does not
retry, and acknowledges.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Retry

from agent_jobs import retention
from agent_jobs.dispatch import COORDINATE, INVOKE_TOOL, MODEL_TURN, START_RUN, SWEEP
from agent_jobs.errors import AgentJobsError, Deferred, RetryLater
from agent_jobs.runners.durable import TIMERS, StepOutcome, summary, where
from agent_jobs.runs import RunRequest
from agent_jobs.schedules import tick as schedule_tick
from agent_jobs.streams.redis_streams import RedisStreams

from .base import AgentJobsTask
from .events import ChainEvents
from .runtime import runtime


class TaskFailed(AgentJobsError):
    """A task's work is done and committed, and was refused or failed: the task shows
    as failed in Flower, with the reason."""

    def __repr__(self) -> str:
        # What Celery sends Flower as the task's exception: the reason, as it reads.
        return str(self)


# `TaskFailed` is expected (`throws`): logged at INFO without a traceback, never retried
# (only the database errors of `AgentJobsTask.autoretry_for` are), its message
# acknowledged. Acks are late: Celery acknowledges a failed task's message by default
# (`task_acks_on_failure_or_timeout`); pinned here, as a redelivery could only fail again.
# A worker that dies mid-task still hands the message back (`task_reject_on_worker_lost`).
FAILS: dict[str, Any] = {"throws": (TaskFailed,), "acks_on_failure_or_timeout": True}


def _reported(outcome: str) -> str:
    """The result of a step task: its summary, or `TaskFailed` if the step failed."""
    if isinstance(outcome, StepOutcome) and outcome.failed:
        raise TaskFailed(outcome.summary)
    return summary(outcome)


@shared_task(base=AgentJobsTask, name=START_RUN, bind=True, **FAILS)
def start_run(self: Task[Any, str], /, *args: Any, **kwargs: Any) -> str:
    """Start a run from the keyword arguments another service sent; without a `run_id`,
    the run is named after this task (docs/doors.md, "Enqueueing runs from other services")."""
    if args:
        raise TaskFailed(
            "refused: agent_jobs.start_run takes keyword arguments only (send them as kwargs)"
        )
    runner = runtime(self.app).runner
    try:
        request = RunRequest.parse(kwargs)
        run_id = request.run_id or str(self.request.id)
        runner.create(request, run_id)
    except AgentJobsError as exc:
        # A bad request is refused, recorded nowhere, and not retried.
        raise TaskFailed(f"refused: {exc}") from None
    return where(runner.continue_run(run_id))


@shared_task(base=AgentJobsTask, name=COORDINATE, bind=True)
def coordinate(self: Task[Any, str], run_id: str) -> str:
    """Re-drive a run: replay its journal, schedule what is missing, suspend."""
    return where(runtime(self.app).runner.continue_run(run_id))


@shared_task(base=AgentJobsTask, name=MODEL_TURN, bind=True, **FAILS)
def model_turn(self: Task[Any, str], run_id: str, step: str) -> str:
    """Call the model for one step of a run, streaming its text to the run's stream."""
    runner = runtime(self.app).runner
    try:
        outcome = runner.execute_step(run_id, step, task=MODEL_TURN, retries=self.request.retries)
    except Deferred as later:
        raise _deferred(self, later) from None
    except RetryLater as later:
        # The request-error waterfall asked for a retry: Celery's countdown waits, no
        # worker sleeps.
        raise self.retry(countdown=later.delay, max_retries=None) from None
    return _reported(outcome)


def _deferred(task: Task[Any, str], later: Deferred) -> Retry:
    """A model step waits for capacity under its provider's rate limit: the task is sent
    again for then, and shows as retried. Not as a retry of Celery's: its count, which the
    request-error waterfall and the step's attempts go by, stays as it was."""
    again = task.signature_from_request(
        task.request, countdown=later.delay, retries=task.request.retries
    )
    again.apply_async()
    return Retry(str(later), sig=again)


@shared_task(base=AgentJobsTask, name=INVOKE_TOOL, bind=True, **FAILS)
def invoke_tool(self: Task[Any, str], run_id: str, step: str) -> str:
    """Invoke one tool call of a run."""
    return _reported(runtime(self.app).runner.execute_step(run_id, step, task=INVOKE_TOOL))


# Beat runs the sweep every 30 s: 2,880 tasks a day that mostly find nothing would crowd
# Flower's list. It sends no task events; one that re-drove runs sends them itself.
@shared_task(base=AgentJobsTask, name=SWEEP, bind=True, send_events=False)
def sweep(self: Task[Any, str]) -> str:
    """Re-drive runs that made no progress for a while (Celery beat runs this)."""
    received, started = time.time(), time.monotonic()
    runner = runtime(self.app).runner
    count = runner.sweep()
    result = f"re-drove {count} runs"
    if count and isinstance(runner.eager_events, ChainEvents):
        took = time.monotonic() - started
        runner.eager_events.task_ran(
            SWEEP, str(self.request.id), result, received=received, runtime=took
        )
    return result


# Beat runs the timers tick every AGENT_JOBS_TIMER_INTERVAL seconds (1 s): like the sweep,
# it shows in Flower only when it woke a sleeping run.
@shared_task(base=AgentJobsTask, name=TIMERS, bind=True, send_events=False)
def timers(self: Task[Any, str]) -> str:
    """Send the sleeping runs whose time comes before the next tick a pass due at their
    time (Celery beat runs this)."""
    received, started = time.time(), time.monotonic()
    runner = runtime(self.app).runner
    count = runner.wake_sleepers()
    result = f"woke {count} sleeping runs"
    if count and isinstance(runner.eager_events, ChainEvents):
        took = time.monotonic() - started
        runner.eager_events.task_ran(
            TIMERS, str(self.request.id), result, received=received, runtime=took
        )
    return result


# Beat runs the prune every AGENT_JOBS_PRUNE_INTERVAL seconds; like the sweep, it shows in
# Flower only when it pruned something.
@shared_task(base=AgentJobsTask, name=retention.PRUNE, bind=True, send_events=False)
def prune(self: Task[Any, str]) -> str:
    """Prune the runs that ended AGENT_JOBS_PRUNE_AFTER_DAYS days ago (Celery beat runs
    this). It starts no batch after half a step's time limit: the next prune goes on."""
    received, started = time.time(), time.monotonic()
    current = runtime(self.app)
    settings, runner = current.settings, current.runner
    if settings.prune_after_days is None:
        return "off: AGENT_JOBS_PRUNE_AFTER_DAYS is not set"
    streams = runner.streams
    report = retention.prune(
        runner.store,
        older_than=settings.prune_after_days,
        batch=settings.prune_batch,
        rest=settings.prune_rest,
        redis_client=streams.client if isinstance(streams, RedisStreams) else None,
        budget=settings.step_time_limit / 2,
    )
    result = report.summary()
    if (report.runs or report.outbox) and isinstance(runner.eager_events, ChainEvents):
        took = time.monotonic() - started
        runner.eager_events.task_ran(
            retention.PRUNE, str(self.request.id), result, received=received, runtime=took
        )
    return result


# Beat runs the schedules' tick every AGENT_JOBS_SCHEDULE_INTERVAL seconds; it shows in
# Flower only when it started runs.
@shared_task(base=AgentJobsTask, name=schedule_tick.TASK, bind=True, send_events=False)
def schedules(self: Task[Any, str]) -> str:
    """Start the runs of the schedules' due occurrences (Celery beat runs this)."""
    received, started = time.time(), time.monotonic()
    current = runtime(self.app)
    runner = current.runner
    if not runner.app.schedules:
        return "no schedules"
    found = schedule_tick.tick(
        runner.store,
        runner.app,
        schedule_tick.Dispatched(runner.dispatcher),
        grace=current.settings.schedule_grace,
    )
    result = f"started {sum(s.created for s in found)} runs"
    if found and isinstance(runner.eager_events, ChainEvents):
        took = time.monotonic() - started
        runner.eager_events.task_ran(
            schedule_tick.TASK, str(self.request.id), result, received=received, runtime=took
        )
    return result
