"""How long a stalled process holds its steps (docs/durable.md, "Faults"): one of another
machine that stops beating is taken for dead and its steps sent again in seconds; one of
this machine whose pid still runs (stopped with SIGSTOP, in a debugger: not dead) is left
its steps, which go again only once their lease runs out and the sweep finds the run
stale. The guide said seconds for both."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from agent_jobs.leases import SEP, Holder, Leases, this_machine
from agent_jobs.leases import _start_time as start_time
from agent_jobs.runners.durable.liveness import Liveness
from tests.support.waiting import eventually


class NoRedis:
    """What `Leases` registers its scripts on; `_recover` asks Redis nothing."""

    def register_script(self, script: str) -> Any:
        return None


def recovered(process: str) -> list[str]:
    taken: list[str] = []
    leases = Leases(NoRedis())  # type: ignore[arg-type]
    watcher = Liveness(leases, lambda p, runs: taken.append(p), timeout=3.0)
    watcher._recover(process, {"run-1"})
    return taken


def test_a_stopped_process_of_this_machine_keeps_its_steps_until_it_is_gone() -> None:
    stalled = subprocess.Popen(["sleep", "60"])
    try:
        stalled.send_signal(signal.SIGSTOP)  # silent, yet running: it may go on
        process = SEP.join((this_machine(), str(stalled.pid), start_time(stalled.pid)))
        assert Holder.of_process(process) is not None
        assert recovered(process) == []  # left to it: its lease and the sweep decide
        elsewhere = SEP.join(("another-machine", str(stalled.pid), start_time(stalled.pid)))
        assert recovered(elsewhere) == [elsewhere]  # another machine's: taken at once
    finally:
        stalled.kill()
        stalled.wait()
    assert recovered(process) == [process]  # gone now: taken at once


def test_the_runs_whose_rows_stay_locked_are_recovered_again_soon() -> None:
    """Recovery leaves for later a run whose row a lost host's open transaction locks
    (runners/durable/recovery.py): the recovery thread comes back to it, and to it alone."""
    calls: list[set[str]] = []

    def recover(process: str, runs: set[str]) -> set[str]:
        calls.append(set(runs))
        return {"run-2"} if len(calls) == 1 else set()  # locked the first time only

    watcher = Liveness(Leases(NoRedis()), recover, timeout=0.3)  # type: ignore[arg-type]
    elsewhere = SEP.join(("another-machine", "17", "1"))
    watcher._recover(elsewhere, {"run-1", "run-2"})
    eventually(lambda: len(calls) == 2, what="the locked run to be recovered again")
    assert calls == [{"run-1", "run-2"}, {"run-2"}]
