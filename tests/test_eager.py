"""The fast path: the step a pass schedules runs where the last one ended, not through
the broker, and a process killed in such a step is recovered as fast as a delivered one."""

from __future__ import annotations

import os
import re
import signal
import time

from . import apps
from .cluster import Cluster
from .test_recovery import SHIPPED


def _received(log: str, task: str) -> int:
    return len(re.findall(rf"Task agent_jobs\.{task}\[[0-9a-f-]+\] received", log))


def test_a_runs_steps_run_where_the_last_one_ended(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2)
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "w1 answer"
    log = worker.log()
    # Three model steps and four reads: every model step ran in the task before it, and
    # of each fan-out of two reads one member was kept and the other sent.
    assert _received(log, "model_turn") == 0, log
    assert _received(log, "invoke_tool") == 2, log
    steps = [j["step"] for j in cluster.store.journal(run_id) if j["state"] == "done"]
    assert [s for s in steps if s.startswith(("model:", "tool:"))] == [
        "model:1",
        "tool:call_1",
        "tool:call_2",
        "model:2",
        "tool:call_3",
        "tool:call_4",
        "model:3",
    ]


def test_with_the_fast_path_off_every_step_crosses_the_broker(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2, AGENT_JOBS_EAGER_STEPS="false")
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "w1 answer"
    log = worker.log()
    assert _received(log, "model_turn") == 3 and _received(log, "invoke_tool") == 4, log


def test_an_eager_chain_stops_at_its_step_budget_and_sends_the_rest(cluster: Cluster) -> None:
    worker = cluster.worker(concurrency=2, AGENT_JOBS_EAGER_MAX_STEPS="1")
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(run_id).status == "completed"
    log = worker.log()
    # Each task runs one step of its own and at most one more, so some go by the broker.
    assert 0 < _received(log, "model_turn") + _received(log, "invoke_tool") < 7, log


def test_a_process_killed_in_an_eagerly_kept_fan_out_member_is_recovered_in_seconds(
    cluster: Cluster,
) -> None:
    cluster.worker(concurrency=2, **SHIPPED)
    cluster.worker(concurrency=2, **SHIPPED)
    for _ in range(3):
        run_id = cluster.client.enqueue_run("held_pair", "go", actor="user-7")
        deadline = time.monotonic() + 30
        while not (first := apps.held_start_of(run_id, "tool:call_1")):
            assert time.monotonic() < deadline, "tool:call_1 never started"
            time.sleep(0.02)
        pid, _ = first[0]
        time.sleep(0.3)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(again := apps.held_start_of(run_id, "tool:call_1")) < 2:
            assert time.monotonic() < deadline, "the killed member never ran again"
            time.sleep(0.02)
        assert again[1][1] - killed < 5, f"ran again {again[1][1] - killed:.1f}s after the kill"
        run = cluster.wait(run_id, timeout=30)
        assert run.status == "completed" and run.output == "both held"
        journal = {j["step"]: j for j in cluster.store.journal(run_id)}
        assert journal["tool:call_1"]["attempts"] == 2
        finished = [key for what, key in apps.executed(run_id) if what == "held"]
        # Each member finished once: the sibling in the other process was not run again.
        assert sorted(finished) == [f"{run_id}:tool:call_1", f"{run_id}:tool:call_2"]
