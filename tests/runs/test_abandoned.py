"""An inline run whose process is gone (agent_jobs/runners/inline/abandoned.py): the embedded
default's `agent-jobs run` killed while it waited for a person left its thread busy for
good. Now the next process that meets the run in its way — a run on its thread, a queued
run waiting for its key, a cancel — ends it, and a run whose process lives is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs import InlineRunner, RunAbandonedError, Store
from agent_jobs.processes import gone, this_process
from agent_jobs.settings import Settings
from agent_jobs.store import runs as run_rows
from agent_jobs.store import threads
from tests.doors.test_cli import _app_env, _start_waiting, _status, _until, agent_jobs
from tests.support import apps
from tests.support.apps import concurrency as concurrency_apps
from tests.support.services import truncate_all
from tests.support.waiting import TIMEOUT, eventually


def a_dead_driver() -> str:
    """The driver of a process of this host that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{socket.gethostname()}/{child.pid}/1"


def test_a_driver_is_gone_only_when_this_host_surely_has_no_such_process() -> None:
    mine = this_process()
    host, pid, start = mine.rsplit("/", 2)
    assert (host, int(pid)) == (socket.gethostname(), os.getpid()) and start
    assert not gone(mine) and not gone(None) and not gone("")
    assert gone(a_dead_driver())
    assert gone(f"{host}/{pid}/{int(start) + 1}")  # this pid, once another process's
    assert not gone(f"another-host/{a_dead_driver().split('/')[1]}/1")  # cannot tell
    parent = os.getppid()
    alive = subprocess.run(["cat", f"/proc/{parent}/stat"], capture_output=True, text=True)
    assert not gone(f"{host}/{parent}/{alive.stdout.rsplit(')', 1)[1].split()[19]}")


# --- the embedded default, as a person meets it -------------------------------------------


