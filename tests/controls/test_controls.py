"""Operator controls on the durable runner, with real workers on each pool (`cluster`):
pause at the next step boundary and resume, retry after a step error and after a dead
letter, fork at a model step and at a tool step; every refusal changes nothing.

The app (tests/controls_apps.py) counts every model call and tool run in a side table,
so a test sees from outside the workers how often each step really ran."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_jobs import session
from agent_jobs.client import Client
from agent_jobs.controls import Again
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.documents import run_document
from agent_jobs.errors import ControlRefusedError, InvalidRequestError, UnknownRunError
from agent_jobs.settings import Settings
from agent_jobs.store import RunView
from tests.support.apps import controls as controls_apps
from tests.support.apps import executed
from tests.support.cluster import Cluster
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually, wait_status
from tests.support.workers import Process

APP = "tests.support.apps.controls:app"


class Controls:
    """The cluster, its workers on the controls app, and what a test looks at."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self.gates = tmp / "gates"
        self.gates.mkdir()
        settings = Settings(
            broker_url=cluster.broker, database_url=cluster.pg_url, queue=SESSION_QUEUE
        )
        self.client = Client(
            cluster.store, controls_apps.app, settings, CeleryDispatcher(cluster.celery)
        )
        self.redis = redis.Redis.from_url(cluster.broker)

    def worker(self, **extra: Any) -> Process:
        return self.cluster.worker(AGENT_JOBS_APP=APP, TEST_GATE_DIR=str(self.gates), **extra)

    def open_gate(self, run_id: str) -> None:
        (self.gates / run_id).touch()

    def wait_for(self, check: Callable[[], Any], what: str) -> Any:
        return eventually(check, what=what, context=self.logs)

    def wait_status(self, run_id: str, status: str) -> RunView:
        return wait_status(self.store, run_id, status, strict=True, context=self.logs)

    def steps(self, run_id: str) -> dict[str, dict[str, Any]]:
        return {row["step"]: row for row in self.store.journal(run_id)}

    def held(self, run_id: str) -> list[str]:
        """What of the run a worker holds: steps in flight or claimed, leases in Redis,
        the run among what a process works on."""
        found = [
            f"row {row['step']} {row['state']} {row['holder']}"
            for row in self.store.journal(run_id)
            if row["state"] in ("scheduled", "started")
        ]
        found += [key.decode() for key in self.redis.scan_iter(f"agent_jobs:lease:{run_id}:*")]
        for key in self.redis.scan_iter("agent_jobs:holds:*"):
            members = self.redis.smembers(key)  # type: ignore[union-attr]
            found += [m.decode() for m in members if m.decode().startswith(run_id)]
        return found

    def controls(self, run_id: str) -> list[tuple[str, str]]:
        """(event, who asked) of the run's controls, as `status --json` shows them."""
        doc = run_document(self.store, self.store.get_run(run_id))
        return [(c["event"], c["by"]) for c in doc["controls"]]

    def snapshot(self, run_id: str) -> tuple[Any, ...]:
        """What a refused control must leave as it was."""
        run = self.store.get_run(run_id).model_dump()
        events = [e.model_dump() for e in self.client.events(run_id)]
        return run, self.store.journal(run_id), events, self.store.tool_calls(run_id)

    def logs(self) -> str:
        return self.cluster.logs()


@pytest.fixture
def controls(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Controls]:
    made = Controls(cluster, tmp_path)
    monkeypatch.setenv("TEST_GATE_DIR", str(made.gates))
    yield made
    made.redis.close()


def ran(run_id: str) -> list[str]:
    return [what for what, _ in executed(run_id)]


TASK = re.compile(r"Task agent_jobs\.\w+\[([0-9a-f-]+)\] (received|succeeded|raised|retry|failed)")


