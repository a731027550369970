"""Recovery follows the death, not the lease: a step whose process was SIGKILLed runs
again within seconds, with the shipped lease and sweep settings."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest
import redis

from agent_jobs.leases import Holder, Leases, this_machine
from agent_jobs.runners.liveness import Liveness
from tests.support import apps
from tests.support.cluster import Cluster
from tests.support.workers import Process

SHIPPED = {
    "AGENT_JOBS_STEP_LEASE": "30",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "60",
    "AGENT_JOBS_SWEEP_INTERVAL": "30",
}


def test_a_step_whose_process_was_killed_runs_again_within_seconds(cluster: Cluster) -> None:
    # The redelivery may go to either worker. On a threads pool the process killed is a
    # whole worker: it is started again, and recovers at once the process that died.
    cluster.worker(concurrency=2, restart=True, **SHIPPED)
    cluster.worker(concurrency=2, restart=True, **SHIPPED)
    for _ in range(5):
        _kill_and_see_it_run_again(cluster, lambda pid: os.kill(pid, signal.SIGKILL))


def _kill_and_see_it_run_again(cluster: Cluster, kill: Callable[[int], None]) -> None:
    """Start a run, `kill` the process running its step, and see the step run again
    within 5 s, once to its end."""
    run_id = cluster.client.enqueue_run("held", "go", actor="user-7")
    pid, _ = apps.wait_held_starts(run_id, 1, 30)[0]
    time.sleep(0.3)
    killed = time.time()
    kill(pid)
    (_, again) = apps.wait_held_starts(run_id, 2, 15)[1]
    assert again - killed < 5, f"the step ran again {again - killed:.1f}s after the kill"
    run = cluster.wait(run_id, timeout=30)
    assert run.status == "completed" and run.output == "held done"
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
    assert step["state"] == "done" and step["attempts"] == 2
    assert apps.executed(run_id).count(("held", f"{run_id}:tool:call_1")) == 1


def _worker_of(cluster: Cluster, pid: int) -> Process:
    """The cluster's worker that `pid` belongs to (its main process or a pool process)."""
    group = os.getpgid(pid)
    [worker] = [p for p in cluster.procs if p.proc is not None and p.proc.pid == group]
    return worker


def test_a_step_whose_whole_worker_was_killed_runs_again_within_seconds(
    cluster: Cluster,
) -> None:
    """Nobody sees the worker die (its main process goes too): another worker notices it
    stopped beating. With the shipped lease and sweep, the sweep alone takes a minute."""
    for _ in range(2):
        cluster.worker(concurrency=2, **SHIPPED)

    def kill_its_worker(pid: int) -> None:
        dead = _worker_of(cluster, pid)
        dead.kill()
        cluster.procs.remove(dead)

    for _ in range(2):
        _kill_and_see_it_run_again(cluster, kill_its_worker)
        cluster.worker(concurrency=2, **SHIPPED)  # two up again


@pytest.mark.pools_named  # no worker: the cluster's Redis alone
def test_a_process_silent_past_the_timeout_is_taken_once_with_its_runs(
    cluster: Cluster,
) -> None:
    client = redis.Redis.from_url(cluster.broker)
    dead, first, second = Leases(client), Leases(client), Leases(client)
    dead.beat("m|1|a", silent_for=0.3, take=False)
    dead.hold("m|1|a", "run-1|t1")
    dead.hold("m|1|a", "run-1|t2")
    dead.hold("m|1|a", "run-2|t3")
    assert first.beat("m|2|b", silent_for=0.3, take=True) == {}  # not silent long enough
    time.sleep(0.4)
    second.beat("m|3|c", silent_for=0.3, take=False)  # it beats and stays alive
    assert first.beat("m|2|b", silent_for=0.3, take=True) == {"m|1|a": {"run-1", "run-2"}}
    assert second.beat("m|3|c", silent_for=0.3, take=True) == {}  # taken once only
    assert set(first.processes()) == {"m|2|b", "m|3|c"}
    assert client.exists("agent_jobs:holds:m|1|a") == 0


@pytest.mark.pools_named
def test_after_a_redis_outage_a_process_takes_nobody_until_it_has_beaten_a_timeout(
    cluster: Cluster,
) -> None:
    """Every process's last beat is old when Redis comes back: none of them is dead."""
    client = redis.Redis.from_url(cluster.broker)
    other = Leases(client)
    other.beat("m|9|z", silent_for=0.5, take=False)
    other.hold("m|9|z", "run-9|t")
    time.sleep(0.6)  # as if Redis had been away: its beat is old
    recovered: list[tuple[str, set[str]]] = []
    liveness = Liveness(Leases(client), lambda p, runs: recovered.append((p, runs)), 0.5)
    liveness.beat()  # the first beat after the outage
    assert recovered == []
    time.sleep(0.3)
    other.beat("m|9|z", silent_for=0.5, take=False)  # the other is alive after all
    time.sleep(0.3)
    liveness.beat()
    assert recovered == []
    time.sleep(0.6)  # now it is silent, and this process has beaten a whole timeout
    liveness.beat()
    assert recovered == [("m|9|z", {"run-9"})]


@pytest.mark.pools_named
def test_a_gone_process_of_this_machine_is_taken_as_a_worker_starts(cluster: Cluster) -> None:
    """A worker restarted on the same machine recovers at once the one that died."""
    client = redis.Redis.from_url(cluster.broker)
    proc = subprocess.Popen(["true"])
    proc.wait()
    gone = Holder(this_machine(), proc.pid, "1", "x").process  # no such process now
    leases = Leases(client)
    leases.beat(gone, silent_for=60, take=False)
    leases.hold(gone, "run-5|t")
    recovered: list[tuple[str, set[str]]] = []
    liveness = Liveness(leases, lambda p, runs: recovered.append((p, runs)), 60)
    liveness.start()
    deadline = time.monotonic() + 5
    while not recovered and time.monotonic() < deadline:
        time.sleep(0.02)
    liveness.stop()
    assert recovered == [(gone, {"run-5"})]


@pytest.mark.pools_named
def test_a_process_is_known_to_live_before_its_first_task_goes_on(cluster: Cluster) -> None:
    """A process beats once as its liveness starts, before the task that started it runs
    on: one killed in its first moments is taken like any other. Before, its first beat
    came a sixth of the timeout later, and a process killed sooner was never taken (its
    steps waited for the sweep)."""
    client = redis.Redis.from_url(cluster.broker)
    leases = Leases(client)
    liveness = Liveness(leases, lambda p, runs: None, 60)  # a beat every 10 s
    liveness.start()
    try:
        assert liveness.process in leases.processes()
    finally:
        liveness.stop()
