"""Schedules on the embedded default (SQLite, no broker): the CLI's schedules commands and
`runs --schedule` as a user runs them, and `agent-jobs serve` ticking the schedules in
its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from tests.schedules.support import APP, EVERY_SECOND, PREFIX, assert_one_run_a_second
from tests.support import encryption as test_encryption
from tests.support.serve import ApiServer, api_env
from tests.support.waiting import eventually
from tests.support.workers import ROOT

NIGHTLY = "nightly|latest|30 2 * * *"


def embedded_env(tmp: Path, schedules: str) -> dict[str, str]:
    base = test_encryption.bare_environ()
    return {
        **base,
        "PYTHONPATH": str(ROOT),
        "AGENT_JOBS_DATABASE_URL": f"sqlite:///{tmp / 'agent_jobs.db'}",
        "AGENT_JOBS_APP": APP,
        "TEST_SCHEDULES": schedules,
    }


def agent_jobs(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_lists_pauses_resumes_and_runs_a_schedule_now(tmp_path: Path) -> None:
    env = embedded_env(tmp_path, NIGHTLY)
    listed = agent_jobs("schedules", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [nightly] = json.loads(listed.stdout)["schedules"]
    assert nightly["cron"] == "30 2 * * *" and nightly["timezone"] == "Europe/Paris"
    assert nightly["paused"] is False and nightly["next_occurrence"].endswith("Z")

    paused = agent_jobs("schedules", "pause", "nightly", env=env, cwd=tmp_path)
    assert paused.returncode == 0 and "schedule nightly paused" in paused.stdout
    again = agent_jobs("schedules", "pause", "nightly", env=env, cwd=tmp_path)
    assert "(it was already)" in again.stdout
    shown = agent_jobs("schedules", "list", env=env, cwd=tmp_path).stdout
    assert "nightly  paused  agent=reporter" in shown
    resumed = agent_jobs("schedules", "resume", "nightly", env=env, cwd=tmp_path)
    assert resumed.returncode == 0 and "schedule nightly resumed" in resumed.stdout

    # Without a broker, run-now drives the run here, to its end.
    now = agent_jobs("schedules", "run-now", "nightly", "--json", env=env, cwd=tmp_path)
    assert now.returncode == 0, now.stderr
    answer = json.loads(now.stdout)
    assert answer["run_id"].startswith("sched:nightly:now:") and answer["created"] is True
    assert answer["run"]["status"] == "completed" and answer["run"]["output"] == "report written"

    runs = agent_jobs("runs", "--schedule", "nightly", "--json", env=env, cwd=tmp_path)
    assert [r["run_id"] for r in json.loads(runs.stdout)] == [answer["run_id"]]
    none = agent_jobs("runs", "--schedule", "weekly", "--json", env=env, cwd=tmp_path)
    assert json.loads(none.stdout) == []

    unknown = agent_jobs("schedules", "run-now", "weekly", env=env, cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown schedule 'weekly'" in unknown.stderr


def test_a_bad_schedule_stops_the_app_from_loading(tmp_path: Path) -> None:
    env = embedded_env(tmp_path, "bad|latest|61 * * * *")
    done = agent_jobs("schedules", "list", env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "invalid cron expression '61 * * * *'" in done.stderr


def test_serve_without_a_broker_ticks_the_schedules(tmp_path: Path) -> None:
    env = api_env(embedded_env(tmp_path, EVERY_SECOND), AGENT_JOBS_APP=APP)
    env["AGENT_JOBS_SCHEDULE_INTERVAL"] = "0.5"
    server = ApiServer(env, "serve-schedules").start()
    try:
        with server.client("olga") as http:

            def listed() -> list[dict[str, object]] | None:
                reply = http.get("/v1/runs", params={"schedule": "every", "limit": 200})
                assert reply.status_code == 200, reply.text
                found: list[dict[str, object]] = reply.json()["runs"]
                done = [r for r in found if r["status"] == "completed"]
                return found if len(done) >= 3 and len(done) == len(found) else None

            found = eventually(listed, what=f"three completed runs\n{server.log()}")
            # A run id with colons is a path segment like any other.
            one = http.get(f"/v1/runs/{found[0]['run_id']}")
            assert one.status_code == 200 and one.json()["status"] == "completed", one.text
            steps = http.get(f"/v1/runs/{found[0]['run_id']}/steps")
            assert steps.status_code == 200 and steps.json()["steps"], steps.text
    finally:
        server.stop()
    ids = [str(r["run_id"]) for r in found]
    assert all(i.startswith(PREFIX) for i in ids)
    assert_one_run_a_second(
        sorted(datetime.fromisoformat(i[len(PREFIX) :].replace("Z", "+00:00")) for i in ids)
    )
