"""An MCP action whose worker is SIGKILLed in the middle of the call: its outcome is
unknown, so it is not called again blindly. The run waits, `awaiting_reconcile`, with an
`outcome_unknown` frame, until a person says how the call ended."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import redis

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.settings import Settings
from tests.mcp.conftest import ServerLog
from tests.support.apps.mcp import app
from tests.support.cluster import Cluster
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually, wait_status

APP = "tests.support.apps.mcp:app"


def parent_of(pid: int) -> int:
    """The process that started `pid` (a stdio server's: the worker process that called)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def test_an_mcp_action_whose_worker_dies_mid_call_waits_for_a_person(
    cluster: Cluster, server_log: ServerLog, gates: Path
) -> None:
    gate = gates / "held"
    gate.unlink(missing_ok=True)
    settings = Settings(broker_url=cluster.broker, database_url=cluster.pg_url, queue=SESSION_QUEUE)
    client = Client(cluster.store, app, settings, CeleryDispatcher(cluster.celery))
    workers = [cluster.worker(concurrency=2, AGENT_JOBS_APP=APP) for _ in range(2)]
    for worker in workers:
        eventually(lambda w=worker: " ready." in w.log(), what="a worker to be up")
    started = len(server_log.calls("write_file:start"))

    run_id = client.enqueue_run("held_writer", "write", actor="user-7")
    wait_status(cluster.store, run_id, "awaiting_approval", strict=True)
    assert client.approve(run_id, "call_1", actor="alice")
    [(_, server, _)] = eventually(
        lambda: server_log.calls("write_file:start")[started:],
        what="the server to have begun the call",
    )
    # The worker whose process called the server, killed whole: no cleanup, no ack.
    group = os.getpgid(parent_of(server))
    [victim] = [w for w in workers if w.proc is not None and w.proc.pid == group]
    victim.kill()
    cluster.procs.remove(victim)

    wait_status(
        cluster.store,
        run_id,
        "awaiting_reconcile",
        strict=True,
        context=lambda: f"{cluster.store.journal(run_id)}\n{cluster.logs()}",
    )
    frames = _frames(cluster, run_id)
    [unknown] = [f for f in frames if f["type"] == "outcome_unknown"]
    assert unknown["tool"] == "files.write_file" and unknown["call_id"] == "call_1"
    assert unknown["idempotency_key"] == f"{run_id}:tool:call_1"
    step = {j["step"]: j for j in cluster.store.journal(run_id)}["tool:call_1"]
    assert step["state"] == "waiting"
    # Not called again: one start of the call, on the server of the killed worker.
    assert len(server_log.calls("write_file:start")[started:]) == 1

    # A person says it failed; the model is told, and the run ends.
    assert client.reconcile(run_id, "call_1", "failed", actor="alice", error="not written")
    run = cluster.wait(run_id)
    assert run.status == "completed", (run.error, cluster.logs())
    assert len(server_log.calls("write_file:start")[started:]) == 1
    gate.touch()


def _frames(cluster: Cluster, run_id: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(cluster.broker)
    try:
        entries = client.xrange(f"agent_jobs:stream:{run_id}")
        return [json.loads(fields[b"frame"]) for _, fields in entries]
    finally:
        client.close()
