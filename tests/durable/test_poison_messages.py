"""Malformed task messages against real workers: refused, kept aside, never fatal."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection

from tasks.strategy import DEAD_TASKS, message_problem
from tests.support.cluster import Cluster
from tests.support.services import SESSION_QUEUE
from tests.support.waiting import eventually

BAD_BODIES = {
    "a JSON string": '"a string"',
    "null": "null",
    "an object": "{}",
    "a list of two": '[["run"], {}]',
    "a list of four": '[["run"], {}, {}, 1]',
    "embed not an object": '[["run"], {}, "x"]',
}
BAD_HEADERS: dict[str, dict[str, Any]] = {
    "timelimit not a pair": {"timelimit": "soon"},
    "no id": {"id": None},
}


def publish(broker: str, queue: str, body: str, **headers: Any) -> None:
    """A task message as any Celery client could send it by mistake."""
    fields: dict[str, Any] = {
        "lang": "py",
        "task": "agent_jobs.coordinate",
        "id": str(uuid.uuid4()),
        "argsrepr": "",
        "kwargsrepr": "",
        "retries": 0,
    }
    fields.update(headers)
    fields = {k: v for k, v in fields.items() if v is not None}
    with Connection(broker) as conn, conn.Producer() as producer:
        producer.publish(
            body.encode(),
            exchange="",
            routing_key=queue,
            headers=fields,
            content_type="application/json",
            content_encoding="utf-8",
        )


@pytest.mark.parametrize("body", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_shapes_are_refused_by_the_check(body: str) -> None:
    headers = {"task": "agent_jobs.coordinate", "id": "x"}
    assert message_problem(headers, json.loads(body)) is not None


def test_good_messages_pass_the_check() -> None:
    headers = {"task": "agent_jobs.coordinate", "id": "x", "timelimit": [None, None]}
    assert message_problem(headers, [["run"], {}, {"callbacks": None, "chord": None}]) is None
    assert message_problem(headers, [[], {"agent": "a"}, None]) is None


def test_malformed_messages_never_stop_a_worker(cluster: Cluster) -> None:
    worker = cluster.worker(queues=f"{SESSION_QUEUE},celery")
    sent = 0
    for queue in (SESSION_QUEUE, "celery"):
        for body in BAD_BODIES.values():
            publish(cluster.broker, queue, body)
            sent += 1
        for headers in BAD_HEADERS.values():
            publish(cluster.broker, queue, '[["run"], {}, {}]', **headers)
            sent += 1

    # Every other run goes on, on the same worker.
    run_id = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(run_id).status == "completed"
    client = redis.Redis.from_url(cluster.broker)
    eventually(
        lambda: client.llen(DEAD_TASKS) >= sent,
        what=f"the {sent} bad messages to be kept aside",
        context=lambda: client.llen(DEAD_TASKS),
    )
    assert worker.running, worker.log()[-3000:]
    assert "Unrecoverable error" not in worker.log()
    kept = [json.loads(raw) for raw in client.lrange(DEAD_TASKS, 0, -1)]
    assert {k["queue"] for k in kept} == {SESSION_QUEUE, "celery"}
    assert all(k["reason"] and k["task"] == "agent_jobs.coordinate" for k in kept)
    # Acknowledged, not requeued: nothing is left for the next worker to die on.
    assert client.llen(SESSION_QUEUE) == 0 and client.llen("celery") == 0
    worker.stop()
    again = cluster.worker(queues=f"{SESSION_QUEUE},celery")
    second = cluster.client.enqueue_run("w1", "go", actor="user-7")
    assert cluster.wait(second).status == "completed"
    assert again.running and client.llen(DEAD_TASKS) == sent
    client.close()