def tasks(worker: Process) -> tuple[set[str], set[str]]:
    """The ids of the tasks the worker received, and of those that ended, by its log."""
    received: set[str] = set()
    ended: set[str] = set()
    for task_id, what in TASK.findall(worker.log()):
        (received if what == "received" else ended).add(task_id)
    return received, ended


def then_a_pass(worker: Process, act: Callable[[], Any]) -> None:
    """`act`, once every task the worker received has ended; then wait until a task it
    received after `act` has ended: the system had its chance to act on it."""

    def settled() -> set[str] | None:
        received, ended = tasks(worker)
        return received | {"-"} if received <= ended else None

    before = eventually(settled, what="the worker's tasks to end", context=worker.log)
    act()
    eventually(
        lambda: tasks(worker)[1] - before,
        what="a task received after it to end",
        context=lambda: worker.log()[-6000:],
    )


# --- pause and resume ---------------------------------------------------------------------


def test_a_paused_run_stops_at_its_next_boundary_holds_nothing_and_resumes(
    controls: Controls,
) -> None:
    worker = controls.worker()
    client = controls.client
    run_id = client.enqueue_run("pausable", "go", actor="user-7")
    controls.wait_for(lambda: "crawl:start" in ran(run_id), "the slow read to start")
    assert client.pause(run_id, actor="alice") == [run_id]

    # The read in flight ends; the run stops at the boundary right after it.
    run = controls.wait_status(run_id, "paused")
    assert run.waiting_on == "paused by alice" and run.pause_requested_by == "alice"
    assert ran(run_id) == ["model", "crawl:start", "crawl"]
    steps = controls.steps(run_id)
    assert steps["tool:call_1"]["state"] == "done"
    assert max(steps.values(), key=lambda r: r["seq"])["step"] == "tool:call_1"

    # While it is paused nothing of it runs, nothing is held, and a wake-up changes nothing.
    journal = controls.store.journal(run_id)
    then_a_pass(worker, lambda: client.wake(run_id))
    assert controls.store.get_run(run_id).status == "paused"
    assert controls.store.journal(run_id) == journal
    assert ran(run_id) == ["model", "crawl:start", "crawl"]
    assert controls.held(run_id) == []
    assert controls.controls(run_id) == [("run/pause", "alice"), ("run/paused", "alice")]
    with pytest.raises(ControlRefusedError, match="paused already"):
        client.pause(run_id, actor="alice")

    assert client.resume(run_id, actor="backend") == [run_id]
    run = controls.cluster.wait(run_id)
    assert run.status == "completed" and run.output == "all crawled"
    assert ran(run_id) == [
        "model",
        "crawl:start",
        "crawl",
        "model",
        "crawl:start",
        "crawl",
        "model",
    ]
    assert controls.controls(run_id)[-1] == ("run/resume", "backend")
    frames = [f for f in client_frames(controls, run_id) if f["type"] == "status"]
    assert {"type": "status", "run_id": run_id, "status": "paused", "by": "alice"} in frames


def client_frames(controls: Controls, run_id: str) -> list[dict[str, Any]]:
    import json

    entries = controls.redis.xrange(f"agent_jobs:stream:{run_id}")
    return [json.loads(fields[b"frame"]) for _, fields in entries]


def test_a_run_paused_while_it_waits_for_a_person_runs_nothing_until_resumed(
    controls: Controls,
) -> None:
    worker = controls.worker()
    client = controls.client
    run_id = client.enqueue_run("forkable", "go", actor="user-7")
    controls.wait_status(run_id, "awaiting_approval")
    client.pause(run_id, actor="alice")
    run = controls.wait_status(run_id, "paused")
    assert run.waiting_on == "paused by alice"

    # The decision is recorded, and wakes the run: it stays paused, the charge does not run.
    then_a_pass(worker, lambda: client.approve(run_id, "call_2", actor="alice"))
    assert controls.store.get_run(run_id).status == "paused"
    assert "charge" not in ran(run_id)
    assert controls.held(run_id) == []

    client.resume(run_id, actor="alice")
    run = controls.cluster.wait(run_id)
    assert run.status == "completed" and ran(run_id).count("charge") == 1


