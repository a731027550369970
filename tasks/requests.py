"""How a worker's main process handles a step request whose pool process died."""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import redis
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from agent_jobs.leases import Leases, this_machine

from .base import main_redis

log = logging.getLogger(__name__)


@cache
def main_process_leases() -> Leases:
    return Leases(main_redis())


class StepRequest(Request):
    """A step task's request: when its pool process dies, the step's lease goes with it.

    Celery hands the message back at once (`task_reject_on_worker_lost`); without this
    the redelivery, on this worker or any other, would find the dead process's lease and
    leave the step to the sweep. The lease is released before the message is handed
    back, and only if the dead process held it.
    """

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
