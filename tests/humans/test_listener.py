"""The approvals listener, a subprocess, fed bad input on both doors: nothing changes, it serves on.

Each case parks a real run (a worker subprocess drives it), posts one bad message on
the pub/sub channel or the stream, waits for the listener to count it under the
expected reason, checks that the database is exactly as before, and then shows the
listener still serving: a good signed decision completes the run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apps import executed
from tests.support.doors import SECRET, Doors, approval, cli, open_doors, signed, wait_for
from tests.support.waiting import TIMEOUT
from tests.support.workers import Process

LISTENER_BROKER_DB = 4
FAST = {"AGENT_JOBS_LISTENER_CLAIM_IDLE": "0.5"}

Payload = Callable[[str, str], Any]


def answers(run_id: str, request_id: str, given: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "answers",
        "run_id": run_id,
        "request_id": request_id,
        "answers": given,
        "actor": "alice",
    }


CASES: list[tuple[str, Payload, str]] = [
    ("invalid_json", lambda r, c: b'{"type": "approval", "run_id": ', "invalid_json"),
    ("binary_1mib", lambda r, c: os.urandom(1 << 20), "too_large"),
    ("binary_small", lambda r, c: b"\xff\xfe\x00garbage\x80", "invalid_json"),
    ("json_array", lambda r, c: json.dumps([r, c]), "not_an_object"),
    ("unknown_type", lambda r, c: signed({**approval(r, c), "type": "vote"}), "unknown_type"),
    (
        "missing_field",
        lambda r, c: signed({k: v for k, v in approval(r, c).items() if k != "call_id"}),
        "invalid_message",
    ),
    ("bad_decision", lambda r, c: signed(approval(r, c, "maybe")), "invalid_message"),
    ("extra_field", lambda r, c: signed(approval(r, c, admin=True)), "invalid_message"),
    (
        "nul_in_reason",
        lambda r, c: signed(approval(r, c, reason="a\x00b")),
        "invalid_message",
    ),
    ("unsigned", lambda r, c: approval(r, c), "bad_signature"),
    ("wrong_secret", lambda r, c: signed(approval(r, c), "not-the-secret"), "bad_signature"),
    (
        "tampered",
        lambda r, c: {**signed(approval(r, c, "reject")), "decision": "approve"},
        "bad_signature",
    ),
    ("unknown_run", lambda r, c: signed(approval("no-such-run", c)), "unknown_run"),
    ("unknown_call", lambda r, c: signed(approval(r, "call_99")), "unknown_call"),
    ("not_an_approver", lambda r, c: signed({**approval(r, c), "actor": "eve"}), "refused"),
    ("args_changed", lambda r, c: signed(approval(r, c, args_sha256="0" * 64)), "refused"),
    (
        "answers_to_no_question",
        lambda r, c: signed(answers(r, "call_1:ask", {"q1": "Tuesday"})),
        "refused",
    ),
    (
        "answers_not_an_object",
        lambda r, c: signed({**answers(r, "call_1:ask", {}), "answers": ["Tuesday"]}),
        "invalid_message",
    ),
]


@pytest.fixture(scope="module")
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("listener")
    with open_doors(pg_url, redis_url, LISTENER_BROKER_DB, tmp, **FAST) as d:
        d.worker()
        d.start_listener(AGENT_JOBS_LISTENER_HEALTH_FILE=str(d.tmp / "listener.alive"))
        yield d


def post(doors: Doors, source: str, payload: Any) -> None:
    if source == "pubsub":
        assert doors.publish(payload) == 1, "the listener is not subscribed"
    else:
        doors.xadd(payload)


def still_serving(doors: Doors, run_id: str, call_id: str, source: str) -> None:
    """A good decision after the bad ones: recorded, and the run completes."""
    recorded = doors.count("recorded")
    post(doors, source, signed(approval(run_id, call_id)))
    wait_for(lambda: doors.count("recorded") == recorded + 1, "the good decision")
    doors.wait_status(run_id, "completed")
    assert doors.listener is not None and doors.listener.running


@pytest.mark.parametrize("source", ["pubsub", "stream"])
@pytest.mark.parametrize(("case", "payload", "reason"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_changes_nothing_and_the_listener_serves_on(
    doors: Doors, source: str, case: str, payload: Payload, reason: str
) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.snapshot(run_id)
    counted = doors.count(reason)

    post(doors, source, payload(run_id, call_id))
    wait_for(lambda: doors.count(reason) == counted + 1, f"a {reason} refusal\n{doors.logs()}")

    assert doors.snapshot(run_id) == before
    assert ("refund", f"{run_id}:tool:{call_id}") not in executed(run_id)
    if source == "stream":  # settled: acknowledged and gone, nothing left pending
        wait_for(lambda: doors.redis.xlen(doors.channel) == 0, "the entry to be acknowledged")
    log = doors.listener.log() if doors.listener else ""
    assert reason in log
    still_serving(doors, run_id, call_id, source)


def test_the_first_decision_wins_and_repeats_change_nothing(doors: Doors) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    post(doors, "pubsub", signed(approval(run_id, call_id, reason="looks right")))
    doors.wait_status(run_id, "completed")
    after = doors.snapshot(run_id)
    already = doors.count("already_decided")

    post(doors, "pubsub", signed(approval(run_id, call_id, "reject")))
    post(doors, "stream", signed(approval(run_id, call_id)))
    wait_for(lambda: doors.count("already_decided") == already + 2, "two repeats")

    assert doors.snapshot(run_id) == after
    [call] = [c for c in after["calls"] if c["call_id"] == call_id]
    assert (call["decision"], call["decided_by"], call["decision_reason"]) == (
        "approve",
        "alice",
        "looks right",
    )
    assert executed(run_id).count(("refund", f"{run_id}:tool:{call_id}")) == 1
    run_id, call_id = doors.parked()
    still_serving(doors, run_id, call_id, "stream")


def test_an_entry_without_a_message_field_is_refused(doors: Doors) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.snapshot(run_id)
    counted = doors.count("invalid_message")
    doors.xadd(signed(approval(run_id, call_id)), field="decision")
    wait_for(lambda: doors.count("invalid_message") == counted + 1, "the refusal")
    assert doors.snapshot(run_id) == before
    still_serving(doors, run_id, call_id, "stream")


def test_a_rejection_reaches_the_model(doors: Doors) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    post(doors, "stream", signed(approval(run_id, call_id, "reject", reason="not today")))
    doors.wait_status(run_id, "completed")
    [call] = [c for c in doors.store.tool_calls(run_id) if c["call_id"] == call_id]
    assert call["status"] == "rejected" and call["decision_reason"] == "not today"
    assert ("refund", f"{run_id}:tool:{call_id}") not in executed(run_id)


def test_logs_never_show_the_secret_or_a_signature(doors: Doors) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    message = signed(approval(run_id, call_id))
    post(doors, "pubsub", {**message, "decision": "reject"})  # a bad signature, logged
    still_serving(doors, run_id, call_id, "pubsub")
    log = doors.listener.log() if doors.listener else ""
    assert SECRET not in log
    assert message["sig"] not in log


def test_an_entry_a_dead_listener_left_pending_is_reclaimed(doors: Doors, tmp_path: Path) -> None:
    """A listener that read an entry and died before settling it: another takes it over."""
    doors.reset()
    run_id, call_id = doors.parked()
    ghost = Doors(doors.broker, doors.pg_url, tmp_path, **FAST)  # a channel nobody listens on yet
    try:
        ghost.redis.xgroup_create(ghost.channel, "agent_jobs", id="0", mkstream=True)
        ghost.xadd(signed(approval(run_id, call_id)))
        taken: Any = ghost.redis.xreadgroup("agent_jobs", "dead-one", {ghost.channel: ">"})
        assert len(taken[0][1]) == 1  # delivered to a consumer that will never settle it

        ghost.start_listener()
        wait_for(lambda: ghost.count("recorded") == 1, f"the reclaim\n{ghost.logs()}")
        doors.wait_status(run_id, "completed")
        assert ghost.redis.xlen(ghost.channel) == 0
        pending: Any = ghost.redis.xpending(ghost.channel, "agent_jobs")
        assert pending["pending"] == 0
    finally:
        ghost.close()


def test_a_poison_entry_is_moved_aside_after_too_many_deliveries(
    doors: Doors, tmp_path: Path
) -> None:
    """An entry that has already been delivered the maximum number of times (it took
    listeners down with it) goes to the dead-letter stream instead of being tried again."""
    doors.reset()
    run_id, call_id = doors.parked()
    ghost = Doors(doors.broker, doors.pg_url, tmp_path, **FAST)
    try:
        ghost.redis.xgroup_create(ghost.channel, "agent_jobs", id="0", mkstream=True)
        entry = ghost.xadd(signed(approval(run_id, call_id)))
        ghost.redis.xreadgroup("agent_jobs", "crashed-1", {ghost.channel: ">"})
        # Four more listeners claimed it and died: five deliveries so far.
        ghost.redis.xclaim(
            ghost.channel, "agent_jobs", "crashed-5", 0, [entry], retrycount=5, idle=60_000
        )

        ghost.start_listener()
        wait_for(lambda: ghost.count("dead_lettered") == 1, f"the dead letter\n{ghost.logs()}")
        [(_, fields)] = ghost.redis.xrange(f"{ghost.channel}:dead")
        assert fields[b"entry_id"].decode() == entry
        assert int(fields[b"deliveries"]) == 6
        assert json.loads(fields[b"message"])["call_id"] == call_id
        assert ghost.redis.xlen(ghost.channel) == 0
        assert doors.store.get_run(run_id).status == "awaiting_approval"  # nothing recorded

        # Re-posting the same decision (say, from the dead letter) is safe and works.
        ghost.xadd(fields[b"message"].decode())
        doors.wait_status(run_id, "completed")
    finally:
        ghost.close()


def test_the_health_file_is_touched_while_the_listener_serves(doors: Doors) -> None:
    health = doors.tmp / "listener.alive"
    wait_for(health.exists, "the health file")
    first = health.stat().st_mtime_ns
    wait_for(lambda: health.stat().st_mtime_ns > first, "the health file to be touched again")


def test_without_a_secret_the_listener_refuses_to_start_unless_told(
    doors: Doors, tmp_path: Path
) -> None:
    env = {k: v for k, v in doors.env.items() if k != "AGENT_JOBS_APPROVAL_SECRET"}
    refused = cli("approvals", "listen", env=env, timeout=TIMEOUT)
    assert refused.returncode == 2
    assert "AGENT_JOBS_APPROVAL_SECRET is not set" in refused.stderr
    assert "--allow-unsigned" in refused.stderr

    doors.reset()
    run_id, call_id = doors.parked()
    open_door = Doors(doors.broker, doors.pg_url, tmp_path, **FAST)
    try:
        open_door.env.pop("AGENT_JOBS_APPROVAL_SECRET")
        proc = Process(
            [sys.executable, "-m", "agent_jobs.cli", "approvals", "listen", "--allow-unsigned"],
            open_door.env,
            "listener",
        ).start(ready="listening on channel")
        open_door.procs.append(proc)
        assert "unsigned decisions are accepted" in proc.log()
        assert open_door.publish(approval(run_id, call_id)) == 1
        doors.wait_status(run_id, "completed")
    finally:
        open_door.close()


def test_the_listener_survives_redis_losing_everything(doors: Doors) -> None:
    """FLUSHDB takes the stream and its consumer group: the listener recreates them."""
    doors.reset()
    run_id, call_id = doors.parked()
    doors.redis.flushdb()
    doors.xadd(signed(approval(run_id, call_id)))
    doors.wait_status(run_id, "completed")
    assert doors.listener is not None and doors.listener.running
    run_id, call_id = doors.parked()  # and the group it reads with works on
    doors.xadd(signed(approval(run_id, call_id)))
    doors.wait_status(run_id, "completed")
    wait_for(lambda: doors.redis.xlen(doors.channel) == 0, "the entries to be acknowledged")


@pytest.mark.parametrize("source", ["pubsub", "stream"])
def test_answers_to_a_tools_question_are_recorded_and_the_run_goes_on(
    doors: Doors, source: str
) -> None:
    doors.reset()
    run_id = doors.client.enqueue_run("planner", "book a call", actor="user-7")
    doors.wait_status(run_id, "awaiting_answers")
    question = wait_for(lambda: frame_of(doors, run_id, "question"), "the question frame")
    assert [q["id"] for q in question["questions"]] == ["q1"]

    post(doors, source, signed(answers(run_id, question["request_id"], {"q1": "Tuesday"})))
    doors.wait_status(run_id, "completed")
    [result] = [c for c in doors.store.tool_calls(run_id) if c["name"] == "schedule"]
    assert result["result"] == "a call booked for Tuesday"

    after = doors.snapshot(run_id)
    repeated = doors.count("already_decided")
    post(doors, source, signed(answers(run_id, question["request_id"], {"q1": "Friday"})))
    wait_for(lambda: doors.count("already_decided") == repeated + 1, "the repeat")
    assert doors.snapshot(run_id) == after


def frame_of(doors: Doors, run_id: str, kind: str) -> dict[str, Any] | None:
    for _, fields in doors.redis.xrange(f"agent_jobs:stream:{run_id}"):
        frame: dict[str, Any] = json.loads(fields[b"frame"])
        if frame["type"] == kind:
            return frame
    return None
