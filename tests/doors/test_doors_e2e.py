"""End to end, entirely from outside: a plain Celery client enqueues, `redis-cli` decides.

A worker, beat and the approvals listener run as subprocesses (logging JSON lines).
The run is started by a process that never imports this project; the decision is
signed with the standard library and posted with `redis-cli`; the conversation is
read back with `agent-jobs tail --json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.apps import executed
from tests.support.doors import (
    Doors,
    approval,
    cli,
    open_doors,
    plain_celery_send,
    redis_cli,
    signed,
    wait_for,
)

E2E_BROKER_DB = 5
QUESTION = {"agent": "support", "input": "Where is order 42?", "actor": "user-7"}
ANSWER = "Order 42 was refunded."


@pytest.fixture(scope="module")
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("e2e")
    with open_doors(pg_url, redis_url, E2E_BROKER_DB, tmp, AGENT_JOBS_LOG_FORMAT="json") as d:
        d.worker(queues="agent_jobs,celery")
        d.beat()
        yield d


def conversation(doors: Doors, run_id: str) -> list[dict[str, Any]]:
    """The run's stream, read with `agent-jobs tail --json` (it ends with the run)."""
    done = cli("tail", run_id, "--json", env=doors.env, timeout=30)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def approval_request(doors: Doors, run_id: str) -> dict[str, Any]:
    def requested() -> dict[str, Any] | None:
        for _, fields in doors.redis.xrange(f"agent_jobs:stream:{run_id}"):
            frame: dict[str, Any] = json.loads(fields[b"frame"])
            if frame["type"] == "approval_request":
                return frame
        return None

    found: dict[str, Any] = wait_for(requested, f"an approval request\n{doors.logs()}")
    return found


def assert_whole_conversation(doors: Doors, run_id: str, call_id: str) -> None:
    entries = conversation(doors, run_id)
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, key=lambda i: tuple(int(p) for p in i.split("-")))
    frames = [e["frame"] for e in entries]
    assert all(f["run_id"] == run_id for f in frames)
    text = "".join(f["text"] for f in frames if f["type"] == "text_delta")
    assert text == "Checking. Refunding. " + ANSWER
    story = [
        (f["type"], f.get("tool"), f.get("status"))
        for f in frames
        if f["type"] in ("tool_call", "tool_result", "approval_request", "done")
    ]
    assert story == [
        ("tool_call", "lookup", "auto_executed"),
        ("tool_call", "lookup", "auto_executed"),
        ("tool_result", "lookup", "executed"),
        ("tool_result", "lookup", "executed"),
        ("tool_call", "refund", "pending_approval"),
        ("approval_request", "refund", None),
        ("tool_result", "refund", "executed"),
        ("done", None, None),
    ]
    kinds = [f["type"] for f in frames]
    # Text and actions interleave as they happened: the first words before the reads, the
    # second before the refund is asked for, the answer after it ran.
    first_delta, refund_asked = kinds.index("text_delta"), kinds.index("approval_request")
    assert first_delta < kinds.index("tool_call")
    assert kinds.index("tool_result") < max(
        i for i, k in enumerate(kinds[:refund_asked]) if k == "text_delta"
    )
    assert frames[-1] == {"type": "done", "run_id": run_id, "output": ANSWER}
    assert [f["call_id"] for f in frames if f["type"] == "approval_request"] == [call_id]


def assert_json_logs_name_the_run(doors: Doors, run_id: str) -> None:
    worker, listener = doors.procs[0].log(), doors.listener.log() if doors.listener else ""
    records = []
    for line in (worker + listener).splitlines():
        assert not line.startswith("[20"), f"a log line that is not JSON: {line}"
        if line.startswith("{"):
            records.append(json.loads(line))
    steps = {r.get("step") for r in records if r.get("run_id") == run_id}
    assert {"model:1", "tool:call_3", "approval:call_3"} <= steps
    assert any(r.get("outcome") == "recorded" and r.get("run_id") == run_id for r in records)
    # A run a plain client started is named after its start_run task, in the logs too.
    # (The module's worker serves every test of it: the others' tasks are in its log.)
    started = [
        r for r in records if r.get("task") == "agent_jobs.start_run" and r["task_id"] == run_id
    ]
    assert started and all(r["run_id"] == run_id for r in started)
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)


def test_enqueue_from_a_plain_client_and_approve_with_redis_cli_publish(doors: Doors) -> None:
    doors.reset()
    doors.start_listener(AGENT_JOBS_LOG_FORMAT="json")
    try:
        [run_id] = plain_celery_send(doors.broker, [{"kwargs": QUESTION}])
        request = approval_request(doors, run_id)
        message = signed(approval(run_id, request["call_id"], args_sha256=request["args_sha256"]))
        receivers = redis_cli(doors.broker, "PUBLISH", doors.channel, json.dumps(message))
        assert receivers == "1"

        doors.wait_status(run_id, "completed")
        run = doors.store.get_run(run_id)
        assert run.output == ANSWER
        assert_whole_conversation(doors, run_id, request["call_id"])
        assert executed(run_id).count(("refund", f"{run_id}:tool:{request['call_id']}")) == 1
        assert_json_logs_name_the_run(doors, run_id)
    finally:
        doors.stop_listener()


def test_a_decision_added_to_the_stream_while_no_listener_runs(doors: Doors) -> None:
    doors.reset()
    [run_id] = plain_celery_send(doors.broker, [{"kwargs": QUESTION, "queue": "agent_jobs"}])
    request = approval_request(doors, run_id)
    doors.wait_status(run_id, "awaiting_approval")
    message = signed(approval(run_id, request["call_id"], args_sha256=request["args_sha256"]))
    # Published now, it would be lost: nobody is subscribed. Added to the stream, it waits.
    assert redis_cli(doors.broker, "PUBLISH", doors.channel, json.dumps(message)) == "0"
    entry = redis_cli(doors.broker, "XADD", doors.channel, "*", "message", json.dumps(message))
    assert entry

    pending = cli("approvals", "pending", "--json", env=doors.env)
    assert [c["call_id"] for c in json.loads(pending.stdout)] == [request["call_id"]]

    doors.start_listener()
    try:
        doors.wait_status(run_id, "completed")
        assert doors.store.get_run(run_id).output == ANSWER
        assert_whole_conversation(doors, run_id, request["call_id"])
        wait_for(lambda: doors.redis.xlen(doors.channel) == 0, "the entry to be acknowledged")
    finally:
        doors.stop_listener()
    stats = cli("approvals", "stats", "--json", env=doors.env)
    assert json.loads(stats.stdout)["counters"].get("recorded", 0) >= 1
