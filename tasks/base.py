"""The base of every agent-jobs task: how its messages are received and its requests run."""

from __future__ import annotations

from celery import Task


class AgentJobsTask(Task):  # type: ignore[type-arg]
    """A task whose malformed messages are refused (tasks.strategy), and whose lease
    goes with a pool process that dies running it (tasks.requests)."""

    Strategy = "tasks.strategy:guarded"
    Request = "tasks.requests:StepRequest"
