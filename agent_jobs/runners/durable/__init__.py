"""The durable runner's wing: a coordinator pass under the run's lock replays the loop
against the Postgres journal, steps go out as Celery tasks, and every process beats so
that a dead one's steps are sent again.

`tasks/` (the Celery adapters) imports what it needs from here; everything else goes
through `agent_jobs.runners`. The modules inside are private to the wing.
"""

from .liveness import Liveness
from .recovery import give_up, recover_process
from .replay import DurableHooks
from .report import StepOutcome, summary, where
from .runner import DurableRunner
from .running import RUNNING, Running
from .sleepers import TIMERS
from .wake import DurableWake

__all__ = [
    "RUNNING",
    "TIMERS",
    "DurableHooks",
    "DurableRunner",
    "DurableWake",
    "Liveness",
    "Running",
    "StepOutcome",
    "give_up",
    "recover_process",
    "summary",
    "where",
]
