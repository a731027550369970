"""The operator controls at their doors: the HTTP API (`POST /v1/runs/{id}/pause`,
`/resume`, `/retry`, `/fork`) and the command line (`agent-jobs pause|resume|retry|fork`),
against a real worker, `agent-jobs serve`, Postgres and a Redis of the module's own.
Who may, what is refused (and changes nothing), and the command line without a broker,
which drives a retry or a fork in its own process."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs import InlineRunner
from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.settings import Settings
from agent_jobs.store import Store
from tests.support.apps import controls as controls_apps
from tests.support.apps import executed
from tests.support.doors import Doors, cli, open_doors
from tests.support.redis_server import RedisServer
from tests.support.serve import Api, ApiServer, api_env, assert_error
from tests.support.waiting import TIMEOUT, eventually, settled

APP = "tests.support.apps.controls:app"


class Deployment:
    """A worker, the server and a client, all on the controls app."""

    def __init__(self, doors: Doors, api: Api, gates: Path) -> None:
        self.doors = doors
        self.api = api
        self.gates = gates
        self.store = doors.store
        settings = Settings(broker_url=doors.broker, database_url=doors.pg_url)
        self.client = Client(
            doors.store, controls_apps.app, settings, CeleryDispatcher(doors.celery)
        )

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, env={**self.doors.env, **env})

    def finished(self, run_id: str) -> str:
        def ended() -> str | None:
            run = self.store.get_run(run_id)
            return run.status if run.finished else None

        found: str = eventually(ended, what=f"{run_id} to end", context=self.doors.logs)
        return found

    def approved(self, agent: str = "forkable", actor: str = "user-7") -> str:
        """A run of `agent` by `actor` whose charge alice approved, completed."""
        run_id = self.client.enqueue_run(agent, "go", actor=actor)
        self.doors.wait_status(run_id, "awaiting_approval")
        assert self.client.approve(run_id, "call_2", actor="alice")
        assert self.finished(run_id) == "completed"
        return run_id

    def settled(self, run_id: str) -> dict[str, Any]:
        """The snapshot once two in a row are the same: an ended run's worker may still
        let go of its steps' claims a moment after the run's status says it ended."""
        return settled(lambda: self.snapshot(run_id), what=f"the rows of {run_id}")

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """Everything a control could change of the run, and how many runs there are."""
        found = self.doors.snapshot(run_id)
        found["events"] = [e.model_dump() for e in self.client.events(run_id)]
        found["runs"] = sorted(
            (r["id"], r["status"], r["pause_requested_by"], r["updated_at"]) for r in found["runs"]
        )
        return found


@pytest.fixture(scope="module")
def deployment(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("controls")
    gates = tmp / "gates"
    gates.mkdir()
    server = RedisServer().start()
    saved = os.environ.get("TEST_GATE_DIR")
    os.environ["TEST_GATE_DIR"] = str(gates)
    try:
        with open_doors(
            pg_url, server.url(0), 0, tmp, AGENT_JOBS_APP=APP, TEST_GATE_DIR=str(gates)
        ) as doors:
            doors.worker()
            api = ApiServer(api_env(doors.env, AGENT_JOBS_APP=APP), "serve-controls")
            doors.procs.append(api.proc)
            api.start()
            yield Deployment(doors, Api(api), gates)
    finally:
        if saved is None:
            os.environ.pop("TEST_GATE_DIR", None)
        else:
            os.environ["TEST_GATE_DIR"] = saved
        server.close()


def ran(run_id: str) -> list[str]:
    return [what for what, _ in executed(run_id)]


# --- the HTTP API ---------------------------------------------------------------------------


def test_pause_and_resume_over_http_as_the_runs_actor_or_a_service(
    deployment: Deployment,
) -> None:
    api = deployment.api
    run_id = deployment.client.enqueue_run("forkable", "go", actor="user-7")
    deployment.doors.wait_status(run_id, "awaiting_approval")
    path = f"/v1/runs/{run_id}"

    before = deployment.snapshot(run_id)
    assert_error(api.call("eve", "POST", f"{path}/pause"), 404, "UnknownRunError")
    assert_error(api.call("alice", "POST", f"{path}/pause"), 403, "PermissionDeniedError")
    assert_error(api.call(None, "POST", f"{path}/pause"), 401, "AuthenticationError")
    assert_error(api.call("user-7", "POST", f"{path}/resume"), 409, "ConflictError")
    assert deployment.snapshot(run_id) == before

    reply = api.call("user-7", "POST", f"{path}/pause")
    assert reply.status_code == 202 and reply.json() == {"pausing": [run_id]}
    deployment.doors.wait_status(run_id, "paused")
    before = deployment.snapshot(run_id)
    says = assert_error(api.call("backend", "POST", f"{path}/pause"), 409, "ConflictError")
    assert "paused already (by user-7)" in says
    assert deployment.snapshot(run_id) == before

    doc = api.call("user-7", "GET", path).json()
    assert doc["status"] == "paused" and doc["pause_requested_by"] == "user-7"
    assert [(c["event"], c["by"]) for c in doc["controls"]] == [
        ("run/pause", "user-7"),
        ("run/paused", "user-7"),
    ]
    assert doc["controls"][1]["status"] == "awaiting_approval"

    reply = api.call("backend", "POST", f"{path}/resume")
    assert reply.status_code == 202 and reply.json() == {"resuming": [run_id]}
    assert api.call("user-7", "GET", path).json()["status"] == "awaiting_approval"
    assert deployment.client.approve(run_id, "call_2", actor="alice")
    assert deployment.finished(run_id) == "completed"


def test_retry_over_http_runs_the_failed_step_again(deployment: Deployment) -> None:
    api = deployment.api
    run_id = deployment.client.enqueue_run("flaky", "go", actor="user-7")
    assert deployment.finished(run_id) == "failed"
    (deployment.gates / run_id).touch()
    assert_error(api.call("alice", "POST", f"/v1/runs/{run_id}/retry"), 404, "UnknownRunError")

    reply = api.call("user-7", "POST", f"/v1/runs/{run_id}/retry")
    assert reply.status_code == 202, reply.text
    assert reply.json() == {"run_id": run_id, "retrying": ["model:2"]}
    assert deployment.finished(run_id) == "completed"
    before = deployment.settled(run_id)
    says = assert_error(api.call("user-7", "POST", f"/v1/runs/{run_id}/retry"), 409)
    assert "only a run that failed" in says
    assert deployment.snapshot(run_id) == before


def test_fork_over_http_answers_the_new_run_and_what_runs_again(deployment: Deployment) -> None:
    api = deployment.api
    source = deployment.approved()
    path = f"/v1/runs/{source}/fork"

    before = deployment.snapshot(source)
    for body, status in [
        ({"at": "model:9"}, 422),
        ({"at": "usage:1"}, 422),
        ({}, 422),
        ({"at": "model:2", "extra": 1}, 422),
    ]:
        assert_error(api.call("user-7", "POST", path, json=body), status)
    assert_error(api.call("alice", "POST", path, json={"at": "model:2"}), 403)
    assert_error(api.call("eve", "POST", path, json={"at": "model:2"}), 404)
    assert deployment.snapshot(source) == before

    reply = api.call("backend", "POST", path, json={"at": "tool:call_2"})
    assert reply.status_code == 201, reply.text
    forked = reply.json()
    assert forked["forked_from"] == source and forked["at"] == "tool:call_2"
    charge = {"step": "tool:call_2", "tool": "charge", "call_id": "call_2"}
    assert forked["runs_again"] == [charge]
    # The charge approved before the fork point is asked again: in the lead's inbox.
    assert forked["asked_again"] == [{**charge, "step": "approval:call_2"}]
    assert forked["kept_decisions"] == []
    deployment.doors.wait_status(forked["run_id"], "awaiting_approval")
    inbox = api.call("alice", "GET", "/v1/approvals").json()["approvals"]
    assert [a["call_id"] for a in inbox if a["run_id"] == forked["run_id"]] == ["call_2"]
    assert ran(forked["run_id"]) == []
    decide = f"/v1/runs/{forked['run_id']}/approvals/call_2"
    decided = api.call("alice", "POST", decide, json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    assert deployment.finished(forked["run_id"]) == "completed"
    assert ran(forked["run_id"]) == ["charge", "model"]
    doc = api.call("user-7", "GET", f"/v1/runs/{forked['run_id']}").json()
    assert doc["thread_id"] == forked["thread_id"] and doc["output"] == "Order 42 charged."
    assert doc["controls"][0]["event"] == "run/fork" and doc["controls"][0]["by"] == "backend"

    # A decision is kept only by one who may make it (403, and nothing is written), and
    # then as theirs.
    kept = {"at": "tool:call_2", "keep_decisions": True}
    before = deployment.snapshot(source)
    says = assert_error(api.call("user-7", "POST", path, json=kept), 403)
    assert "needs one of the roles lead" in says
    assert deployment.snapshot(source) == before
    own = deployment.approved(actor="carol")
    reply = api.call("carol", "POST", f"/v1/runs/{own}/fork", json=kept)
    assert reply.status_code == 201, reply.text
    assert reply.json()["kept_decisions"] == [{**charge, "step": "approval:call_2"}]
    assert deployment.finished(reply.json()["run_id"]) == "completed"
    assert ran(reply.json()["run_id"]) == ["charge", "model"]
    calls = deployment.store.tool_calls(reply.json()["run_id"])
    [call] = [c for c in calls if c["call_id"] == "call_2"]
    assert call["decided_by"] == "carol"

    fanned = deployment.client.enqueue_run("fanning", "go", actor="user-7")
    assert deployment.finished(fanned) == "completed"
    says = assert_error(
        api.call("user-7", "POST", f"/v1/runs/{fanned}/fork", json={"at": "tool:call_2"}), 422
    )
    assert "inside a fan-out" in says


# --- the command line -------------------------------------------------------------------------


def test_the_command_line_pauses_resumes_retries_and_forks(deployment: Deployment) -> None:
    run_id = deployment.client.enqueue_run("forkable", "go", actor="user-7")
    deployment.doors.wait_status(run_id, "awaiting_approval")

    done = deployment.cli("pause", run_id, "--actor", "alice")
    assert done.returncode == 0 and f"pausing {run_id}" in done.stdout, done.stderr
    deployment.doors.wait_status(run_id, "paused")
    again = deployment.cli("pause", run_id, "--actor", "alice")
    assert again.returncode == 2 and "paused already" in again.stderr
    status = json.loads(deployment.cli("status", run_id, "--json").stdout)
    assert status["status"] == "paused" and status["controls"][0]["by"] == "alice"
    done = deployment.cli("resume", run_id, "--actor", "alice", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {"resuming": [run_id]}
    deployment.doors.wait_status(run_id, "awaiting_approval")
    assert deployment.client.approve(run_id, "call_2", actor="alice")
    assert deployment.finished(run_id) == "completed"

    refused = deployment.cli("retry", run_id)
    assert refused.returncode == 2 and "only a run that failed" in refused.stderr
    assert deployment.cli("pause", "no-such-run").returncode == 3
    refused = deployment.cli("fork", run_id, "--at", "model:9")
    assert refused.returncode == 2 and "has no step 'model:9'" in refused.stderr

    done = deployment.cli("fork", run_id, "--at", "model:2", "--actor", "alice")
    assert done.returncode == 0, done.stderr
    assert f"forked run {run_id} at model:2" in done.stdout
    assert "runs again: tool:call_2 charge (call call_2)" in done.stdout
    assert "asked again: charge (call call_2)" in done.stdout
    fork_id = done.stdout.split(": run ", 1)[1].split()[0]
    deployment.doors.wait_status(fork_id, "awaiting_approval")
    assert deployment.client.approve(fork_id, "call_2", actor="alice")
    assert deployment.finished(fork_id) == "completed"


def test_without_a_broker_the_command_line_forks_any_run_here(deployment: Deployment) -> None:
    """The inline runner forks a durable run: it replays the durable journal by name."""
    source = deployment.approved()
    inline = {"AGENT_JOBS_BROKER_URL": ""}
    refused = deployment.cli(
        "fork", source, "--at", "tool:call_2", "--keep-decisions", "--actor", "user-7", **inline
    )
    assert refused.returncode == 2 and "needs one of the roles lead" in refused.stderr
    args = ["--keep-decisions", "--actor", "alice", "--json"]
    done = deployment.cli("fork", source, "--at", "tool:call_2", *args, **inline)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["runs_again"][0]["tool"] == "charge"
    assert answer["kept_decisions"] == [
        {"step": "approval:call_2", "tool": "charge", "call_id": "call_2"}
    ]
    assert answer["run"]["status"] == "completed" and answer["run"]["runner"] == "inline"
    assert ran(answer["run_id"]) == ["charge", "model"]


def test_without_a_broker_the_command_line_retries_an_inline_run_here(
    deployment: Deployment,
) -> None:
    store = Store.from_url(deployment.doors.pg_url)
    try:
        runner = InlineRunner(controls_apps.app, store, settings=Settings(), poll_interval=0.05)
        run_id = runner.start("flaky", "go", actor="user-7")
        assert runner.wait(run_id, timeout=TIMEOUT).status == "failed"
    finally:
        store.engine.dispose()
    refused = deployment.cli("retry", run_id)  # the durable door: not its runner
    assert refused.returncode == 2 and "inline runner" in refused.stderr

    (deployment.gates / run_id).touch()
    done = deployment.cli("retry", run_id, "--actor", "alice", AGENT_JOBS_BROKER_URL="")
    assert done.returncode == 0, done.stderr
    assert f"retrying run {run_id}: model:2 runs again (by alice)" in done.stdout
    assert deployment.store.get_run(run_id).status == "completed"
    assert ran(run_id).count("model") == 3