# --- retry --------------------------------------------------------------------------------


def test_a_run_that_failed_on_a_step_error_runs_the_step_again_once_and_completes(
    controls: Controls,
) -> None:
    controls.worker()
    client = controls.client
    run_id = client.enqueue_run("flaky", "go", actor="user-7")
    run = controls.cluster.wait(run_id)
    assert run.status == "failed" and run.error_type == "StepFailedError"
    failed = controls.steps(run_id)["model:2"]
    assert failed["state"] == "failed"
    assert ran(run_id) == ["model", "peek", "model"]

    controls.open_gate(run_id)
    retried = client.retry(run_id, actor="alice")
    assert retried.steps == ["model:2"]
    run = controls.cluster.wait(run_id)
    assert run.status == "completed" and run.output == "answered after all"
    assert run.error is None and run.error_type is None
    assert ran(run_id) == ["model", "peek", "model", "model"]  # model:2 once more
    steps = controls.steps(run_id)
    assert steps["model:2"] == failed  # the failed row stays as it was
    again = steps["retry:1:model:2"]
    assert again["state"] == "done" and again["attempts"] == 1
    assert [u["step"] for u in controls.store.usage(run_id)] == ["model:1", "model:2"]
    assert controls.controls(run_id) == [("run/retry", "alice")]
    with pytest.raises(ControlRefusedError, match="only a run that failed"):
        client.retry(run_id, actor="alice")


def test_a_run_that_failed_on_a_dead_letter_runs_the_step_again_and_completes(
    controls: Controls,
) -> None:
    # The read kills its worker: given up after one delivery. On a threads pool the
    # whole worker dies, and is started again.
    controls.worker(concurrency=1, restart=True, AGENT_JOBS_STEP_MAX_ATTEMPTS="1")
    controls.cluster.beat()
    client = controls.client
    run_id = client.enqueue_run("crashing", "go", actor="user-7")
    run = controls.cluster.wait(run_id)
    assert run.status == "failed" and "gave up after 1 attempts" in (run.error or "")
    assert ran(run_id).count("shaky") == 1

    controls.open_gate(run_id)
    assert client.retry(run_id, actor="alice").steps == ["tool:call_1"]
    run = controls.cluster.wait(run_id)
    assert run.status == "completed" and run.output == "survived"
    assert ran(run_id).count("shaky") == 2  # once more, with a fresh attempt count
    steps = controls.steps(run_id)
    assert steps["tool:call_1"]["state"] == "failed"
    assert steps["retry:1:tool:call_1"]["state"] == "done"
    assert steps["retry:1:tool:call_1"]["attempts"] == 1


# --- fork -----------------------------------------------------------------------------------


def approved_run(controls: Controls, agent: str = "forkable") -> str:
    run_id = controls.client.enqueue_run(agent, "charge order 42", actor="user-7")
    controls.wait_status(run_id, "awaiting_approval")
    assert controls.client.approve(run_id, "call_2", actor="alice")
    assert controls.cluster.wait(run_id).status == "completed"
    return run_id


def messages(controls: Controls, run_id: str) -> list[tuple[str, str]]:
    thread = controls.store.get_run(run_id).thread_id
    return [(m.role, m.content) for m in controls.store.thread_messages(thread)]


