"""Recovery follows the death, not the lease: a step whose process was SIGKILLed runs
again within seconds, with the shipped lease and sweep settings."""

from __future__ import annotations

import os
import signal
import time

from . import apps
from .cluster import Cluster

SHIPPED = {
    "AGENT_JOBS_STEP_LEASE": "30",
    "AGENT_JOBS_SWEEP_STALE_AFTER": "60",
    "AGENT_JOBS_SWEEP_INTERVAL": "30",
}


def test_a_step_whose_process_was_killed_runs_again_within_seconds(cluster: Cluster) -> None:
    cluster.worker(concurrency=2, **SHIPPED)
    cluster.worker(concurrency=2, **SHIPPED)  # the redelivery may go to either worker
    for _ in range(5):
        run_id = cluster.client.enqueue_run("held", "go", actor="user-7")
        pid, _ = apps.wait_held_starts(run_id, 1, 30)[0]
        time.sleep(0.3)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        (_, again) = apps.wait_held_starts(run_id, 2, 10)[1]
        assert again - killed < 5, f"the step ran again {again - killed:.1f}s after the kill"
        run = cluster.wait(run_id, timeout=30)
        assert run.status == "completed" and run.output == "held done"
        step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
        assert step["state"] == "done" and step["attempts"] == 2
        assert apps.executed(run_id).count(("held", f"{run_id}:tool:call_1")) == 1
