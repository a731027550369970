"""The inline runner's wing: the loop driven in this process, each step executed at once,
reads on a thread pool, a person's decision a future. The embedded default.

Outside `agent_jobs/runners/` it is reached through `agent_jobs.runners`; the modules
inside are private to the wing.
"""

from .abandoned import end as end_abandoned
from .runner import InlineRunner

__all__ = ["InlineRunner", "end_abandoned"]
