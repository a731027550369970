"""Flower (the real package) against the test broker, started as the README says (with the
shipped config file): operators find a run's tasks by step and run, see where each left
the run, and see refused and failed work as failed."""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import logging
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.client import Client
from agent_jobs.dispatch import (
    COORDINATE,
    INVOKE_TOOL,
    MODEL_TURN,
    START_RUN,
    SWEEP,
    CeleryDispatcher,
    celery_client,
    short_run_id,
    step_label,
    step_reprs,
)
from agent_jobs.settings import Settings
from tests.support import apps, workers
from tests.support.doors import Doors, open_doors, plain_celery_send, wait_for
from tests.support.workers import ROOT, Process

FLOWER_BROKER_DB = 6
# A password with every character that once broke a login (`--basic-auth` splits on `,`,
# a URL on `@`, `:` and `/`): it comes from the environment, never a command line.
USER, PASSWORD = "operator", "p@ss,w:rd/" + uuid.uuid4().hex[:8]
CONFIG = importlib.util.find_spec("tasks.flowerconfig").origin  # type: ignore[union-attr]


def kwargs_of(task: dict[str, Any]) -> dict[str, Any]:
    """A task's arguments by name, as Flower shows its kwargs (a dict's repr)."""
    value = ast.literal_eval(task.get("kwargs") or "{}")
    assert isinstance(value, dict), task
    return value


def succeeded(proc: Process, task: str, result: str) -> int:
    """How many `task` tasks the worker's log says succeeded with `result` (its repr): the
    log has every task, those that send Flower no event too."""
    line = rf"Task {re.escape(task)}\[[^\]]+\] succeeded in [0-9.]+s: {re.escape(result)}"
    return len(re.findall(line, proc.log()))


def flower_caught_up(flower: Flower, doors: Doors) -> None:
    """Flower has heard the worker's events up to now: it shows a task sent after them
    (a start_run refused at once: no run that a sweep could re-drive)."""
    [task_id] = plain_celery_send(doors.broker, [{"kwargs": {}, "queue": "agent_jobs"}])
    wait_for(lambda: task_id in flower.tasks(), f"flower to show {task_id}, sent last")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def flower_env(doors: Doors, **extra: str) -> dict[str, str]:
    return {**doors.env, "FLOWER_USER": USER, "FLOWER_PASSWORD": PASSWORD, **extra}


