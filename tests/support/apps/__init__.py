"""Apps the tests run in both runners; workers load them with AGENT_JOBS_APP=tests.support.apps:app.

One app, built up by subject: `base` (the side table that counts every model call and tool
execution, the counting model, the app and its basic tools and agents), `runtime`,
`delegation`, `history`, `faults`, `deadlines`, `timers` and `payloads` each add their
tools and agents to it.
Importing this package imports them all, so a worker loading `tests.support.apps:app`
knows every tool; every name a test uses is re-exported here (`apps.executed`,
`from tests.support.apps import DEADLINE`).

The other apps of this package (`concurrency`, `controls`, `http`, `otel`, `reconcile`)
are apps of their own, loaded by their module's path.
"""

from __future__ import annotations

# The subjects register their tools and agents in this order (the order of the app's
# registries), so it is kept as written.
# isort: off
from tests.support.apps import base
from tests.support.apps import runtime
from tests.support.apps import delegation
from tests.support.apps import history
from tests.support.apps import faults
from tests.support.apps import deadlines
from tests.support.apps import timers
from tests.support.apps import payloads

# isort: on
from tests.support.apps.base import (
    TOOLS,
    CountingModel,
    app,
    boom,
    counted,
    executed,
    executions,
    lookup,
    open_gate,
    record,
    refund,
    side,
    side_engine,
    slow,
    together,
    until_opened,
)
from tests.support.apps.deadlines import (
    DEADLINE,
    DEADLINED,
    refund_escalated,
    refund_or_lapse,
    refund_unless_stopped,
    track,
)
from tests.support.apps.delegation import schedule
from tests.support.apps.faults import (
    CPU_QUEUE,
    crash_worker,
    crunch,
    held,
    held_start_of,
    held_starts,
    python_loop,
    stubborn_loop,
    wait_for_gate,
    wait_held_starts,
)
from tests.support.apps.history import SummaryModel
from tests.support.apps.runtime import FlakyModel, HeldModel, gate

__all__ = [
    "CPU_QUEUE",
    "DEADLINE",
    "DEADLINED",
    "TOOLS",
    "CountingModel",
    "FlakyModel",
    "HeldModel",
    "SummaryModel",
    "app",
    "base",
    "boom",
    "counted",
    "crash_worker",
    "crunch",
    "deadlines",
    "delegation",
    "executed",
    "executions",
    "faults",
    "gate",
    "held",
    "held_start_of",
    "held_starts",
    "history",
    "lookup",
    "open_gate",
    "payloads",
    "python_loop",
    "record",
    "refund",
    "refund_escalated",
    "refund_or_lapse",
    "refund_unless_stopped",
    "runtime",
    "schedule",
    "side",
    "side_engine",
    "slow",
    "stubborn_loop",
    "timers",
    "together",
    "track",
    "until_opened",
    "wait_for_gate",
    "wait_held_starts",
]
