"""Flower (the real package) against the test broker: operators find a run's tasks by name."""

from __future__ import annotations

import ast
import base64
import json
import socket
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .doors_helpers import Doors, open_doors, plain_celery_send, wait_for
from .workers import Process

FLOWER_BROKER_DB = 6
USER, PASSWORD = "operator", uuid.uuid4().hex


def args_of(task: dict[str, Any]) -> list[Any]:
    """A task's positional arguments as Flower shows them (a list's or a tuple's repr)."""
    return list(ast.literal_eval(task.get("args") or "()"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Flower:
    def __init__(self, doors: Doors) -> None:
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "flower",
            "--address=127.0.0.1",
            f"--port={self.port}",
            f"--basic-auth={USER}:{PASSWORD}",
        ]
        self.proc = Process(args, doors.env, "flower").start()
        doors.procs.append(self.proc)
        wait_for(self.healthy, f"flower to answer\n{self.proc.log()}", timeout=30, every=0.1)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/healthcheck"), timeout=2) as reply:
                return bool(reply.read() == b"OK")
        except OSError:
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, auth: bool = True) -> Any:
        request = urllib.request.Request(self.url(path))
        if auth:
            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())


@pytest.fixture
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("flower")
    with open_doors(pg_url, redis_url, FLOWER_BROKER_DB, tmp) as d:
        yield d


def test_flower_shows_a_runs_tasks_by_name_state_and_run_id(doors: Doors) -> None:
    flower = Flower(doors)  # first, so it hears every event of the worker
    with pytest.raises(urllib.error.HTTPError) as refused:
        flower.get("/api/tasks", auth=False)
    assert refused.value.code == 401  # behind basic auth

    doors.worker()
    # One run enqueued by the client (a `coordinate` message starts it), one by a plain
    # Celery client (`start_run` creates and coordinates it in one task).
    run_id = doors.client.enqueue_run("w1", "go", actor="user-7")
    [started] = plain_celery_send(
        doors.broker, [{"kwargs": {"agent": "w1", "input": "go"}, "queue": "agent_jobs"}]
    )
    parked = doors.client.enqueue_run("gated", "go", actor="user-7")
    doors.wait_status(run_id, "completed")
    doors.wait_status(started, "completed")
    doors.wait_status(parked, "awaiting_approval")

    def run_tasks() -> list[dict[str, Any]] | None:
        tasks = flower.get("/api/tasks?limit=500").values()
        mine = [t for t in tasks if args_of(t)[:1] == [run_id]]
        names = {t["name"] for t in mine if t["state"] == "SUCCESS"}
        wanted = {"agent_jobs.coordinate", "agent_jobs.model_turn", "agent_jobs.invoke_tool"}
        return mine if wanted <= names and all(t["state"] == "SUCCESS" for t in mine) else None

    tasks = wait_for(run_tasks, f"flower to list the run's tasks\n{doors.logs()}", timeout=20)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        by_name.setdefault(task["name"], []).append(task)
    # Each task's arguments show the run and the step, readably.
    assert sorted(args_of(t) for t in by_name["agent_jobs.model_turn"]) == [
        [run_id, f"model:{n}"] for n in (1, 2, 3)
    ]
    assert sorted(args_of(t) for t in by_name["agent_jobs.invoke_tool"]) == [
        [run_id, f"tool:call_{n}"] for n in (1, 2, 3, 4)
    ]
    # Steps that ran where the last one ended (the fast path, every model step of this
    # run) show as delivered ones do: their worker, when they started, how long they took.
    worker_names = {t["worker"] for t in by_name["agent_jobs.coordinate"]}
    for task in by_name["agent_jobs.model_turn"] + by_name["agent_jobs.invoke_tool"]:
        assert task["worker"] in worker_names, task
        assert task["started"] and task["runtime"] is not None and task["runtime"] >= 0, task
    [coordinate] = by_name["agent_jobs.coordinate"]
    assert coordinate["args"] == f"['{run_id}']"
    # A task's outcome says in a few words where the run stands.
    assert coordinate["result"] == f"'{run_id} waiting model:1'"
    assert f"'{run_id} model:3 done; completed'" in {
        t["result"] for t in by_name["agent_jobs.model_turn"]
    }

    # The run a plain client started: its start_run task is named after it, kwargs shown.
    start = wait_for(
        lambda: flower.get("/api/tasks?taskname=agent_jobs.start_run").get(started),
        "the start_run task",
    )
    assert start["state"] == "SUCCESS" and "'agent': 'w1'" in start["kwargs"]
    assert start["result"] == f"'{started} waiting model:1'"

    # A parked run's last task says what it waits for.
    def parked_outcome() -> bool:
        results = [t.get("result") or "" for t in flower.get("/api/tasks?limit=500").values()]
        return any(r.endswith("awaiting_approval refund call_2'") and parked in r for r in results)

    wait_for(parked_outcome, "the parked run's outcome in flower")
