"""Outcome unknown, not a blind retry: a non-idempotent action whose worker is SIGKILLed
in the middle of its handler is not run again. The run waits, `awaiting_reconcile`, with an
`outcome_unknown` frame, until the tool's `reconcile` or a person says how the call ended.

Real workers (on each pool, `worker_pool`), Postgres and Redis; the handlers count their
starts in a side table (tests/reconcile_apps.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import redis

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.leases import Holder, Leases
from agent_jobs.settings import Settings
from agent_jobs.store import RunView
from tests.support.apps import executed
from tests.support.apps import reconcile as reconcile_apps
from tests.support.cluster import Cluster
from tests.support.doors import cli
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually, wait_status
from tests.support.workers import Process

APP = "tests.support.apps.reconcile:app"


class Outcomes:
    """The cluster, its workers on the outcome-unknown app, and what a test looks at."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.gates = tmp / "gates"
        self.gates.mkdir()
        settings = Settings(
            broker_url=cluster.broker, database_url=cluster.pg_url, queue=SESSION_QUEUE
        )
        dispatcher = CeleryDispatcher(cluster.celery)
        self.client = Client(cluster.store, reconcile_apps.app, settings, dispatcher)
        self.redis = redis.Redis.from_url(cluster.broker)

    def env(self) -> dict[str, str]:
        return self.cluster.env(AGENT_JOBS_APP=APP, TEST_GATE_DIR=str(self.gates))

    def worker(self, *, restart: bool = False, **extra: str) -> Process:
        return self.cluster.worker(
            concurrency=2,
            restart=restart,
            AGENT_JOBS_APP=APP,
            TEST_GATE_DIR=str(self.gates),
            **extra,
        )

    def steady(self) -> None:
        """Every worker is up (a restarted one too). Each process says it lives before
        its first task goes on, so one killed in a handler is known to have lived."""
        for proc in self.cluster.procs:
            if proc.name != "worker":
                continue
            eventually(
                lambda p=proc: p.running and p.log().count(" ready.") > p.restarts,
                what=f"{proc.name} to be up",
                context=proc.log,
            )

    def approved(self, agent: str) -> str:
        """A run of `agent` whose one action call is approved: its handler starts."""
        self.steady()
        run_id = self.client.enqueue_run(agent, "go", actor="user-7")
        self.wait_status(run_id, "awaiting_approval")
        assert self.client.approve(run_id, "call_1", actor="alice")
        return run_id

    def starts(self, run_id: str, what: str) -> list[int]:
        """The pid of each process that began the run's `what` handler, in order."""
        prefix = f"{what}:start:"
        return [int(w.rsplit(":", 1)[1]) for w, _ in executed(run_id) if w.startswith(prefix)]

    def wait_starts(self, run_id: str, what: str, n: int) -> list[int]:
        return eventually(
            lambda: (found := self.starts(run_id, what))[n - 1 :] and found,
            what=f"{what} of {run_id} to have begun {n} time(s)",
            context=self.logs,
        )

    def wait_status(self, run_id: str, status: str) -> RunView:
        return wait_status(
            self.cluster.store,
            run_id,
            status,
            strict=True,
            context=lambda: f"{self.cluster.store.journal(run_id)}\n{self.logs()}",
        )

    def wait_recovered(self, pid: int) -> None:
        """Every recovery the death of process `pid` sets off has had its chance: the
        process is taken (its steps sent again, if anyone was to send them), and what
        was sent has been taken from the queue."""

        def taken() -> bool:
            alive = [Holder.of_process(p) for p in Leases(self.redis).processes()]
            return all(h is None or h.pid != pid for h in alive)

        eventually(taken, what=f"process {pid} to be taken for dead", context=self.logs)
        eventually(
            lambda: self.redis.llen(SESSION_QUEUE) == 0,
            what="the steps sent again to be taken",
            context=self.logs,
        )

    def open_gate(self, run_id: str) -> None:
        (self.gates / run_id).touch()

    def frames(self, run_id: str) -> list[dict[str, Any]]:
        entries = self.redis.xrange(f"agent_jobs:stream:{run_id}")
        return [json.loads(fields[b"frame"]) for _, fields in entries]

    def step_row(self, run_id: str, step: str = "tool:call_1") -> dict[str, Any]:
        return {j["step"]: j for j in self.cluster.store.journal(run_id)}[step]

    def tool_message(self, run_id: str) -> Any:
        thread_id = self.client.get_run(run_id).thread_id
        [message] = [m for m in self.cluster.store.thread_messages(thread_id) if m.role == "tool"]
        return message

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, env=self.env())

    def snapshot(self, run_id: str) -> tuple[Any, ...]:
        """What a refused decision must leave as it was."""
        run = self.client.get_run(run_id).model_dump(exclude={"updated_at"})
        call = self.cluster.store.tool_call(run_id, "call_1")
        return run, call, self.cluster.store.journal(run_id)

    def logs(self) -> str:
        return self.cluster.logs()

    def close(self) -> None:
        self.redis.close()


