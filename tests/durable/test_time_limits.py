"""A step's time limits hold on every pool we recommend (each test runs on each): Celery
enforces them on prefork, the watchdog (tasks/watchdog.py) on a threads pool, where
Celery enforces none."""

from __future__ import annotations

import time

from tests.support import apps
from tests.support.cluster import Cluster

# Task limits: hard 6 + 1 (the chain's budget) = 7 s, soft 2 s.
LIMITS = {"AGENT_JOBS_STEP_TIME_LIMIT": "6", "AGENT_JOBS_EAGER_BUDGET": "1"}
TOOL_SECONDS = 30  # how long the `overrun` agent's tool runs if nothing stops it


def _starts(run_id: str) -> list[str]:
    return [what for what, _ in apps.executed(run_id) if what.startswith("loop:start:")]


def test_a_step_past_its_soft_time_limit_fails_and_the_run_goes_on(cluster: Cluster) -> None:
    cluster.worker(concurrency=2, restart=True, **LIMITS)
    started = time.monotonic()
    run_id = cluster.client.enqueue_run("overrun", "go", actor="user-7")
    run = cluster.wait(run_id)
    # Cut short by its soft limit: not the tool's 30 s (its own length, not a speed).
    assert time.monotonic() - started < TOOL_SECONDS
    assert run.status == "completed" and run.output == "went on"
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
    # The tool failed at its soft limit, and the model was told so.
    assert step["state"] == "done" and step["result"]["ok"] is False
    assert "SoftTimeLimitExceeded" in step["result"]["error"]
    assert ("loop:end", f"{run_id}:tool:call_1") not in apps.executed(run_id)
    assert len(_starts(run_id)) == 1


def test_a_step_past_its_hard_time_limit_is_given_up_and_sent_again(
    cluster: Cluster, worker_pool: str
) -> None:
    """The step ignores its soft limit; at the hard one its attempt is given up on (on
    prefork its process is killed; on threads its thread is fenced and interrupted) and
    the step is sent again, until it is a dead letter. No attempt's result is kept."""
    worker = cluster.worker(concurrency=4, restart=True, **LIMITS)
    run_id = cluster.client.enqueue_run("stubborn", "go", actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "failed" and run.error_type == "StepFailedError"
    assert "gave up after 3 attempts" in (run.error or ""), run.error
    assert len(_starts(run_id)) == 3
    assert ("loop:end", f"{run_id}:tool:call_1") not in apps.executed(run_id)
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
    assert step["state"] == "failed" and step["result"] is None
    if worker_pool == "threads":  # one process throughout: each attempt's thread was let go
        assert len({s.rsplit(":", 1)[1] for s in _starts(run_id)}) == 1
        assert worker.restarts == 0
        assert "passed its hard time limit in step tool:call_1" in worker.log()
