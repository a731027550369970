"""Flower's configuration for agent-jobs: `celery -A tasks flower --conf=<this file>`.

Flower executes this file (tornado's `parse_config_file`) and takes every module-level
name that is one of its options. It is shipped in the package, so every install has it:
the image links it to `/etc/agent-jobs/flowerconfig.py`; elsewhere
`python -c 'import importlib.util as u; print(u.find_spec("tasks.flowerconfig").origin)'`
prints its path (docs/operating.md, "Flower and the compose stack").

Basic auth comes from `FLOWER_USER` and `FLOWER_PASSWORD` in the environment, so no
secret is on a command line (visible in `ps`), and a password may hold any character:
`--basic-auth` and Flower's own `FLOWER_BASIC_AUTH` split their value on `,`. Neither
name is a Flower option, so Flower leaves them to this file. Flower refuses to start
without them. Options given on the command line win over this file, and every other
`FLOWER_<OPTION>` Flower applies itself (`FLOWER_ADDRESS`, `FLOWER_PORT`, … are kept).
"""

from __future__ import annotations

import ast
import os
from typing import Any

_user = os.environ.get("FLOWER_USER", "")
_password = os.environ.get("FLOWER_PASSWORD", "")
if not _user or not _password:
    raise SystemExit("flower: set FLOWER_USER and FLOWER_PASSWORD (basic auth) in its environment")
if ":" in _user:
    raise SystemExit("flower: FLOWER_USER may not contain ':' (the password may)")

# One user; its password is compared whole (Flower splits the header at the first `:`).
basic_auth = [f"{_user}:{_password}"]

# Plain HTTP: only this machine by default. Compose listens on every address of the
# container and publishes the port on the host's 127.0.0.1 alone; put TLS in front (or
# set `certfile` and `keyfile`) before anything else may reach it.
address = os.environ.get("FLOWER_ADDRESS", "127.0.0.1")
port = int(os.environ.get("FLOWER_PORT", "5555"))

# The tasks page: what a person looks for, first. Args lead with the step (`model:2 · run
# 6b79ab12…`), result says where the run stands or why the task failed (`format_task`);
# the uuid, last, opens the task, whose kwargs hold the whole run id.
tasks_columns = os.environ.get(
    "FLOWER_TASKS_COLUMNS", "name,state,args,result,received,runtime,worker,uuid"
)


def format_task(task: Any) -> Any:
    """How the tasks page and a task's page show `task` (Flower's copy, for display
    only): a result as its text, not a Python literal (`done → completed`, not
    `'done → completed'`), and a failed task's reason where the others show their result
    (Flower keeps it apart, as the task's exception)."""
    result = getattr(task, "result", None)
    if getattr(task, "state", None) == "FAILURE" and result is None:
        task.result = getattr(task, "exception", None)
    elif isinstance(result, str) and len(result) >= 2 and result[0] == result[-1] == "'":
        try:
            text = ast.literal_eval(result)
        except (ValueError, SyntaxError):
            return task
        if isinstance(text, str):
            task.result = text
    return task