def kill_the_process(outcomes: Outcomes, pid: int) -> None:
    """SIGKILL the process running the handler: on prefork a pool process (its worker
    hands the message back), on threads the whole worker (started again)."""
    os.kill(pid, signal.SIGKILL)


def kill_its_worker(outcomes: Outcomes, pid: int) -> None:
    """SIGKILL the whole worker the handler runs in: another sees it stopped beating."""
    group = os.getpgid(pid)
    [worker] = [p for p in outcomes.cluster.procs if p.proc is not None and p.proc.pid == group]
    worker.kill()
    outcomes.cluster.procs.remove(worker)


def parked_after_a_kill(outcomes: Outcomes, agent: str, what: str, kill: Any) -> str:
    """A run of `agent` whose handler `what` was killed midway: it waits for a person,
    having begun the handler once. Returns the run id."""
    run_id = outcomes.approved(agent)
    [pid] = outcomes.wait_starts(run_id, what, 1)  # inside the handler, at its gate
    kill(outcomes, pid)
    outcomes.wait_status(run_id, "awaiting_reconcile")
    run = outcomes.client.get_run(run_id)
    assert run.waiting_on == f"awaiting_reconcile {what} call_1"
    assert outcomes.step_row(run_id)["state"] == "waiting"
    outcomes.wait_recovered(pid)  # whatever recovery would do, it has done…
    # …and nothing ran the handler again.
    assert len(outcomes.starts(run_id, what)) == 1, executed(run_id)
    assert outcomes.client.get_run(run_id).status == "awaiting_reconcile"
    [unknown] = [f for f in outcomes.frames(run_id) if f["type"] == "outcome_unknown"]
    assert unknown == {
        "type": "outcome_unknown",
        "run_id": run_id,
        "call_id": "call_1",
        "tool": what,
        "args": {"order_id": "A1"},
        "idempotency_key": f"{run_id}:tool:call_1",
    }
    statuses = [f.get("status") for f in outcomes.frames(run_id) if f["type"] == "status"]
    assert statuses[-1] == "awaiting_reconcile"
    return run_id


def test_a_killed_action_waits_for_a_person_who_says_how_it_ended(
    cluster: Cluster, tmp_path: Path
) -> None:
    outcomes = Outcomes(cluster, tmp_path)
    outcomes.worker(restart=True)
    outcomes.worker(restart=True)

    # Succeeded: the person's result is the call's, and the run goes on.
    run_id = parked_after_a_kill(outcomes, "payer", "pay", kill_the_process)
    result = {"paid": "A1", "checked": "by hand"}
    done = outcomes.cli(
        "reconcile", run_id, "call_1", "--succeeded", json.dumps(result), "--actor", "alice"
    )
    assert done.returncode == 0, done.stderr
    assert "recorded as succeeded" in done.stdout
    run = cluster.wait(run_id)
    assert run.status == "completed" and run.output == "all done"
    message = outcomes.tool_message(run_id)
    assert json.loads(message.content) == result and not message.is_error
    assert outcomes.cluster.store.tool_call(run_id, "call_1")["status"] == "executed"
    assert outcomes.cluster.store.tool_call(run_id, "call_1")["handler_started_at"] is None
    assert outcomes.step_row(run_id)["result"]["reconciled"]["by"] == "alice"
    assert len(outcomes.starts(run_id, "pay")) == 1
    assert [f["status"] for f in outcomes.frames(run_id) if f["type"] == "status"][-2:] == [
        "awaiting_reconcile",
        "running",
    ]

    # Failed: the model is told the person's message as the tool's error.
    run_id = parked_after_a_kill(outcomes, "payer", "pay", kill_the_process)
    done = outcomes.cli(
        "reconcile", run_id, "call_1", "--failed", "the bank refused it", "--actor", "carol"
    )
    assert done.returncode == 0, done.stderr
    assert cluster.wait(run_id).status == "completed"
    message = outcomes.tool_message(run_id)
    assert message.is_error and json.loads(message.content) == {"error": "the bank refused it"}
    assert outcomes.cluster.store.tool_call(run_id, "call_1")["status"] == "failed"
    assert len(outcomes.starts(run_id, "pay")) == 1

    # Retry: the handler runs a second time, to its end.
    run_id = parked_after_a_kill(outcomes, "payer", "pay", kill_the_process)
    outcomes.open_gate(run_id)
    assert outcomes.client.reconcile(run_id, "call_1", "retry", actor="backend")
    run = cluster.wait(run_id)
    assert run.status == "completed", (run.error, outcomes.logs())
    assert len(outcomes.starts(run_id, "pay")) == 2
    assert [w for w, _ in executed(run_id) if w == "pay"] == ["pay"]
    assert json.loads(outcomes.tool_message(run_id).content) == {"paid": "A1"}
    outcomes.close()


