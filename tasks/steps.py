"""The task adapters: each takes ids, loads state from Postgres, calls the runner."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from agent_jobs.dispatch import COORDINATE, INVOKE_TOOL, MODEL_TURN, START_RUN, SWEEP
from agent_jobs.errors import AgentJobsError, RetryLater
from agent_jobs.runs import RunRequest

from .base import AgentJobsTask
from .runtime import runtime


@shared_task(base=AgentJobsTask, name=START_RUN, bind=True)
def start_run(self: Task[Any, str], /, *args: Any, **kwargs: Any) -> str:
    """Start a run from the keyword arguments another service sent; without a `run_id`,
    the run is named after this task (README, "Enqueueing runs from other services")."""
    if args:
        return "refused: agent_jobs.start_run takes keyword arguments only (send them as kwargs)"
    runner = runtime(self.app).runner
    try:
        request = RunRequest.parse(kwargs)
        run_id = request.run_id or str(self.request.id)
        runner.create(request, run_id)
    except AgentJobsError as exc:
        # A bad request is refused, recorded nowhere, and not retried.
        return f"refused: {exc}"
    return f"{run_id} {runner.continue_run(run_id)}"


@shared_task(base=AgentJobsTask, name=COORDINATE, bind=True)
def coordinate(self: Task[Any, str], run_id: str) -> str:
    """Re-drive a run: replay its journal, schedule what is missing, suspend."""
    return f"{run_id} {runtime(self.app).runner.continue_run(run_id)}"


@shared_task(base=AgentJobsTask, name=MODEL_TURN, bind=True)
def model_turn(self: Task[Any, str], run_id: str, step: str) -> str:
    """Call the model for one step of a run, streaming its text to the run's stream."""
    runner = runtime(self.app).runner
    try:
        outcome = runner.execute_step(run_id, step, task=MODEL_TURN, retries=self.request.retries)
        return f"{run_id} {outcome}"
    except RetryLater as later:
        # The request-error waterfall asked for a retry: Celery's countdown waits, no
        # worker sleeps.
        raise self.retry(countdown=later.delay, max_retries=None) from None


@shared_task(base=AgentJobsTask, name=INVOKE_TOOL, bind=True)
def invoke_tool(self: Task[Any, str], run_id: str, step: str) -> str:
    """Invoke one tool call of a run."""
    return f"{run_id} {runtime(self.app).runner.execute_step(run_id, step, task=INVOKE_TOOL)}"


@shared_task(base=AgentJobsTask, name=SWEEP, bind=True)
def sweep(self: Task[Any, str]) -> str:
    """Re-drive runs that made no progress for a while (Celery beat runs this)."""
    return f"re-drove {runtime(self.app).runner.sweep()} runs"
