"""How a worker's main process takes our tasks' requests: what Flower shows of each, and
what becomes of a step request whose pool process died."""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import redis
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from agent_jobs.dispatch import (
    COORDINATE,
    INVOKE_TOOL,
    MODEL_TURN,
    START_RUN,
    start_run_kwargs,
    start_run_label,
)
from agent_jobs.dispatch import step_reprs as shown_step
from agent_jobs.leases import Leases, this_machine

from .base import main_redis

log = logging.getLogger(__name__)


@cache
def main_process_leases() -> Leases:
    return Leases(main_redis())


def shown(
    task: str, args: Any, kwargs: Any, task_id: str, sent: str | None
) -> tuple[str, str | None] | None:
    """The arguments and keyword arguments Flower shows of a task of ours as received:
    built from its real arguments (agent_jobs.dispatch, "what Flower shows of a task"),
    whoever sent it; None (all, or the keyword arguments) to show what the sender said.
    A step task keeps the tool its sender named (`tool:call_3 lookup_order · run …`):
    only a pass knows it. A `start_run` keeps the sender's `kwargsrepr`, which may leave
    out what the sender would not have shown."""
    if task == START_RUN:
        return start_run_label(kwargs, task_id), start_run_kwargs(kwargs)
    if not (isinstance(args, list | tuple) and args and all(isinstance(a, str) for a in args)):
        return None
    if task == COORDINATE and len(args) == 1:
        return shown_step(task, args[0])
    if task in (MODEL_TURN, INVOKE_TOOL) and len(args) == 2:
        run_id, step = args
        plain = shown_step(task, run_id, step)
        head, _, tail = plain[0].partition(" · ")
        tool = None
        if sent and sent.startswith(head + " ") and sent.endswith(" · " + tail):
            tool = sent[len(head) + 1 : -len(tail) - 3] or None
        return shown_step(task, run_id, step, tool)
    return None


class StepRequest(Request):
    """A request of our tasks: Flower is shown what a person looks for (`shown`), and
    when a step task's pool process dies, the step's lease goes with it.

    Celery hands the message back at once (`task_reject_on_worker_lost`); without this
    the redelivery, on this worker or any other, would find the dead process's lease and
    leave the step to the sweep. The lease is released before the message is handed
    back, and only if the dead process held it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            labels = shown(self.name, self.args, self.kwargs, self.id, self.argsrepr)
        except Exception:  # never: this runs in the worker's main process, which must live
            log.exception("could not label task %s for Flower", self.id)
            labels = None
        if labels is not None:
            inner: Any = self  # Celery's own fields, which its stubs do not declare
            argsrepr, kwargsrepr = labels
            inner._argsrepr = self.request_dict["argsrepr"] = argsrepr
            if kwargsrepr is not None:
                inner._kwargsrepr = self.request_dict["kwargsrepr"] = kwargsrepr

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # unwrapped from Celery's ExceptionWithTraceback
        pid = self.worker_pid
        if isinstance(exc, WorkerLostError | SystemExit | KeyboardInterrupt) and pid:
            _release_dead(self.args, int(pid))
        return super().on_failure(exc_info, send_failed_event, return_ok)


def _release_dead(args: Any, pid: int) -> None:
    if not (isinstance(args, list | tuple) and len(args) >= 2):
        return
    run_id, step = args[0], args[1]
    if not (isinstance(run_id, str) and isinstance(step, str)):
        return
    try:
        if main_process_leases().release_dead(run_id, step, this_machine(), pid):
            log.info("released the lease of %s of run %s: process %d died", step, run_id, pid)
    except redis.RedisError as exc:  # the redelivery checks the holder itself, too
        log.warning("could not release the lease of %s of run %s: %s", step, run_id, exc)