def test_an_action_whose_whole_worker_was_killed_waits_for_a_person(
    cluster: Cluster, tmp_path: Path
) -> None:
    outcomes = Outcomes(cluster, tmp_path)
    outcomes.worker()
    outcomes.worker()
    run_id = parked_after_a_kill(outcomes, "payer", "pay", kill_its_worker)
    outcomes.open_gate(run_id)
    assert outcomes.client.reconcile(run_id, "call_1", "retry", actor="alice")
    assert cluster.wait(run_id).status == "completed"
    assert len(outcomes.starts(run_id, "pay")) == 2
    outcomes.close()


def test_a_tool_that_reconciles_itself_an_idempotent_one_and_one_that_asks_need_no_person(
    cluster: Cluster, tmp_path: Path
) -> None:
    outcomes = Outcomes(cluster, tmp_path)
    outcomes.worker(restart=True)
    outcomes.worker(restart=True)

    # `reconcile(ctx)` finds the charge by its idempotency key: its result is the call's.
    run_id = outcomes.approved("charger")
    [pid] = outcomes.wait_starts(run_id, "charge", 1)
    kill_the_process(outcomes, pid)
    run = cluster.wait(run_id)
    assert run.status == "completed", (run.error, outcomes.logs())
    key = f"{run_id}:tool:call_1"
    assert json.loads(outcomes.tool_message(run_id).content) == {"charged": "A1", "found_by": key}
    assert len(outcomes.starts(run_id, "charge")) == 1
    assert "outcome_unknown" not in [f["type"] for f in outcomes.frames(run_id)]
    assert outcomes.step_row(run_id)["result"]["reconciled"]["by"] == "reconcile"

    # idempotent=True: today's at-least-once retry, the handler runs again to its end.
    run_id = outcomes.approved("payer_again")
    [pid] = outcomes.wait_starts(run_id, "pay_again", 1)
    kill_the_process(outcomes, pid)
    outcomes.wait_starts(run_id, "pay_again", 2)
    outcomes.open_gate(run_id)
    run = cluster.wait(run_id)
    assert run.status == "completed", (run.error, outcomes.logs())
    assert len(outcomes.starts(run_id, "pay_again")) == 2
    assert "outcome_unknown" not in [f["type"] for f in outcomes.frames(run_id)]
    assert outcomes.step_row(run_id)["attempts"] == 2

    # A handler that asked the person runs again with the answers: its outcome was known.
    run_id = outcomes.approved("asking_payer")
    outcomes.wait_status(run_id, "awaiting_answers")
    assert outcomes.client.answer(run_id, "call_1:1", {"q1": "savings"}, actor="user-7")
    run = cluster.wait(run_id)
    assert run.status == "completed", (run.error, outcomes.logs())
    assert json.loads(outcomes.tool_message(run_id).content) == {"paid": "A1", "from": "savings"}
    assert len(outcomes.starts(run_id, "pay_asking")) == 2
    assert outcomes.cluster.store.tool_call(run_id, "call_1")["handler_started_at"] is None
    outcomes.close()


def test_an_action_past_its_hard_time_limit_waits_for_a_person(
    cluster: Cluster, tmp_path: Path, worker_pool: str
) -> None:
    """Given up at its hard time limit (prefork: its process killed; threads: the watchdog
    lets go of its thread, which may still finish), the call is not sent to run again."""
    outcomes = Outcomes(cluster, tmp_path)
    # Task limits: hard 6 + 1 (the chain's budget) = 7 s, soft 2 s.
    outcomes.worker(restart=True, AGENT_JOBS_STEP_TIME_LIMIT="6", AGENT_JOBS_EAGER_BUDGET="1")
    run_id = outcomes.approved("slow_payer")
    outcomes.wait_status(run_id, "awaiting_reconcile")
    assert len(outcomes.starts(run_id, "pay_slowly")) == 1
    key = f"{run_id}:tool:call_1"
    assert ("pay_slowly:soft", key) in executed(run_id)
    outcomes.open_gate(run_id)  # a thread given up on ends now: what it returns is refused
    if worker_pool == "threads":  # on prefork its process was killed: it never ends

        def ended() -> bool:  # returned, or was interrupted (the executor logs that)
            failed = f"tool pay_slowly failed in run {run_id}"
            logs = "\n".join(proc.log() for proc in cluster.procs)
            return ("pay_slowly", key) in executed(run_id) or failed in logs

        eventually(ended, what="the thread given up on to end", context=outcomes.logs)
    assert outcomes.client.get_run(run_id).status == "awaiting_reconcile"
    assert outcomes.step_row(run_id)["state"] == "waiting"
    assert outcomes.client.reconcile(run_id, "call_1", "failed", actor="alice", error="timed out")
    assert cluster.wait(run_id).status == "completed"
    assert json.loads(outcomes.tool_message(run_id).content) == {"error": "timed out"}
    assert len(outcomes.starts(run_id, "pay_slowly")) == 1
    outcomes.close()
