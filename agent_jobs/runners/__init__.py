"""The two runners, each in its wing (`durable/`, `inline/`), and what both share beside
them: `turn` (what happens around the loop), `waits` (a human wait, described once) and
`cursor` (which journal row answers the step a replay asks for, checked by position).

Code outside `agent_jobs/runners/` imports a runner from here (and `tasks/` the durable
wing's face, `agent_jobs.runners.durable`), never a module inside a wing.
"""

from .durable import DurableHooks, DurableRunner, DurableWake
from .inline import InlineRunner, end_abandoned

__all__ = ["DurableHooks", "DurableRunner", "DurableWake", "InlineRunner", "end_abandoned"]
