"""This process, as the driver of an inline run: who it is, and whether another that
was recorded so is gone (agent_jobs/runners/inline/abandoned.py).

A driver is `host/pid/start`, the start being the process's start time in clock ticks
after boot (from /proc), so that a pid the system gave again to another process is not
taken for the one that exited. Where /proc cannot say, only the pid is looked at.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path


def this_process() -> str:
    """This process as a run's driver: `host/pid/start`."""
    return _identity(os.getpid())  # a forked child is a process of its own


@functools.cache
def _identity(pid: int) -> str:
    return f"{socket.gethostname()}/{pid}/{_started(pid) or ''}"


def _started(pid: int) -> str | None:
    """When the process began (clock ticks after boot, from /proc), or None if there is
    no such process; '' where /proc cannot say (then only the pid is looked at)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # /proc works here: no such process
        return "" if alive(pid) else None
    except OSError:
        return ""
    # The command's name, in parentheses, may hold spaces: the fields follow its end.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]  # field 22 of proc(5), `starttime`


def alive(pid: int) -> bool:
    """Whether a process of this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gone(driver: str | None) -> bool:
    """Whether the process recorded as a run's driver has surely exited: it ran on this
    host and no process of its pid and start time exists now."""
    if not driver:
        return False
    host, pid, start = driver.rsplit("/", 2)
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if driver == this_process():
        return False
    now = _started(int(pid))
    return now is None or (bool(start) and bool(now) and now != start)


def describe(driver: str) -> str:
    host, pid, _ = driver.rsplit("/", 2)
    return f"pid {pid} on {host}"