def test_a_killed_run_on_the_command_line_no_longer_holds_its_thread(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    first = _start_waiting(tmp_path, env, "a", "r1")
    try:
        doc = _until(tmp_path, env, "r1", "awaiting_approval")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    thread = doc["thread_id"]
    assert _status(tmp_path, env, "r1")["status"] == "awaiting_approval"  # none looked yet

    # Before the fix this was refused (and `enqueue` waited) for ever.
    done = agent_jobs(
        "run", "more", "--agent", "a", "--thread", thread, "--run-id", "r2",
        "--if-busy", "reject", "--yes", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "all done" in done.stdout
    ended = _status(tmp_path, env, "r1")
    assert (ended["status"], ended["error_type"]) == ("failed", "RunAbandonedError")
    assert f"pid {first.pid} on {socket.gethostname()}" in ended["error"]
    assert "exited before the run ended" in ended["error"]
    events = agent_jobs("events", thread, "--json", cwd=tmp_path, env=env)
    log = [(e["run_id"], e["type"], e["data"]) for e in json.loads(events.stdout)]
    assert ("r1", "turn/end", {"reason": "error"}) in log
    assert log.index(("r1", "turn/end", {"reason": "error"})) < log.index(
        ("r2", "turn/start", {"request": "more", "agent": "a"})
    )
    pending = agent_jobs("approvals", "pending", "--json", cwd=tmp_path, env=env)
    assert json.loads(pending.stdout or "[]") == []  # nothing left to decide


def test_cancelling_a_killed_run_ends_it(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    first = _start_waiting(tmp_path, env, "a", "r1")
    try:
        _until(tmp_path, env, "r1", "awaiting_approval")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    said = agent_jobs("cancel", "r1", cwd=tmp_path, env=env)
    assert said.returncode == 0 and "cancelling r1 (user)" in said.stdout, said.stderr
    ended = _status(tmp_path, env, "r1")
    assert (ended["status"], ended["error"]) == ("cancelled", "cancelled (user)")
    again = agent_jobs("cancel", "r1", cwd=tmp_path, env=env)
    assert "has already ended; nothing to cancel" in again.stdout


def test_a_live_run_of_another_process_is_left_alone(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    first = _start_waiting(tmp_path, env, "a", "r1")
    try:
        thread = _until(tmp_path, env, "r1", "awaiting_approval")["thread_id"]
        refused = agent_jobs(
            "run", "more", "--agent", "a", "--thread", thread, "--if-busy", "reject",
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert _status(tmp_path, env, "r1")["status"] == "awaiting_approval"
        # A cancel is left to the process that drives it, which ends the run itself.
        assert agent_jobs("cancel", "r1", cwd=tmp_path, env=env).returncode == 0
        assert _until(tmp_path, env, "r1", "cancelled")["error"] == "cancelled (user)"
    finally:
        first.kill()
        first.communicate()


# --- a key's place, and delegated runs --------------------------------------------------


@pytest.fixture
def inline(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[InlineRunner]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)
    apps.side_engine()
    store = Store.from_url(pg_url)
    truncate_all(store)
    yield InlineRunner(concurrency_apps.app, store, settings=Settings(), poll_interval=0.05)
    store.engine.dispose()


def abandoned_run(store: Store, run_id: str, driver: str | None, **fields: Any) -> None:
    """A running inline run of `single_slow` for actor "user-7", written straight to the
    store as a process (`driver`) left it."""
    thread_id = fields.pop("thread_id", run_id)
    with store.begin() as conn:
        threads.ensure_thread(conn, thread_id)
        run_rows.insert_run(
            conn,
            run_id=run_id,
            thread_id=thread_id,
            agent="single_slow",
            actor="user-7",
            persona=None,
            input="x",
            status="running",
            runner="inline",
            day="2026-01-01",
            metadata={},
            **fields,
        )
        if driver is not None:
            run_rows.set_driver(conn, [run_id], driver)


def test_a_dead_runs_place_of_its_key_is_given_up(inline: InlineRunner) -> None:
    abandoned_run(inline.store, "gone-1", a_dead_driver(), concurrency_key="user-7")
    run_id = inline.start("single_slow", "next", actor="user-7")
    run = inline.wait(run_id, timeout=TIMEOUT)
    assert (run.status, run.output) == ("completed", "slow done")
    gone_run = inline.store.get_run("gone-1")
    assert (gone_run.status, gone_run.error_type) == ("failed", RunAbandonedError.__name__)


def test_a_run_with_no_driver_or_a_live_one_keeps_its_place(
    inline: InlineRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[str | None] = []  # each finished look for abandoned runs in a run's way
    ends_abandoned = inline.queued.clear_way

    def counted(**in_the_way: Any) -> None:
        ends_abandoned(**in_the_way)
        looks.append(in_the_way.get("but"))

    monkeypatch.setattr(inline.queued, "clear_way", counted)
    abandoned_run(inline.store, "unknown-1", None, concurrency_key="user-7")
    run_id = inline.start("single_slow", "next", actor="user-7")
    # The queued run looked twice (the second look follows the first's admission check,
    # OTHERS_POLL later): it had its chance to end the run in its way, and did not.
    eventually(lambda: looks.count(run_id) >= 2, what="the queued run to look twice")
    assert inline.store.get_run(run_id).status == "queued"
    assert inline.store.get_run("unknown-1").status == "running"
    inline.cancel(run_id)
    assert inline.wait(run_id, timeout=TIMEOUT).status == "cancelled"


def test_a_dead_runs_delegated_runs_end_with_it(inline: InlineRunner) -> None:
    driver = a_dead_driver()
    abandoned_run(inline.store, "root-1", driver, thread_id="t-1")
    abandoned_run(inline.store, "child-1", driver, parent_run_id="root-1", root_run_id="root-1")
    assert inline.cancel("root-1") == ["root-1", "child-1"]
    for run_id in ("root-1", "child-1"):
        assert inline.store.get_run(run_id).status == "cancelled"
    assert inline.store.get_run("child-1").cancel_cause == "parent"
