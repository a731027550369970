"""A worker step that notices a dead pool process within half a second.

The prefork pool learns that a process died from the process's sentinel pipe, and
otherwise from a timer every 5 s. Measured here, the sentinel misses some deaths (a
replacement process's, most often), and the SIGKILLed step then waits up to 5 s
before Celery hands its message back. Checking the pool twice a second costs a
`waitpid` per process.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

REAP_EVERY = 0.5


class ReapDeadProcesses(bootsteps.StartStopStep):
    requires = ("celery.worker.components:Pool",)

    def start(self, worker: Any) -> None:
        hub = getattr(worker, "hub", None)
        maintain = getattr(getattr(worker.pool, "_pool", None), "maintain_pool", None)
        if hub is not None and callable(maintain):  # prefork on the event loop only
            hub.call_repeatedly(REAP_EVERY, maintain)