def test_a_fork_at_a_model_step_reuses_the_steps_before_and_runs_the_rest(
    controls: Controls,
) -> None:
    controls.worker()
    client = controls.client
    source = approved_run(controls)
    before = controls.snapshot(source)

    forked = client.fork(source, "model:2", actor="alice")
    assert forked.runs_again == [Again("tool:call_2", "charge", "call_2")]
    assert forked.asked_again == [Again("approval:call_2", "charge", "call_2")]
    fork = controls.store.get_run(forked.run_id)
    assert forked.run_id != source and fork.thread_id not in (source, before[0]["thread_id"])
    assert fork.metadata["forked_from"] == {"run_id": source, "step": "model:2", "by": "alice"}

    controls.wait_status(forked.run_id, "awaiting_approval")  # the charge is asked again
    assert client.approve(forked.run_id, "call_2", actor="alice")
    run = controls.cluster.wait(forked.run_id)
    assert run.status == "completed" and run.output == "Order 42 charged."
    # Steps before model:2 were read back; model:2 and what follows ran again.
    assert ran(forked.run_id) == ["model", "charge", "model"]
    src, new = controls.steps(source), controls.steps(forked.run_id)
    assert list(new) == list(src)
    prefix = [s for s, row in src.items() if row["seq"] < src["model:2"]["seq"]]
    assert prefix[-1] == "prepare:2"
    assert all(new[s]["result"] == src[s]["result"] for s in prefix)
    assert [u["step"] for u in controls.store.usage(forked.run_id)] == ["model:2", "model:3"]
    assert messages(controls, forked.run_id) == messages(controls, source)
    assert controls.controls(forked.run_id)[0] == ("run/fork", "alice")
    assert controls.controls(source) == [("run/forked", "alice")]
    assert controls.snapshot(source)[1:2] == before[1:2]  # its journal: untouched


def test_a_fork_at_a_tool_step_runs_the_tool_again_and_refusals_change_nothing(
    controls: Controls,
) -> None:
    controls.worker()
    client = controls.client
    source = approved_run(controls)

    # The lead keeps the decision made before the fork point, as theirs: not asked again.
    forked = client.fork(source, "tool:call_2", actor="alice", keep_decisions=True)
    assert forked.runs_again == [Again("tool:call_2", "charge", "call_2")]
    assert forked.kept_decisions == [Again("approval:call_2", "charge", "call_2")]
    run = controls.cluster.wait(forked.run_id)
    assert run.status == "completed" and run.output == "Order 42 charged."
    assert ran(forked.run_id) == ["charge", "model"]
    assert [c["status"] for c in controls.store.tool_calls(forked.run_id)] == [
        "executed",
        "executed",
    ]

    fanned = client.enqueue_run("fanning", "go", actor="user-7")
    assert controls.cluster.wait(fanned).status == "completed"
    before = [controls.snapshot(source), controls.snapshot(fanned)]
    refused: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: client.fork(source, "tool:call_9", actor="alice"), InvalidRequestError, "no step"),
        (lambda: client.fork(source, "usage:1", actor="alice"), InvalidRequestError, "tokens"),
        (lambda: client.fork(fanned, "tool:call_2", actor="alice"), InvalidRequestError, "fan-out"),
        (lambda: client.fork("nope", "model:1", actor="alice"), UnknownRunError, "nope"),
        (lambda: client.fork(source, "model:1", actor=""), InvalidRequestError, "actor"),
        (lambda: client.retry(source, actor="alice"), ControlRefusedError, "completed"),
        (lambda: client.pause(source, actor="alice"), ControlRefusedError, "has ended"),
        (lambda: client.resume(source, actor="alice"), ControlRefusedError, "has ended"),
    ]
    runs = len(controls.store.list_runs(limit=100))
    for attempt, kind, says in refused:
        with pytest.raises(kind, match=says):
            attempt()
    assert [controls.snapshot(source), controls.snapshot(fanned)] == before
    assert len(controls.store.list_runs(limit=100)) == runs

    # At the fan-out's first step: both reads run again.
    again = client.fork(fanned, "tool:call_1", actor="alice")
    assert again.runs_again == []
    assert controls.cluster.wait(again.run_id).status == "completed"
    assert sorted(ran(again.run_id)) == ["model", "peek", "peek"]


def test_the_session_log_names_every_control() -> None:
    assert set(session.CONTROLS) == {
        "run/pause",
        "run/paused",
        "run/resume",
        "run/retry",
        "run/fork",
        "run/forked",
    }