class Flower:
    """`celery -A tasks flower --conf=<the shipped file>`, basic auth from the environment."""

    def __init__(self, doors: Doors) -> None:
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "flower",
            f"--conf={CONFIG}",
            f"--port={self.port}",
        ]
        self.proc = Process(args, flower_env(doors), "flower").start()
        doors.procs.append(self.proc)
        wait_for(self.healthy, f"flower to answer\n{self.proc.log()}", every=0.1)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/healthcheck"), timeout=2) as reply:
                return bool(reply.read() == b"OK")
        except OSError:
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, password: str | None = PASSWORD) -> Any:
        request = urllib.request.Request(self.url(path))
        if password is not None:
            token = base64.b64encode(f"{USER}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())

    def tasks(self, **query: str) -> dict[str, dict[str, Any]]:
        tasks: dict[str, dict[str, Any]] = self.get(
            "/api/tasks?" + urllib.parse.urlencode({"limit": "1000", **query})
        )
        return tasks

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        """The run's tasks, found as an operator finds them: by the run id in kwargs."""
        found = self.tasks(search=f"kwargs:run_id={run_id}").values()
        return [t for t in found if kwargs_of(t).get("run_id") == run_id]


@pytest.fixture
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("flower")
    with open_doors(pg_url, redis_url, FLOWER_BROKER_DB, tmp) as d:
        yield d


def test_flower_shows_a_runs_tasks_by_step_and_run_and_where_they_left_it(doors: Doors) -> None:
    flower = Flower(doors)  # first, so it hears every event of the worker
    for password in (None, "wrong", PASSWORD.split(",")[0]):  # behind basic auth, all of it
        with pytest.raises(urllib.error.HTTPError) as refused:
            flower.get("/api/tasks", password=password)
        assert refused.value.code == 401

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
        mine = flower.of_run(run_id)
        names = {t["name"] for t in mine if t["state"] == "SUCCESS"}
        wanted = {"agent_jobs.coordinate", "agent_jobs.model_turn", "agent_jobs.invoke_tool"}
        done = len(mine) == 8 and all(t["state"] == "SUCCESS" for t in mine)
        return mine if wanted <= names and done else None

    tasks = wait_for(run_tasks, f"flower to list the run's tasks\n{doors.logs()}")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        by_name.setdefault(task["name"], []).append(task)
    short = run_id[:8] + "…"
    # The args lead with what a person looks for: the step (and a tool call's tool), then
    # the run, cut short; the kwargs name the arguments whole.
    assert sorted(t["args"] for t in by_name["agent_jobs.model_turn"]) == [
        f"model:{n} · run {short}" for n in (1, 2, 3)
    ]
    assert sorted(t["args"] for t in by_name["agent_jobs.invoke_tool"]) == [
        f"tool:call_{n} lookup · run {short}" for n in (1, 2, 3, 4)
    ]
    assert sorted(kwargs_of(t)["step"] for t in by_name["agent_jobs.invoke_tool"]) == [
        f"tool:call_{n}" for n in (1, 2, 3, 4)
    ]
    # Steps that ran where the last one ended (the fast path, every model step of this
    # run) show as delivered ones do: their worker, when they started, how long they took.
    worker_names = {t["worker"] for t in by_name["agent_jobs.coordinate"]}
    for task in by_name["agent_jobs.model_turn"] + by_name["agent_jobs.invoke_tool"]:
        assert task["worker"] in worker_names, task
        assert task["started"] and task["runtime"] is not None and task["runtime"] >= 0, task
    [coordinate] = by_name["agent_jobs.coordinate"]
    assert coordinate["args"] == f"coordinate · run {short}"
    assert kwargs_of(coordinate) == {"run_id": run_id}
    # A task's result says in a few words what became of its step and where the run stands.
    assert coordinate["result"] == "'waiting model:1'"
    results = {t["result"] for t in by_name["agent_jobs.model_turn"]}
    assert "'done → waiting tool:call_1, tool:call_2'" in results, results
    assert "'done → completed'" in results, results
    # Of a fan-out's two reads, one ran in the chain and one was delivered, named by the
    # pass that sent it: its tool is shown too.
    assert {t["result"] for t in by_name["agent_jobs.invoke_tool"]} <= {
        "'done → waiting model:2'",
        "'done → waiting model:3'",
        "'done → waiting for its siblings'",
    }

    # The run a plain client started: its start_run task says the agent and the run (named
    # after the task); the kwargs are the ones it sent.
    start = wait_for(
        lambda: flower.tasks(taskname="agent_jobs.start_run").get(started), "the start_run task"
    )
    assert start["state"] == "SUCCESS" and kwargs_of(start)["agent"] == "w1"
    assert start["args"] == f"start_run w1 · run {started[:8]}…"
    assert start["result"] == "'waiting model:1'"

    # A parked run's last task says what it waits for.
    def parked_outcome() -> bool:
        results = [t.get("result") or "" for t in flower.of_run(parked)]
        return "'done → awaiting_approval refund call_2'" in results

    wait_for(parked_outcome, "the parked run's outcome in flower")


@pytest.fixture
def failing_doors(
    pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Doors]:
    # One delivery of a step that never finishes is all it gets: the next is a dead letter.
    # A short lease, so the sweep soon sends again a step whose worker died (tests/cluster.py).
    tmp = tmp_path_factory.mktemp("flower-failing")
    once = {"AGENT_JOBS_STEP_MAX_ATTEMPTS": "1", "AGENT_JOBS_STEP_LEASE": "1.5"}
    with open_doors(pg_url, redis_url, FLOWER_BROKER_DB, tmp, **once) as d:
        yield d


def test_refused_failed_and_dead_lettered_work_shows_failed_with_its_reason(
    failing_doors: Doors,
) -> None:
    doors = failing_doors
    flower = Flower(doors)
    # On a threads pool the poison kills the whole worker, which is started again.
    worker = workers.worker(doors.env, 2, "doors", "agent_jobs", restart=True)
    doors.procs.append(worker.start(ready="ready."))
    doors.beat()
    # Refused: start_run without an input, and with positional arguments.
    refused = plain_celery_send(
        doors.broker,
        [
            {"kwargs": {"agent": "w1"}, "queue": "agent_jobs"},
            {"args": ["w1", "go"], "queue": "agent_jobs"},
        ],
    )
    # A model step whose provider refuses the key (run in the chain of the run's first
    # task), and a tool step that kills its worker process every time (given up on).
    unauthorized = doors.client.enqueue_run("unauthorized", "go", actor="user-7")
    poison = doors.client.enqueue_run("poison", "go", actor="user-7")
    doors.wait_status(unauthorized, "failed")
    doors.wait_status(poison, "failed")

    def failed(task_id: str) -> dict[str, Any] | None:
        task = flower.tasks().get(task_id)
        return task if task and task["state"] == "FAILURE" else None

    missing, positional = (wait_for(lambda i=i: failed(i), f"{i} failed") for i in refused)
    assert missing["exception"] == "refused: invalid run request: input: Field required"
    assert missing["args"] == f"start_run w1 · run {refused[0][:8]}…"
    assert positional["exception"] == (
        "refused: agent_jobs.start_run takes keyword arguments only (send them as kwargs)"
    )

    def failed_step(run_id: str, step: str) -> dict[str, Any] | None:
        found = [
            t
            for t in flower.of_run(run_id)
            if kwargs_of(t).get("step") == step and t["state"] == "FAILURE"
        ]
        return found[0] if found else None

    model = wait_for(lambda: failed_step(unauthorized, "model:1"), "the failed model step")
    assert model["name"] == "agent_jobs.model_turn"
    assert model["exception"] == (
        "failed: auth is not retryable: provider says auth → run failed"
    ), model
    dead = wait_for(lambda: failed_step(poison, "tool:call_1"), "the dead-lettered step")
    assert dead["name"] == "agent_jobs.invoke_tool"
    assert dead["exception"].startswith("failed: gave up after 1 attempts"), dead

    # The work was committed first, as before: the runs failed, their journals say why.
    assert doors.store.get_run(unauthorized).error_type == "StepFailedError"
    assert doors.store.get_run(poison).error_type == "StepFailedError"
    assert {j["step"]: j["state"] for j in doors.store.journal(poison)}["tool:call_1"] == "failed"
    # Not retried, acknowledged (nothing left in the queue or unacknowledged), and logged
    # as expected, without a traceback: judged once the worker has done later work.
    flower_caught_up(flower, doors)
    for task in (missing, positional, dead):
        assert task["retries"] == 0 and failed(task["uuid"]) is not None
    pending = [*doors.redis.lrange("agent_jobs", 0, -1), *doors.redis.hvals("unacked")]
    for task in (missing, positional, dead):
        assert not [m for m in pending if task["uuid"].encode() in m], task
    log = worker.log()
    for task in (missing, positional, dead):
        assert f"[{task['uuid']}] raised expected: " in log
    assert "raised unexpected" not in log


def test_the_sweep_shows_only_when_it_re_drove_something(doors: Doors) -> None:
    flower = Flower(doors)
    worker = doors.worker()
    doors.beat()  # a sweep every half second

    def quiet() -> int:
        return succeeded(worker, "agent_jobs.sweep", "'re-drove 0 runs'")

    wait_for(lambda: quiet() >= 3, f"three quiet sweeps\n{doors.logs()}")
    flower_caught_up(flower, doors)
    assert flower.tasks(taskname="agent_jobs.sweep") == {}, "a quiet sweep is not shown"

    # A run whose start was lost (sent where no worker reads): the sweep re-drives it.
    nowhere = celery_client(doors.broker, "nowhere")
    settings = Settings(broker_url=doors.broker, database_url=doors.pg_url, queue="nowhere")
    lost = Client(doors.store, apps.app, settings, CeleryDispatcher(nowhere))
    try:
        run_id = lost.enqueue_run("w1", "go", actor="user-7")
    finally:
        nowhere.close()
    doors.wait_status(run_id, "completed")
    sweeps = wait_for(lambda: flower.tasks(taskname="agent_jobs.sweep"), "the sweep that re-drove")
    [sweep] = sweeps.values()
    assert sweep["state"] == "SUCCESS" and sweep["result"] == "'re-drove 1 runs'", sweep
    assert sweep["worker"] and sweep["runtime"] is not None
    after = quiet()
    wait_for(lambda: quiet() >= after + 3, f"three more quiet sweeps\n{doors.logs()}")
    flower_caught_up(flower, doors)
    assert len(flower.tasks(taskname="agent_jobs.sweep")) == 1


def test_flower_refuses_to_start_without_its_user_and_password(doors: Doors) -> None:
    env = {k: v for k, v in flower_env(doors).items() if k != "FLOWER_PASSWORD"}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--conf={CONFIG}"],
        cwd=ROOT,
        env={**env, "FLOWER_BASIC_AUTH": "a:b"},  # Flower's own splits on `,`: not taken
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "set FLOWER_USER and FLOWER_PASSWORD" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_config_file_is_shipped_in_the_package() -> None:
    assert Path(CONFIG) == ROOT / "tasks" / "flowerconfig.py"


def test_celerys_own_log_lines_still_name_the_run_and_step() -> None:
    # Celery's lines about a task (received, succeeded, raised) carry what Flower is shown;
    # the JSON logs read the run and the step from it.
    from agent_jobs.logs import JsonFormatter

    argsrepr, kwargsrepr = step_reprs(MODEL_TURN, "6b79ab12cd34ef56", "model:2")
    record = logging.LogRecord("celery.app.trace", logging.INFO, __file__, 1, "done", (), None)
    record.data = {"id": "t-1", "name": MODEL_TURN, "args": argsrepr, "kwargs": kwargsrepr}
    line = json.loads(JsonFormatter().format(record))
    assert (line["run_id"], line["step"], line["task_id"]) == ("6b79ab12cd34ef56", "model:2", "t-1")


@pytest.mark.unit
def test_a_run_id_someone_chose_is_shown_whole_and_a_generated_one_cut() -> None:
    """Ids with a shared prefix (`ticket-2026-…`) were cut to 8 characters and looked
    alike."""
    chosen = ["ticket-2026-0417-refund", "ticket-2026-0418-refund", "x" * 64]
    assert [short_run_id(r) for r in chosen] == chosen
    generated = ["6b79ab12cd34ef5678901234567890ab", "6b79ab12-cd34-4f56-8901-234567890abc"]
    assert [short_run_id(r) for r in generated] == ["6b79ab12…", "6b79ab12…"]
    assert step_label("agent_jobs.model_turn", chosen[0], "model:2") == (
        "model:2 · run ticket-2026-0417-refund"
    )


def test_the_worker_shows_a_tasks_real_arguments_whoever_sent_it() -> None:
    from tasks.requests import shown

    run = "6b79ab12cd34ef5678901234567890ab"
    # Ours, as the pass sent it: the tool it named is kept.
    sent = step_reprs(INVOKE_TOOL, run, "tool:call_3", "lookup_order")
    assert shown(INVOKE_TOOL, [run, "tool:call_3"], {}, "t", sent[0]) == sent
    assert sent[0] == "tool:call_3 lookup_order · run 6b79ab12…"
    # A plain client's (Celery's own repr), or a label that does not match the arguments:
    # built from the arguments the task will act on.
    plain = step_reprs(INVOKE_TOOL, run, "tool:call_3")
    for said in (repr([run, "tool:call_3"]), "tool:call_9 x · run 6b79ab12…", None):
        assert shown(INVOKE_TOOL, [run, "tool:call_3"], {}, "t", said) == plain
    assert shown(COORDINATE, [run], {}, "t", "()") == step_reprs(COORDINATE, run)
    # start_run: the agent and the run (its task's id unless it names one); the sender's
    # kwargs shown as it said them.
    assert shown(START_RUN, [], {"agent": "support"}, "t-1", "()") == (
        "start_run support · run t-1",
        None,
    )
    assert shown(START_RUN, [], {"agent": "a", "run_id": "order-42"}, "t", "")[0] == (
        "start_run a · run order-42"
    )
    # Anything else (malformed arguments, another task): what the sender said.
    assert shown(MODEL_TURN, [run], {}, "t", "x") is None
    assert shown(MODEL_TURN, [run, 7], {}, "t", "x") is None
    assert shown(SWEEP, [], {}, "t", "()") is None
