"""The `agent-jobs` command line."""

from __future__ import annotations

import click

from .approvals import approvals, approve, reject
from .common import report_warnings
from .controls import fork, pause, resume, retry
from .db import db
from .enqueue import enqueue
from .inspect import journal, runs, status
from .keys import forget, keys
from .prune import prune
from .reconcile import reconcile
from .run import run
from .schedules import schedules
from .serve import serve
from .session import answer, cancel, events, model, say
from .tail import tail


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-jobs")
def main() -> None:
    """Durable agent-loop jobs: run agents, follow them, decide on their actions.

    Exit codes: 0 done; 1 the run failed or was cancelled; 2 bad input, configuration or
    a refused decision; 3 not found; 4 the run waits for a person and there is no
    terminal to ask on; 5 a service (the database, the broker, Redis) is unreachable.
    """
    report_warnings()


for command in (
    run,
    enqueue,
    tail,
    status,
    runs,
    journal,
    events,
    say,
    model,
    cancel,
    pause,
    resume,
    retry,
    fork,
    approve,
    reject,
    answer,
    reconcile,
    approvals,
    db,
    serve,
    prune,
    schedules,
    keys,
    forget,
):
    main.add_command(command)

__all__ = ["main"]
