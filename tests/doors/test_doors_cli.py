"""`agent-jobs tail` and `agent-jobs run` on the durable runner, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import apps
from tests.support.doors import ROOT, Doors, cli, open_doors, wait_for

CLI_BROKER_DB = 7
ANSWER = "Order 42 was refunded."


@pytest.fixture(scope="module")
def doors(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with open_doors(pg_url, redis_url, CLI_BROKER_DB, tmp_path_factory.mktemp("cli")) as d:
        d.worker(concurrency=4)
        yield d


class Tail:
    """`agent-jobs tail RUN_ID --json` in the background, its lines read as they come."""

    def __init__(self, doors: Doors, run_id: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_jobs.cli", "tail", run_id, "--json", *extra],
            cwd=ROOT,
            env=doors.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # (time.time() the line was read, the entry): the clock of the stream's ids.
        self.entries: list[tuple[float, dict[str, Any]]] = []

    def until(self, kind: str) -> dict[str, Any]:
        """Read lines up to the next `kind` frame (a line at a time: `tail` ends, or the
        test's time limit stops a hang)."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"tail ended early: {self.proc.stderr.read() if self.proc.stderr else ''}"
            entry: dict[str, Any] = json.loads(line)
            self.entries.append((time.time(), entry))
            if entry["frame"]["type"] == kind:
                return entry

    def finish(self, timeout: float = 30) -> int:
        """Read on to the end (lines already buffered included) and return the exit code."""
        assert self.proc.stdout is not None
        watchdog = threading.Timer(timeout, self.proc.kill)
        watchdog.start()
        try:
            for line in self.proc.stdout:
                self.entries.append((time.time(), json.loads(line)))
            return self.proc.wait(timeout=5)
        finally:
            watchdog.cancel()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def test_tail_follows_live_and_resumes_after_an_entry(doors: Doors) -> None:
    doors.reset()
    run_id = doors.client.enqueue_run("support", "Where is order 42?", actor="user-7")
    tail = Tail(doors, run_id)
    try:
        request = tail.until("approval_request")
        assert request["frame"]["tool"] == "refund" and len(request["frame"]["args_sha256"]) == 64
        assert tail.proc.poll() is None  # still following while the run waits
        stream_key = f"agent_jobs:stream:{run_id}"
        assert doors.redis.ttl(stream_key) == -1  # a parked run's stream stays open

        approved = cli(
            "approve", run_id, request["frame"]["call_id"], "--actor", "alice", env=doors.env
        )
        assert approved.returncode == 0, approved.stderr
        assert tail.finish() == 0
    finally:
        tail.kill()
    frames = [entry["frame"] for _, entry in tail.entries]
    assert frames[-1] == {"type": "done", "run_id": run_id, "output": ANSWER}
    assert 0 < doors.redis.ttl(stream_key) <= 3600  # it expires a while after the end

    resumed = cli("tail", run_id, "--json", "--after", request["id"], env=doors.env)
    assert resumed.returncode == 0, resumed.stderr
    after = [json.loads(line) for line in resumed.stdout.splitlines()]
    position = [entry["id"] for _, entry in tail.entries].index(request["id"])
    assert after == [entry for _, entry in tail.entries][position + 1 :]


def test_tail_prints_tokens_as_the_model_streams_them(doors: Doors) -> None:
    doors.reset()
    # The model says its first word, then holds the second until the test lets it: tail
    # must have printed the first while the second did not exist (a tail that waited for
    # the step, or for more text, would print nothing and the wait below would give up).
    run_id = doors.client.enqueue_run("held_words", "go", actor="user-7")
    tail = Tail(doors, run_id)
    try:
        tail.until("text_delta")
        stream = doors.redis.xrange(f"agent_jobs:stream:{run_id}")
        words = [e for e in stream if b'"text_delta"' in e[1].get(b"frame", b"")]
        assert len(words) == 1, words  # the second word is held back by the model
        apps.open_gate(run_id)
        tail.until("text_delta")
        assert tail.finish() == 0
    finally:
        tail.kill()
    deltas = [e["frame"]["text"] for _, e in tail.entries if e["frame"]["type"] == "text_delta"]
    assert deltas == ["thinking ", "slowly ", "survived"]


def test_tail_in_text_shows_the_conversation(doors: Doors) -> None:
    doors.reset()
    run_id = doors.client.enqueue_run("support", "Where is order 42?", actor="user-7")
    doors.wait_status(run_id, "awaiting_approval")
    doors.client.approve(run_id, "call_3", actor="alice")
    doors.wait_status(run_id, "completed")
    done = cli("tail", run_id, env=doors.env)
    assert done.returncode == 0, done.stderr
    assert "Checking. " in done.stdout and ANSWER in done.stdout
    assert "→ lookup" in done.stdout and "← refund executed" in done.stdout
    assert f"needs approval: agent-jobs approve {run_id} call_3" in done.stdout
    assert "✓ done" in done.stdout


def test_tail_refuses_unknown_and_inline_runs(doors: Doors) -> None:
    doors.reset()
    assert cli("tail", "no-such-run", env=doors.env).returncode == 3
    inline_env = {k: v for k, v in doors.env.items() if k != "AGENT_JOBS_BROKER_URL"}
    ran = cli("run", "go", "--agent", "w1", "--actor", "user-7", "--json", env=inline_env)
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    done = cli("tail", run_id, env=doors.env)
    assert done.returncode == 2
    assert "ran on the inline runner" in done.stderr


def test_run_with_a_broker_follows_the_stream_and_asks_at_the_prompt(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "run",
        "Where is order 42?",
        "--agent",
        "support",
        "--actor",
        "user-7",
        "--approver",
        "alice",
        env=doors.env,
        input="y\n",
    )
    assert done.returncode == 0, done.stderr
    assert "Checking. " in done.stdout and ANSWER in done.stdout
    assert "→ lookup" in done.stdout and "refund" in done.stdout
    assert "needs approval" in done.stdout and "approve? [y/N]" in done.stderr
    [run] = doors.store.list_runs()
    assert run.runner == "durable" and run.status == "completed"
    [call] = [c for c in doors.store.tool_calls(run.run_id) if c["name"] == "refund"]
    assert call["decision"] == "approve" and call["decided_by"] == "alice"


def test_run_with_a_broker_rejects_at_the_prompt(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "run", "go", "--agent", "gated", "--actor", "user-7", "--approver", "alice",
        env=doors.env, input="n\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [run] = doors.store.list_runs()
    [call] = [c for c in doors.store.tool_calls(run.run_id) if c["name"] == "refund"]
    assert call["status"] == "rejected" and call["decision_reason"] == "rejected at the terminal"


def test_run_with_a_broker_answers_questions_at_the_prompt(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "run", "set up a call", "--agent", "planner", "--actor", "user-7",
        env=doors.env, input="Friday\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Which day suits you?" in done.stderr and "planned" in done.stdout
    [run] = doors.store.list_runs()
    assert run.runner == "durable" and run.status == "completed"
    [call] = doors.store.tool_calls(run.run_id)
    assert call["result"] == "a call booked for Friday"


def test_run_with_a_broker_yes_and_json(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "run", "Where is order 42?", "--agent", "support", "--actor", "user-7",
        "--approver", "alice", "--yes", "--json", "--run-id", "yes-json-1",
        env=doors.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["run_id"] == "yes-json-1" and doc["status"] == "completed"
    assert doc["output"] == ANSWER and doc["runner"] == "durable"


def test_run_with_a_broker_reports_a_refused_decision(doors: Doors) -> None:
    doors.reset()
    done = cli(
        "run", "go", "--agent", "gated", "--actor", "user-7", "--yes",
        env=doors.env,
    )  # fmt: skip
    assert done.returncode == 2
    assert "may not decide on refund" in done.stderr
    [run] = doors.store.list_runs()
    wait_for(lambda: doors.store.pending_calls(run.run_id), "the call to stay pending")
