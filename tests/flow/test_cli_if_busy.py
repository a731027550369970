"""`agent-jobs run --if-busy` on the embedded default (the inline runner on SQLite): a
run on a thread whose turn has not ended is refused (`reject`), or waits for that turn,
saying so (`enqueue`, the default)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import IO

from tests.doors.test_cli import CLI, _app_env, agent_jobs, status_in_db
from tests.support import encryption as test_encryption
from tests.support.waiting import eventually


def test_run_on_a_busy_thread_is_refused_or_waits_saying_for_what(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    environment = test_encryption.bare_environ() | env
    outputs: list[Path] = []
    files: list[IO[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        # Output to a file: a pipe nobody reads fills up and blocks the run.
        outputs.append(tmp_path / f"run{len(outputs)}.out")
        files.append(outputs[-1].open("w"))
        return subprocess.Popen(
            [*CLI, "run", *args],
            cwd=tmp_path,
            env=environment,
            stdin=subprocess.PIPE,  # open and silent: a terminal that never answers
            stdout=files[-1],
            stderr=subprocess.STDOUT,
            text=True,
        )

    def runs() -> list[dict[str, str]]:
        listed = agent_jobs("runs", "--json", cwd=tmp_path, env=env)
        return list(json.loads(listed.stdout or "[]"))

    first = start("go", "--agent", "a", "--run-id", "r1")
    second: subprocess.Popen[str] | None = None
    try:

        def pending() -> bool:
            assert first.poll() is None, outputs[0].read_text()
            return status_in_db(tmp_path, "r1") == "awaiting_approval"

        eventually(pending, what="r1 to ask for approval", every=0.05, context=outputs[0].read_text)
        status = agent_jobs("status", "r1", "--json", cwd=tmp_path, env=env)
        thread = json.loads(status.stdout)["thread_id"]

        before = runs()
        refused = agent_jobs(
            "run", "more", "--agent", "a", "--thread", thread, "--if-busy", "reject",
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert f"thread '{thread}' is busy: run 'r1' has not ended" in refused.stderr
        assert runs() == before  # nothing recorded

        second = start("more", "--agent", "a", "--thread", thread, "--run-id", "r2", "--yes")

        def told() -> str | None:
            assert second is not None and second.poll() is None, outputs[1].read_text()
            said = outputs[1].read_text()
            return said if "is queued" in said else None

        said = eventually(told, what="r2 to say it is queued", every=0.05)
        assert f"run r2 is queued (thread {thread} busy: run r1)" in said
        assert "agent-jobs cancel r2" in said
        assert agent_jobs("status", "r2", "--json", cwd=tmp_path, env=env).stdout.count(
            '"status": "queued"'
        )

        approved = agent_jobs("approve", "r1", "call_1", cwd=tmp_path, env=env)
        assert approved.returncode == 0, approved.stderr
        assert second.wait(timeout=60) == 0, outputs[1].read_text()
        assert "all done" in outputs[1].read_text()
        for run in runs():
            assert run["status"] == "completed", run
        # r2 waited for the turn: it began only after r1's turn ended.
        log = json.loads(agent_jobs("events", thread, "--json", cwd=tmp_path, env=env).stdout)
        turns = [(e["run_id"], e["type"]) for e in log if e["type"].startswith("turn/")]
        assert turns.index(("r1", "turn/end")) < turns.index(("r2", "turn/start")), turns
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.communicate()
        for file in files:
            file.close()
