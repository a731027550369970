"""`agent-jobs serve` without a broker: SQLite, no services, the inline runner in the
server's own process. Start, stream, approve, answer, complete: all over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import encryption as test_encryption
from tests.support.apps import executed
from tests.support.apps.http import ANSWER
from tests.support.serve import Api, ApiServer, api_env, assert_error, events
from tests.support.waiting import eventually
from tests.support.workers import ROOT


@pytest.fixture(scope="module")
def inline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('inline') / 'agent_jobs.db'}"
    base = test_encryption.bare_environ()
    env = api_env({**base, "PYTHONPATH": str(ROOT), "AGENT_JOBS_DATABASE_URL": url})
    server = ApiServer(env, "serve-inline").start()
    try:
        yield server, url
    finally:
        server.stop()


@pytest.fixture
def api(inline: tuple[ApiServer, str], monkeypatch: pytest.MonkeyPatch) -> Api:
    server, url = inline
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", url)  # where tests.apps counts executions
    return Api(server)


def status(api: Api, run_id: str) -> dict[str, Any]:
    reply = api.call("user-7", "GET", f"/v1/runs/{run_id}")
    assert reply.status_code == 200, reply.text
    doc: dict[str, Any] = reply.json()
    return doc


def test_the_inline_server_starts_streams_approves_and_completes_a_run(api: Api) -> None:
    log = api.api.log()
    assert "runs go to this process (inline)" in log
    started = api.call(
        "user-7", "POST", "/v1/runs", json={"agent": "talker", "input": "hi", "run_id": "inline-1"}
    )
    assert started.status_code == 201 and started.json() == {
        "run_id": "inline-1",
        "status": "running",
    }
    again = api.call(
        "user-7", "POST", "/v1/runs", json={"agent": "talker", "input": "hi", "run_id": "inline-1"}
    )
    assert again.status_code == 200 and again.json()["run_id"] == "inline-1"

    got: list[tuple[str, dict[str, Any]]] = []
    with api.stream("user-7", "/v1/runs/inline-1/stream") as reply:
        for event in events(reply):
            if event.data is not None:
                got.append((str(event.id), event.frame))
            if len(got) == 5:
                break  # away for a while: the model keeps streaming
    with api.stream(
        "user-7", "/v1/runs/inline-1/stream", headers={"Last-Event-ID": got[-1][0]}
    ) as reply:
        for event in events(reply):
            if event.data is None:
                continue
            got.append((str(event.id), event.frame))
            frame = event.frame
            if frame["type"] == "approval_request":
                listed = api.call("alice", "GET", "/v1/approvals").json()["approvals"]
                assert [a["call_id"] for a in listed if a["run_id"] == "inline-1"] == [
                    frame["call_id"]
                ]
                path = f"/v1/runs/inline-1/approvals/{frame['call_id']}"
                assert_error(api.call("user-7", "POST", path, json={"decision": "approve"}), 403)
                body = {"decision": "approve", "args_sha256": frame["args_sha256"]}
                assert api.call("alice", "POST", path, json=body).json() == {"recorded": True}
    # Entry ids are positions in the run's memory stream: every one, once, in order.
    assert [entry for entry, _ in got] == [str(n) for n in range(1, len(got) + 1)]
    assert got[-1][1] == {"type": "done", "run_id": "inline-1", "output": ANSWER}
    doc = status(api, "inline-1")
    assert (doc["status"], doc["output"], doc["runner"]) == ("completed", ANSWER, "inline")
    assert [what for what, _ in executed("inline-1")] == ["refund"]


def test_questions_and_cancel_on_the_inline_server(api: Api) -> None:
    run_id = api.start("user-7", agent="planner", text="book")
    with api.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        for event in events(reply):
            if event.data is not None and event.frame["type"] == "question":
                request_id = event.frame["request_id"]
                path = f"/v1/runs/{run_id}/answers/{request_id}"
                answers = {"answers": {"q1": "Friday", "q2": "Afternoon"}}
                assert_error(api.call("alice", "POST", path, json=answers), 404)
                assert api.call("backend", "POST", path, json=answers).json() == {"recorded": True}
    assert status(api, run_id)["status"] == "completed"

    parked = api.start("user-7", text="cancel me")
    with api.stream("user-7", f"/v1/runs/{parked}/stream") as reply:
        for event in events(reply):
            if event.data is not None and event.frame["type"] == "approval_request":
                cancelled = api.call("user-7", "POST", f"/v1/runs/{parked}/cancel")
                assert cancelled.status_code == 202 and cancelled.json() == {"cancelling": [parked]}
            last = event
    assert last.frame["type"] == "error"
    assert status(api, parked)["status"] == "cancelled"


def test_the_inline_server_refuses_a_durable_runs_stream(
    api: Api, inline: tuple[ApiServer, str]
) -> None:
    from agent_jobs.runs import RunRequest, admit_run
    from agent_jobs.store import Store
    from tests.support.apps.http import app

    store = Store.from_url(inline[1])
    try:
        request = RunRequest.of("chat", "elsewhere", actor="user-7", run_id="durable-elsewhere")
        admit_run(store, app, request, runner="durable", status="queued")
    finally:
        store.engine.dispose()
    refused = api.call("user-7", "GET", "/v1/runs/durable-elsewhere/stream")
    assert "durable runner" in assert_error(refused, 409, "ConflictError")


def test_a_threads_model_is_switched_over_http_and_the_cli_on_the_inline_server(
    api: Api, inline: tuple[ApiServer, str]
) -> None:
    """Choosing a thread's model reaches a run the server's own process drives: from
    HTTP, and from the command line of another process on the same database."""
    from agent_jobs.store import Store
    from tests.support.doors import cli

    run_id = api.start("user-7", text="refund it")
    with api.stream("user-7", f"/v1/runs/{run_id}/stream") as reply:
        for event in events(reply):
            if event.data is not None and event.frame["type"] == "approval_request":
                call_id = event.frame["call_id"]
                break
    path = f"/v1/runs/{run_id}/model"
    assert_error(api.call("alice", "POST", path, json={"model": "m2"}), 403)
    base = test_encryption.bare_environ()
    env = {**api_env(base), "PYTHONPATH": str(ROOT), "AGENT_JOBS_DATABASE_URL": inline[1]}
    by_cli = cli("model", run_id, "--model", "m3", env=env)
    assert by_cli.returncode == 0 and f"thread {run_id} uses m3" in by_cli.stdout, by_cli.stderr
    switched = api.call("user-7", "POST", path, json={"model": "m2"})
    assert switched.status_code == 202 and switched.json() == {"thread_id": run_id}

    decided = api.call(
        "alice", "POST", f"/v1/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    assert eventually(
        lambda: status(api, run_id)["status"] == "completed" or None, what=f"{run_id} to complete"
    )
    store = Store.from_url(inline[1])
    try:
        steps = {row["step"]: row for row in store.journal(run_id)}
    finally:
        store.engine.dispose()
    assert steps["model:2"]["intent"]["request"]["settings"]["model"] == "m2"
