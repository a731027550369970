"""Recovery follows the death, not the lease: a step whose process was SIGKILLed runs
again within seconds, with the shipped lease and sweep settings."""

from __future__ import annotations

import os
import signal
import time

from sqlalchemy import select

from . import apps
from .cluster import Cluster

SHIPPED = {
    "AGENT_JOBS_STEP_LEASE": "30",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "60",
    "AGENT_JOBS_SWEEP_INTERVAL": "30",
}


def starts(run_id: str) -> list[tuple[int, float]]:
    with apps.side_engine().connect() as conn:
        rows = conn.execute(
            select(apps.executions.c.what, apps.executions.c.at)
            .where(apps.executions.c.run_id == run_id)
            .where(apps.executions.c.what.like("held:start:%"))
            .order_by(apps.executions.c.id)
        ).all()
    return [(int(r.what.rsplit(":", 1)[1]), r.at.timestamp()) for r in rows]


def wait_starts(run_id: str, n: int, timeout: float) -> list[tuple[int, float]]:
    deadline = time.monotonic() + timeout
    while len(found := starts(run_id)) < n:
        assert time.monotonic() < deadline, f"the step started {len(found)} times, not {n}"
        time.sleep(0.02)
    return found


def test_a_step_whose_process_was_killed_runs_again_within_seconds(cluster: Cluster) -> None:
    cluster.worker(concurrency=2, **SHIPPED)
    cluster.worker(concurrency=2, **SHIPPED)  # the redelivery may go to either worker
    for _ in range(5):
        run_id = cluster.client.enqueue_run("held", "go", actor="user-7")
        pid, _ = wait_starts(run_id, 1, 30)[0]
        time.sleep(0.3)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        (_, again) = wait_starts(run_id, 2, 10)[1]
        assert again - killed < 5, f"the step ran again {again - killed:.1f}s after the kill"
        run = cluster.wait(run_id, timeout=30)
        assert run.status == "completed" and run.output == "held done"
        step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
        assert step["state"] == "done" and step["attempts"] == 2
        assert apps.executed(run_id).count(("held", f"{run_id}:tool:call_1")) == 1
