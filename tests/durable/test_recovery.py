"""Recovery follows the death, not the lease: a step whose process was SIGKILLed runs
again within seconds, with the shipped lease and sweep settings.

No test here judges seconds on the wall clock: a step run again is shown recovered by
its process's death (a worker's log says so, naming the run) and before the killed
attempt's lease could have lapsed; beats are aged in Redis, and a process's own clock
is a fake one, so silence is a fact of the test, not of the machine's speed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import redis

from agent_jobs.leases import PROCESSES_KEY, Holder, Leases, this_machine
from agent_jobs.runners.durable import liveness as liveness_module
from agent_jobs.runners.durable.liveness import Liveness
from tests.support import apps
from tests.support.cluster import Cluster
from tests.support.waiting import eventually
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


def held_starts(cluster: Cluster, run_id: str, step: str, n: int) -> list[tuple[int, float]]:
    """(pid, time) of the first `n` starts of the run's `held` step, once it has begun
    `n` times (the tool counts its start before it holds)."""
    return eventually(
        lambda: (found := apps.held_start_of(run_id, step))[n - 1 :] and found[:n],
        what=f"{step} of {run_id} to have begun {n} time(s)",
        context=cluster.logs,
    )


LEASE = float(SHIPPED["AGENT_JOBS_STEP_LEASE"])
# What a worker logs as it sends again the steps of a process that died: its main
# process (a pool process died), or the beat of another (a whole process went silent).
DEATH_RECOVERIES = (
    r"released the lease of {step} of run {run}: process \d+ died",
    r"run {run}: re-sending .*, whose process died",
    r"run {run}: process \S+ stopped beating; re-sending",
)


def recovered_by_a_death(cluster: Cluster, run_id: str, step: str) -> bool:
    logs = "\n".join(p.log() for p in cluster.procs)
    found = [re.search(r.format(run=run_id, step=step), logs) for r in DEATH_RECOVERIES]
    return any(found)


def assert_recovered_by_the_death(
    cluster: Cluster, run_id: str, step: str, starts: list[tuple[int, float]]
) -> None:
    """The step's second start came of its first process's death: a worker said it sent
    the step again for that, and it began again less than a lease's length after the
    first attempt began. No sweep runs in these tests."""
    (_, first), (_, again) = starts
    assert again - first < LEASE, f"ran again {again - first:.1f}s after it began"
    assert "sweep: re-enqueueing" not in "\n".join(p.log() for p in cluster.procs)
    eventually(
        lambda: recovered_by_a_death(cluster, run_id, step),
        what=f"a worker to log that it re-sent {step} of {run_id} for a death",
        context=cluster.logs,
    )


def _kill_and_see_it_run_again(cluster: Cluster, kill: Callable[[int], None]) -> None:
    """Start a run, `kill` the process running its step once the step has begun, and
    see the step run again for that death, once to its end."""
    run_id = cluster.client.enqueue_run("held", "go", actor="user-7")
    [(pid, _)] = held_starts(cluster, run_id, "tool:call_1", 1)
    kill(pid)
    starts = held_starts(cluster, run_id, "tool:call_1", 2)
    assert_recovered_by_the_death(cluster, run_id, "tool:call_1", starts)
    run = cluster.wait(run_id)
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


# A process's silence, long against anything a loaded machine takes between two calls.
SILENCE = 60.0


def silence(client: redis.Redis, process: str, seconds: float) -> None:
    """As if `process` last beat `seconds` ago, by Redis's own clock (the one beats are
    scored by)."""
    now_s, now_us = client.time()  # type: ignore[misc]
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    assert client.zadd(PROCESSES_KEY, {process: now_ms - int(seconds * 1000)}, xx=True, ch=True)


@pytest.mark.pools_named  # no worker: the cluster's Redis alone
def test_a_process_silent_past_the_timeout_is_taken_once_with_its_runs(
    cluster: Cluster,
) -> None:
    client = redis.Redis.from_url(cluster.broker)
    dead, first, second = Leases(client), Leases(client), Leases(client)
    dead.beat("m|1|a", silent_for=SILENCE, take=False)
    dead.hold("m|1|a", "run-1|t1")
    dead.hold("m|1|a", "run-1|t2")
    dead.hold("m|1|a", "run-2|t3")
    assert first.beat("m|2|b", silent_for=SILENCE, take=True) == {}  # not silent long enough
    silence(client, "m|1|a", 2 * SILENCE)  # its last beat is two timeouts old
    second.beat("m|3|c", silent_for=SILENCE, take=False)  # it beats and stays alive
    assert first.beat("m|2|b", silent_for=SILENCE, take=True) == {"m|1|a": {"run-1", "run-2"}}
    assert second.beat("m|3|c", silent_for=SILENCE, take=True) == {}  # taken once only
    assert set(first.processes()) == {"m|2|b", "m|3|c"}
    assert client.exists("agent_jobs:holds:m|1|a") == 0


@pytest.mark.pools_named
def test_after_a_redis_outage_a_process_takes_nobody_until_it_has_beaten_a_timeout(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process's last beat is old when Redis comes back: none of them is dead."""
    clock = [0.0]  # this process's own clock (how long it has beaten), moved by the test
    monkeypatch.setattr(liveness_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    client = redis.Redis.from_url(cluster.broker)
    other = Leases(client)
    other.beat("m|9|z", silent_for=SILENCE, take=False)
    other.hold("m|9|z", "run-9|t")
    silence(client, "m|9|z", 2 * SILENCE)  # as if Redis had been away: its beat is old
    recovered: list[tuple[str, set[str]]] = []
    liveness = Liveness(Leases(client), lambda p, runs: recovered.append((p, runs)), SILENCE)
    liveness.beat()  # the first beat after the outage
    liveness.beat()  # the first that proves it connected: one came just before it
    assert recovered == []
    other.beat("m|9|z", silent_for=SILENCE, take=False)  # the other is alive after all
    clock[0] += SILENCE  # this process has beaten a whole timeout: it may take others
    liveness.beat()
    assert recovered == []
    silence(client, "m|9|z", 2 * SILENCE)  # now it is silent
    clock[0] += SILENCE
    liveness.beat()
    eventually(lambda: recovered, what="the silent process to be recovered")
    assert recovered == [("m|9|z", {"run-9"})]


@pytest.mark.pools_named
def test_a_process_taken_for_dead_that_takes_work_before_it_beats_can_be_taken_again(
    cluster: Cluster,
) -> None:
    """The partition lab cut a host off again 2.6 s after it healed: its consumer had
    come back and taken steps, its beat not yet, so it was among no process that beats
    and nobody took it; its steps waited for it to heal a second time. A process that
    notes a run it works on is among the processes again."""
    client = redis.Redis.from_url(cluster.broker)
    lost, taker = Leases(client), Leases(client)
    lost.beat("m|5|v", silent_for=SILENCE, take=False)
    assert taker.take_processes(["m|5|v"]) == {"m|5|v": set()}  # taken in a first cut
    lost.hold("m|5|v", "run-5|t")  # healed: its consumer took a step before it beat
    assert "m|5|v" in taker.processes()
    silence(client, "m|5|v", 2 * SILENCE)  # cut off again
    taker.beat("m|4|u", silent_for=SILENCE, take=False)
    assert taker.beat("m|4|u", silent_for=SILENCE, take=True) == {"m|5|v": {"run-5"}}


def steady_beats(liveness: Liveness, clock: list[float]) -> None:
    """Beat until `liveness` may take others: twice (the first proves nothing), then
    again a whole timeout later on its clock."""
    liveness.beat()
    liveness.beat()
    clock[0] += liveness.timeout
    liveness.beat()


@pytest.mark.pools_named
def test_a_host_whose_beats_came_after_a_gap_takes_nobody_for_a_timeout(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host cut off from the network healed into a world where the healthy worker
    looked silent, and took it at once (its beat, sent before the cut, reached Redis
    through a retry after it): two live workers then ran one step. A beat that reaches
    Redis after a gap in this process's own beats, by Redis's clock, takes nobody; nor
    does any for a whole timeout after it."""
    clock = [0.0]
    monkeypatch.setattr(liveness_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    client = redis.Redis.from_url(cluster.broker)
    recovered: list[tuple[str, set[str]]] = []
    liveness = Liveness(Leases(client), lambda p, runs: recovered.append((p, runs)), SILENCE)
    steady_beats(liveness, clock)  # it may take others now
    other = Leases(client)
    other.beat("m|7|x", silent_for=SILENCE, take=False)
    other.hold("m|7|x", "run-7|t")
    silence(client, "m|7|x", 2 * SILENCE)  # silent, as the healthy worker looked
    silence(client, liveness.process, SILENCE)  # this host's own gap: cut off, healed
    liveness.beat()
    assert recovered == [] and "m|7|x" in other.processes()
    liveness.beat()  # steady again from here
    clock[0] += SILENCE / 2
    liveness.beat()
    assert recovered == [] and "m|7|x" in other.processes()
    clock[0] += SILENCE / 2  # a whole timeout of steady beats: it may take others again
    liveness.beat()
    eventually(lambda: recovered, what="the silent process to be taken, a timeout later")
    assert recovered == [("m|7|x", {"run-7"})]


@pytest.mark.pools_named
def test_a_slow_beat_takes_nobody_and_starts_the_count_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beat whose round trip took a good share of the timeout does not prove this
    process connected: it counts as a failed one."""
    clock = [0.0]
    monkeypatch.setattr(liveness_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    client = redis.Redis.from_url(cluster.broker)
    recovered: list[tuple[str, set[str]]] = []
    leases = Leases(client)
    liveness = Liveness(leases, lambda p, runs: recovered.append((p, runs)), SILENCE)
    steady_beats(liveness, clock)
    slow = {"by": 0.0}
    pulse = leases.pulse

    def slow_pulse(*args: object, **kwargs: bool | float) -> tuple[dict[str, set[str]], bool]:
        clock[0] += slow["by"]  # the round trip, as this process's clock saw it
        return pulse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(leases, "pulse", slow_pulse)
    slow["by"] = SILENCE / 2  # one slow beat, while nobody is silent
    liveness.beat()
    slow["by"] = 0.0
    Leases(client).beat("m|6|w", silent_for=SILENCE, take=False)
    Leases(client).hold("m|6|w", "run-6|t")
    silence(client, "m|6|w", 2 * SILENCE)
    liveness.beat()  # quick, but the count began again after the slow one
    assert recovered == []
    clock[0] += SILENCE
    liveness.beat()
    eventually(lambda: recovered, what="the silent process to be taken, a timeout later")
    assert recovered == [("m|6|w", {"run-6"})]


@pytest.mark.pools_named
def test_a_recovery_that_waits_never_holds_up_the_beat(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A healthy worker took a lost host for dead, then its recovery waited 10 s on a row
    the lost host's open transaction still locked, on the beat's own thread: it stopped
    beating for 7 s, and was taken for dead in turn. Recovery runs apart from the beat."""
    clock = [0.0]
    monkeypatch.setattr(liveness_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    client = redis.Redis.from_url(cluster.broker)
    lost = Leases(client)
    lost.beat("m|8|y", silent_for=SILENCE, take=False)
    lost.hold("m|8|y", "run-8|t")
    recovering, release = threading.Event(), threading.Event()

    def recover(process: str, runs: set[str]) -> None:  # waits, as on a locked row
        recovering.set()
        release.wait()  # until the test ends: longer than any wait of the test's

    liveness = Liveness(Leases(client), recover, SILENCE)
    liveness.beat()  # the first beat of a process proves nothing: none came before it
    liveness.beat()
    clock[0] += SILENCE  # beaten a whole timeout: it may take others
    silence(client, "m|8|y", 2 * SILENCE)
    try:
        beater = threading.Thread(target=liveness.beat)
        beater.start()
        eventually(recovering.is_set, what="the recovery of the lost host to begin")
        eventually(lambda: not beater.is_alive(), what="the beat to end while the recovery waits")
        liveness.beat()  # and the next beat too
        assert liveness.process in Leases(client).processes() and not release.is_set()
    finally:
        release.set()


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
    try:
        eventually(lambda: recovered, what="the gone process to be taken")
    finally:
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
