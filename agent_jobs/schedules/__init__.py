"""Schedules: runs started at the occurrences of a cron expression (docs/schedules.md).

`spec.py` defines one (`app.schedule`), `cron.py` turns its expression and time zone into
instants, `tick.py` starts the runs that are due (the durable runner's beat and the
embedded default's ticker call it), `ticker.py` is the embedded default's thread.
"""

from .cron import Cron
from .spec import CatchUp, Schedule

__all__ = ["CatchUp", "Cron", "Schedule"]
