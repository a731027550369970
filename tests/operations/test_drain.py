"""`agent-jobs runs --unfinished --by-shape`: the runs in flight counted by loop shape.

Real durable runs recorded by workers whose code takes different shapes: today's, one
that predates the parallel-tools patch and one that predates approvals-at-once
(`AGENT_JOBS_DISABLED_PATCHES`, as `tests/unit/record_journals.py` records the old
shapes). Each run parks on an approval, so it stays unfinished; one more is queued
where no worker reads and has reached nothing yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher, celery_client
from agent_jobs.loop import APPROVALS_AT_ONCE, HISTORY_SELECT, PARALLEL_TOOLS
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from tests.support import apps
from tests.support import encryption as test_encryption
from tests.support.doors import wait_for
from tests.support.redis_server import RedisServer
from tests.support.services import truncate_all
from tests.support.workers import ROOT, Process, service_env, start_worker

SHAPES = {"today": "", "no-parallel": PARALLEL_TOOLS, "no-approvals-at-once": APPROVALS_AT_ONCE}


class Fleet:
    """A worker per code version, each on a queue of its own, and a client for each."""

    def __init__(self, broker: str, pg_url: str) -> None:
        self.broker = broker
        self.pg_url = pg_url
        self.store = Store.from_url(pg_url)
        truncate_all(self.store)
        apps.side_engine()  # the apps' side table made here: two workers making it collide
        self.workers: list[Process] = []
        self.clients: dict[str, Client] = {}
        self.celeries = []
        for name, disabled in SHAPES.items():
            env = service_env(
                broker, pg_url, AGENT_JOBS_QUEUE=name, AGENT_JOBS_DISABLED_PATCHES=disabled
            )
            self.workers.append(start_worker(env, concurrency=2, name=name, pool="threads"))
        for name in [*SHAPES, "nowhere"]:
            celery = celery_client(broker, name)
            self.celeries.append(celery)
            settings = Settings(broker_url=broker, database_url=pg_url, queue=name)
            self.clients[name] = Client(self.store, apps.app, settings, CeleryDispatcher(celery))

    def parked(self, code: str, agent: str) -> str:
        run_id = self.clients[code].enqueue_run(agent, "go", actor="user-7")

        def parked() -> bool:
            run = self.store.get_run(run_id)
            assert not run.finished, (run.status, run.error)
            return run.status == "awaiting_approval"

        wait_for(parked, f"{run_id} to wait for approval")
        return run_id

    def close(self) -> None:
        for proc in self.workers:
            proc.stop()
        for celery in self.celeries:
            celery.close()
        self.store.engine.dispose()


@pytest.fixture
def fleet(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)  # tests.apps records here
    server = RedisServer().start()
    made = Fleet(server.url(0), pg_url)
    try:
        yield made
    finally:
        made.close()
        server.close()


def drain(pg_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = test_encryption.bare_environ()
    environment |= {
        "AGENT_JOBS_DATABASE_URL": pg_url,
        "AGENT_JOBS_APP": "tests.support.apps:app",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "runs", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def shapes_of(doc: dict[str, Any]) -> dict[tuple[tuple[str, ...], tuple[str, ...]], int]:
    return {(tuple(s["took"]), tuple(s["refused"])): s["runs"] for s in doc["shapes"]}


@pytest.mark.pools_named
def test_unfinished_runs_are_counted_by_the_patches_they_took_and_refused(fleet: Fleet) -> None:
    fleet.parked("today", "gated")  # a read and a refund at once: both patches
    fleet.parked("today", "support")  # two reads at once, then a refund alone
    no_parallel = fleet.parked("no-parallel", "gated")  # one call after the other
    fleet.parked("no-approvals-at-once", "gated")  # reads at once, approvals one by one
    queued = fleet.clients["nowhere"].enqueue_run("gated", "go", actor="user-7")
    finished = fleet.clients["today"].enqueue_run("w1", "go", actor="user-7")
    wait_for(lambda: fleet.store.get_run(finished).finished, "the w1 run to end")

    listed = drain(fleet.pg_url, "--unfinished", "--by-shape", "--json")

    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["unfinished"] == 5 and doc["unreplayable"] == [] and doc["inline"] == 0
    assert shapes_of(doc) == {
        ((PARALLEL_TOOLS, APPROVALS_AT_ONCE), ()): 1,
        ((PARALLEL_TOOLS,), ()): 1,  # approvals-at-once never asked: all reads, then one call
        ((PARALLEL_TOOLS,), (APPROVALS_AT_ONCE,)): 1,
        ((), (PARALLEL_TOOLS,)): 1,
        ((), ()): 1,  # the queued run has reached no question yet
    }
    patches = doc["patches"]
    assert list(patches) == [HISTORY_SELECT, PARALLEL_TOOLS, APPROVALS_AT_ONCE]
    assert patches[PARALLEL_TOOLS] == {
        "took": 3,
        "refused": 1,
        "old_branch_needed": True,
        "disabled": False,
    }
    assert patches[APPROVALS_AT_ONCE]["refused"] == 1
    assert patches[HISTORY_SELECT]["old_branch_needed"] is False

    text = drain(fleet.pg_url, "--unfinished", "--by-shape")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "shape: agent:parallel-tools, agent:approvals-at-once  runs: 1" in lines
    assert "shape: (none)  refused: agent:parallel-tools  runs: 1" in lines
    assert (
        "agent:parallel-tools: taken by 3, refused by 1; its old branch is still needed by 1 run"
    ) in lines

    plain = drain(fleet.pg_url, "--unfinished", "--json")
    assert plain.returncode == 0, plain.stderr
    assert len(json.loads(plain.stdout)) == 5 and queued in plain.stdout

    # The run on the old shape finishes: no unfinished run needs that branch any more.
    [call] = fleet.store.pending_calls(no_parallel)
    fleet.clients["no-parallel"].approve(no_parallel, call["call_id"], actor="alice")
    wait_for(lambda: fleet.store.get_run(no_parallel).finished, "the old-shape run to end")
    after = json.loads(drain(fleet.pg_url, "--by-shape", "--unfinished", "--json").stdout)
    assert after["patches"][PARALLEL_TOOLS]["old_branch_needed"] is False
    assert after["unfinished"] == 4

    # A patch this deployment disables: new runs take its old branch, so it is needed.
    held = drain(
        fleet.pg_url, "--unfinished", "--by-shape", AGENT_JOBS_DISABLED_PATCHES=HISTORY_SELECT
    )
    assert f"{HISTORY_SELECT}: taken by 0, refused by 0; disabled here" in held.stdout


def test_by_shape_refuses_a_status_filter(pg_url: str) -> None:
    refused = drain(pg_url, "--by-shape", "--status", "running")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: --status goes with neither --unfinished nor --by-shape"
