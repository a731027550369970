"""Tools from MCP servers on the durable runner: real Celery workers (on each pool), real
Postgres and Redis, real MCP servers written with the SDK (stdio, started by each worker
process that calls one; streamable HTTP, served by the test process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_jobs.client import Client
from agent_jobs.dispatch import CeleryDispatcher
from agent_jobs.settings import Settings
from tests.mcp.conftest import ServerLog
from tests.support.apps.mcp import app
from tests.support.cluster import Cluster
from tests.support.mcp_server import READ, HttpServer
from tests.support.serve import ApiServer, api_env
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually, wait_status

APP = "tests.support.apps.mcp:app"


class Mcp:
    """A cluster whose workers load the MCP app, and a client of that app."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        settings = Settings(
            broker_url=cluster.broker, database_url=cluster.pg_url, queue=SESSION_QUEUE
        )
        self.client = Client(cluster.store, app, settings, CeleryDispatcher(cluster.celery))

    def worker(self, concurrency: int = 2, **extra: str) -> None:
        self.cluster.worker(concurrency=concurrency, AGENT_JOBS_APP=APP, **extra)

    def start(self, agent: str) -> str:
        return self.client.enqueue_run(agent, "go", actor="user-7")

    def wait_status(self, run_id: str, status: str) -> None:
        wait_status(
            self.cluster.store,
            run_id,
            status,
            strict=True,
            context=lambda: f"{self.cluster.store.journal(run_id)}\n{self.cluster.logs()}",
        )

    def finished(self, run_id: str) -> Any:
        run = self.cluster.wait(run_id)
        assert run.status == "completed", (run.error, self.cluster.logs())
        return run

    def journal(self, run_id: str) -> dict[str, dict[str, Any]]:
        return {row["step"]: row for row in self.cluster.store.journal(run_id)}

    def tool_messages(self, run_id: str) -> list[Any]:
        thread_id = self.client.get_run(run_id).thread_id
        return [m for m in self.cluster.store.thread_messages(thread_id) if m.role == "tool"]


@pytest.fixture
def mcp(cluster: Cluster) -> Iterator[Mcp]:
    yield Mcp(cluster)


