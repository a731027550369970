"""The command line, run as a user would: a subprocess in an empty directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "agent_jobs.cli"]


def agent_jobs(
    *args: str, cwd: Path, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")} | (
        env or {}
    )
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        input=input,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_with_no_configuration_streams_and_asks_for_approval(tmp_path: Path) -> None:
    done = agent_jobs("run", "Where is order 42?", cwd=tmp_path, input="y\n")
    assert done.returncode == 0, done.stderr
    assert "Let me check order 42 and its shipment." in done.stdout
    assert "→ lookup_order" in done.stdout and "→ track_shipment" in done.stdout
    assert "refund" in done.stdout and "needs approval" in done.stdout
    assert "approve? [y/N]" in done.stderr
    assert "so I refunded 129.00 (reference RF-42-001)" in done.stdout
    assert (tmp_path / "agent_jobs.db").exists()  # the embedded SQLite default

    listed = agent_jobs("runs", "--json", cwd=tmp_path)
    [run] = json.loads(listed.stdout)
    status = agent_jobs("status", run["run_id"], "--json", cwd=tmp_path)
    doc = json.loads(status.stdout)
    assert doc["run_id"] == run["run_id"]
    assert doc["status"] == "completed"
    assert doc["output"].startswith("Order 42 (espresso grinder) was lost")
    assert doc["usage"]["model_calls"] == 3

    journal = agent_jobs("journal", run["run_id"], cwd=tmp_path)
    assert "persist:toolcall:call_3" in journal.stdout and "approval:call_3" in journal.stdout


def test_rejecting_at_the_prompt_reaches_the_model(tmp_path: Path) -> None:
    done = agent_jobs("run", "Where is order 42?", cwd=tmp_path, input="n\n")
    assert done.returncode == 0, done.stderr
    assert "was not approved" in done.stdout


def test_yes_and_json_give_machine_output(tmp_path: Path) -> None:
    done = agent_jobs("run", "Where is order 42?", "--yes", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and "RF-42-001" in doc["output"]
    assert doc["run_id"]


def test_unknown_run_is_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    done = agent_jobs("status", "no-such-run", cwd=tmp_path)
    assert done.returncode == 3
    assert done.stderr.strip() == (
        "error: no run with id 'no-such-run'; `agent-jobs runs` lists the known ones"
    )
    assert agent_jobs("approve", "no-such-run", "call_1", cwd=tmp_path).returncode == 3


@pytest.mark.parametrize(
    ("app_path", "message"),
    [
        ("no_such_module:app", "cannot import 'no_such_module'"),
        ("json:nothing", "json has no 'nothing'"),
        ("json:dumps", "is a function, not an AgentApp"),
        ("justamodule", "must look like 'package.module:attribute'"),
    ],
)
def test_a_broken_app_path_is_one_line(tmp_path: Path, app_path: str, message: str) -> None:
    done = agent_jobs("run", "hi", cwd=tmp_path, env={"AGENT_JOBS_APP": app_path})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "agent_jobs.db").exists() or "Traceback" not in done.stderr


def test_unknown_agent_is_one_line(tmp_path: Path) -> None:
    done = agent_jobs("run", "hi", "--agent", "nobody", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: unknown agent 'nobody'; this app defines: support"
    assert json.loads(agent_jobs("runs", "--json", cwd=tmp_path).stdout) == []


def test_approve_from_another_process_releases_an_inline_run(tmp_path: Path) -> None:
    """`agent-jobs approve` records in the database; the waiting inline turn picks it up."""
    app_module = tmp_path / "slowapp.py"
    app_module.write_text(
        "from agent_jobs import AgentApp, ScriptedModel\n"
        "app = AgentApp(roles={'cli': ['lead']})\n"
        "@app.tool(kind='action', approvers=['lead'])\n"
        "def ship(box: str) -> str:\n"
        "    return 'shipped ' + box\n"
        "app.agent('a', model=ScriptedModel([\n"
        "    {'tool_calls': [{'name': 'ship', 'args': {'box': 'b1'}}]},\n"
        "    {'text': 'all done'}]), tools=['ship'])\n"
    )
    env = {"AGENT_JOBS_APP": "slowapp:app", "PYTHONPATH": str(tmp_path)}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")} | env
    # A run whose terminal never answers: stdin stays open and silent.
    proc = subprocess.Popen(
        [*CLI, "run", "go", "--agent", "a", "--run-id", "r1"],
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(200):
            pending = agent_jobs("approvals", "pending", "--json", cwd=tmp_path, env=env)
            if json.loads(pending.stdout or "[]"):
                break
        else:
            pytest.fail("the run never asked for approval")
        approved = agent_jobs("approve", "r1", "call_1", cwd=tmp_path, env=env)
        assert approved.returncode == 0 and "approved call_1" in approved.stdout
        again = agent_jobs("reject", "r1", "call_1", cwd=tmp_path, env=env)
        assert "already decided" in again.stdout
        status = agent_jobs("status", "r1", "--json", cwd=tmp_path, env=env)
        for _ in range(100):
            status = agent_jobs("status", "r1", "--json", cwd=tmp_path, env=env)
            if json.loads(status.stdout)["status"] == "completed":
                break
        assert json.loads(status.stdout)["output"] == "all done"
    finally:
        proc.kill()
        proc.communicate()
