"""Runs enqueued from outside: a plain Celery client that never imports this project, and
`agent-jobs enqueue`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.apps import executed
from tests.support.doors import Doors, cli, open_doors, plain_celery_send, wait_for

ENQUEUE_BROKER_DB = 3
W1 = {"agent": "w1", "input": "go", "actor": "user-7"}


@pytest.fixture(scope="module")
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with open_doors(pg_url, redis_url, ENQUEUE_BROKER_DB, tmp_path_factory.mktemp("enq")) as d:
        # One process, so messages are handled in the order they were sent. No --queues:
        # a worker reads the default `celery` queue too, where a plain client sends.
        d.worker(concurrency=1, queues=None)
        yield d


def finished(doors: Doors, run_id: str) -> Any:
    run = wait_for(lambda: (r := doors.store.find_run(run_id)) and r.finished and r, run_id)
    return run


@pytest.mark.parametrize("queue", [None, "agent_jobs"], ids=["default_queue", "agent_jobs_queue"])
def test_a_plain_celery_client_starts_a_run_named_after_its_task(
    doors: Doors, queue: str | None
) -> None:
    doors.reset()
    send: dict[str, Any] = {"kwargs": {**W1, "metadata": {"ticket": 7}}}
    if queue:
        send["queue"] = queue
    [task_id] = plain_celery_send(doors.broker, [send])

    run = finished(doors, task_id)
    assert run.run_id == task_id
    assert run.status == "completed" and run.output == "w1 answer"
    assert run.metadata == {"ticket": 7} and run.actor == "user-7"


def test_the_same_run_id_twice_starts_one_run(doors: Doors) -> None:
    doors.reset()
    kwargs = {**W1, "run_id": "order-42-refund"}
    ids = plain_celery_send(
        doors.broker, [{"kwargs": kwargs, "queue": "agent_jobs"}, {"kwargs": kwargs}]
    )
    assert len(set(ids)) == 2  # two messages…
    run = finished(doors, "order-42-refund")
    assert run.status == "completed"
    # …one run: the second message found the run and only re-drove it.
    wait_for(
        lambda: all(f"start_run[{i}] succeeded" in doors.procs[0].log() for i in ids),
        "both messages to be handled",
    )
    assert [r.run_id for r in doors.store.list_runs()] == ["order-42-refund"]
    models = [what for what, _ in executed("order-42-refund") if what == "model"]
    assert len(models) == 3


BAD_KWARGS: list[tuple[str, dict[str, Any]]] = [
    ("missing input", {"kwargs": {"agent": "w1"}}),
    ("empty input", {"kwargs": {**W1, "input": "  "}}),
    ("unknown agent", {"kwargs": {**W1, "agent": "nobody"}}),
    ("unknown field", {"kwargs": {**W1, "priority": "high"}}),
    ("bad run id", {"kwargs": {**W1, "run_id": "../../etc/passwd"}}),
    ("wrong type", {"kwargs": {**W1, "metadata": ["not", "an", "object"]}}),
    ("unknown persona", {"kwargs": {**W1, "persona": "no-such-persona"}}),
    ("positional args", {"args": ["w1", "go"]}),
]


def test_bad_kwargs_are_refused_and_recorded_nowhere(doors: Doors) -> None:
    doors.reset()
    sends = [{**send, "queue": "agent_jobs"} for _, send in BAD_KWARGS]
    ids = plain_celery_send(doors.broker, [*sends, {"kwargs": W1, "queue": "agent_jobs"}])

    # The good run was sent last; one worker process handles messages in order.
    marker = finished(doors, ids[-1])
    assert marker.status == "completed"
    snapshot = doors.snapshot(marker.run_id)
    assert [r["id"] for r in snapshot["runs"]] == [marker.run_id]
    assert snapshot["threads"] == [marker.thread_id]
    for task_id in ids[:-1]:
        assert doors.store.find_run(task_id) is None
        assert executed(task_id) == []
    worker_log = "\n".join(p.log() for p in doors.procs)
    assert worker_log.count("refused: invalid run request") >= 5
    assert "refused: unknown agent" in worker_log
    assert "refused: unknown persona" in worker_log
    assert "refused: agent_jobs.start_run takes keyword arguments only" in worker_log


def test_agent_jobs_enqueue(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "enqueue",
        "go",
        "--agent",
        "w1",
        "--actor",
        "user-7",
        "--run-id",
        "cli-run-1",
        "--metadata",
        '{"source": "cli"}',
        "--json",
        env=doors.env,
    )
    assert done.returncode == 0, done.stderr
    # The status the command wrote, not one read back after the send (a worker may have
    # begun the run, or ended it, by then).
    printed = json.loads(done.stdout)
    assert printed == {"run_id": "cli-run-1", "status": "queued"}
    again = cli("enqueue", "go", "--agent", "w1", "--run-id", "cli-run-1", env=doors.env)
    assert again.returncode == 0 and again.stdout.strip() == "cli-run-1"

    run = finished(doors, "cli-run-1")
    assert run.status == "completed" and run.metadata == {"source": "cli"}
    assert len(doors.store.list_runs()) == 1

    plain = cli("enqueue", "go", "--agent", "w1", "--actor", "user-7", env=doors.env)
    assert plain.returncode == 0, plain.stderr
    assert finished(doors, plain.stdout.strip()).status == "completed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metadata", "[1]"], "--metadata must be a JSON object, not a JSON list"),
        (["--metadata", "{"], "--metadata must be a JSON object"),
        (["--agent", "nobody"], "unknown agent 'nobody'"),
        (["--run-id", "has space"], "invalid run request: run_id"),
    ],
)
def test_agent_jobs_enqueue_refuses_bad_input(doors: Doors, args: list[str], message: str) -> None:
    doors.reset()
    done = cli("enqueue", "go", *args, env=doors.env)
    assert done.returncode == 2
    assert message in done.stderr
    assert doors.store.list_runs() == []


def test_agent_jobs_enqueue_needs_a_broker(doors: Doors) -> None:
    env = {k: v for k, v in doors.env.items() if k != "AGENT_JOBS_BROKER_URL"}
    done = cli("enqueue", "go", env=env)
    assert done.returncode == 2
    assert "set AGENT_JOBS_BROKER_URL" in done.stderr