def value(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


def test_reads_fan_out_with_a_plain_tool_on_connections_the_workers_keep(
    mcp: Mcp, server_log: ServerLog
) -> None:
    mcp.worker()
    known, calls = server_log.pids(), len(server_log.calls())
    runs = [mcp.start("reader") for _ in range(4)]
    for run_id in runs:
        mcp.finished(run_id)
        steps = mcp.journal(run_id)
        assert steps["mcp:tools"]["result"]["unavailable"] == {}
        assert [value(m.content) for m in mcp.tool_messages(run_id)] == [
            "contents of a.txt",
            {"path": "b.txt", "size": 5},
            {"order_id": "42", "status": "shipped"},
        ]
    assert len(server_log.calls()) - calls == 8
    # Two pool processes (or threads), each with at most one connection per read it ran
    # at once: never a server process per call or per run.
    assert len(server_log.pids() - known) <= 4


def test_an_action_waits_for_its_approval_then_runs(mcp: Mcp, server_log: ServerLog) -> None:
    mcp.worker()
    before = len(server_log.calls("write_file"))
    run_id = mcp.start("writer")
    mcp.wait_status(run_id, "awaiting_approval")
    [pending] = mcp.cluster.store.pending_calls(run_id)
    assert pending["name"] == "files.write_file"
    assert len(server_log.calls("write_file")) == before
    assert mcp.client.approve(run_id, "call_1", actor="alice")
    mcp.finished(run_id)
    [message] = mcp.tool_messages(run_id)
    assert json.loads(message.content) == {"wrote": "w.txt", "bytes": 2}
    assert len(server_log.calls("write_file")) == before + 1


@pytest.mark.pools_named
def test_an_elicitation_is_answered_through_the_http_api(
    mcp: Mcp, server_log: ServerLog, web: HttpServer
) -> None:
    mcp.worker()
    api = ApiServer(api_env(mcp.cluster.env(), AGENT_JOBS_APP=APP)).start()
    mcp.cluster.procs.append(api.proc)

    def call(actor: str, method: str, path: str, **kwargs: Any) -> Any:
        with api.client(actor) as client:
            return client.request(method, path, **kwargs)

    reply = call("user-7", "POST", "/v1/runs", json={"agent": "web_refunder", "input": "go"})
    assert reply.status_code == 201, reply.text
    run_id = reply.json()["run_id"]
    mcp.wait_status(run_id, "awaiting_approval")
    # An approver of the server's tools reads the run in the runs list.
    listed = call("alice", "GET", "/v1/runs").json()["runs"]
    assert run_id in [r["run_id"] for r in listed]
    decided = call(
        "alice", "POST", f"/v1/runs/{run_id}/approvals/call_1", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    mcp.wait_status(run_id, "awaiting_answers")

    inbox = call("user-7", "GET", "/v1/approvals").json()["questions"]
    [asked] = [q for q in inbox if q["run_id"] == run_id]
    assert asked["tool"] == "web.refund"
    [question] = asked["questions"]
    assert question["question"] == "From which account should the refund be paid?"
    assert question["source"] == "mcp_elicitation" and question["server"] == "web"
    path = f"/v1/runs/{run_id}/answers/{asked['request_id']}"
    answered = call("user-7", "POST", path, json={"answers": {question["id"]: "savings"}})
    assert answered.status_code == 200, answered.text
    mcp.finished(run_id)
    [message] = mcp.tool_messages(run_id)
    assert json.loads(message.content) == {"refunded": "7", "from": "savings"}
    # Asked, then made again with the answer: two calls of the tool, one of them answered.
    steps = mcp.journal(run_id)
    assert steps["tool:call_1"]["result"]["questions"][0]["id"] == question["id"]
    assert steps["tool:call_1:2"]["result"]["ok"] is True


def test_a_run_keeps_its_list_and_a_new_run_sees_the_changed_one(mcp: Mcp, web: HttpServer) -> None:
    mcp.worker()
    first = mcp.start("web_changing")
    mcp.wait_status(first, "awaiting_approval")

    def added(path: str) -> dict[str, Any]:
        """A tool the server gained after the first run took its list."""
        return {"added": path}

    web.mcp.add_tool(added, name="added", annotations=READ)
    try:
        assert mcp.client.approve(first, "call_1", actor="alice")
        mcp.finished(first)
        listed = [t["name"] for t in mcp.journal(first)["mcp:tools"]["result"]["tools"]]
        assert "web.added" not in listed
        kept = mcp.tool_messages(first)[-1]
        assert kept.is_error and "web.added" in kept.content

        second = mcp.start("web_changing")
        mcp.wait_status(second, "awaiting_approval")
        assert mcp.client.approve(second, "call_1", actor="alice")
        mcp.finished(second)
        listed = [t["name"] for t in mcp.journal(second)["mcp:tools"]["result"]["tools"]]
        assert "web.added" in listed
        assert json.loads(mcp.tool_messages(second)[-1].content) == {"added": "b"}
    finally:
        web.mcp.remove_tool("added")


def test_a_server_that_is_down_is_a_tool_error_the_model_sees(mcp: Mcp) -> None:
    mcp.worker()
    run_id = mcp.start("unreachable")
    mcp.finished(run_id)
    listed = mcp.journal(run_id)["mcp:tools"]["result"]
    assert listed["tools"] == [] and "down" in listed["unavailable"]
    [message] = mcp.tool_messages(run_id)
    assert message.is_error and "down.read_file" in message.content


def test_a_server_that_hangs_ends_the_call_within_the_steps_time_limit(
    mcp: Mcp, server_log: ServerLog
) -> None:
    # One process: a first run opens its connection (a stdio server's start may take
    # seconds on a loaded machine), so the run that hangs lists its tools on it.
    mcp.worker(concurrency=1, AGENT_JOBS_STEP_TIME_LIMIT="5")
    mcp.finished(mcp.start("bench"))
    run_id = mcp.start("hanger_limited")
    mcp.finished(run_id)
    assert mcp.journal(run_id)["mcp:tools"]["result"]["unavailable"] == {}
    [message] = mcp.tool_messages(run_id)
    assert message.is_error and "did not answer within 4 s" in message.content
    step = mcp.journal(run_id)["tool:call_1"]
    assert step["state"] == "done" and step["attempts"] == 1
    eventually(lambda: server_log.calls("hang"), what="the server to have begun the call")
