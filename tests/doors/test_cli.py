"""The command line, run as a user would: a subprocess in an empty directory."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import encryption as test_encryption
from tests.support.waiting import TIMEOUT, eventually

CLI = [sys.executable, "-m", "agent_jobs.cli"]


def agent_jobs(
    *args: str, cwd: Path, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = test_encryption.bare_environ() | (env or {})
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
    # The refund's arguments as the demo's model writes them, then the call.
    lines = done.stdout.splitlines()
    writing = lines.index('… refund {"order_id": "42", "amount": 129.0}')
    assert lines[writing + 1].startswith('→ refund({"order_id": "42", "amount": 129.0})')
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
    bogus = agent_jobs("runs", "--status", "bogus", cwd=tmp_path)  # was "no runs yet", exit 0
    assert bogus.returncode == 2 and "'bogus' is not one of" in bogus.stderr, bogus
    none = agent_jobs("runs", "--status", "failed", cwd=tmp_path)
    assert none.returncode == 0 and none.stdout.strip() == "no runs match"


@contextmanager
def running(
    args: list[str], tmp_path: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], Callable[[], str]]]:
    """`agent-jobs ARGS` going on in the background, with a terminal that never answers
    unless written to (stdin stays open), and what it printed so far. Its output goes to
    a file: a pipe nobody reads fills up and blocks the run while it waits."""
    environment = test_encryption.bare_environ() | env
    path = tmp_path / "run.out"
    with path.open("w") as output:
        proc = subprocess.Popen(
            [*CLI, *args],
            cwd=tmp_path,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield proc, lambda: path.read_text()
        finally:
            proc.kill()
            proc.communicate()


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
    # A run whose terminal never answers: stdin stays open and silent.
    with running(["run", "go", "--agent", "a", "--run-id", "r1"], tmp_path, env) as (proc, said):

        def pending() -> bool:
            assert proc.poll() is None, said()[-3000:]
            return status_in_db(tmp_path, "r1") == "awaiting_approval"

        eventually(
            pending,
            what="the run to ask for approval",
            every=0.05,
            context=lambda: said()[-3000:],
        )
        listed = agent_jobs("approvals", "pending", "--json", cwd=tmp_path, env=env)
        assert [c["call_id"] for c in json.loads(listed.stdout)] == ["call_1"], listed.stdout
        approved = agent_jobs("approve", "r1", "call_1", cwd=tmp_path, env=env)
        assert approved.returncode == 0 and "approved call_1" in approved.stdout
        again = agent_jobs("reject", "r1", "call_1", cwd=tmp_path, env=env)
        assert again.returncode == 6, again  # a late decision: told apart from one that counted
        assert "already decided by cli; nothing changed" in again.stderr

        done = _until(tmp_path, env, "r1", "completed")
        assert done["output"] == "all done"
        # Who decided, and when, in the text of `status` and `journal` (not only --json).
        for command in ("status", "journal"):
            shown = agent_jobs(command, "r1", cwd=tmp_path, env=env).stdout
            assert re.search(r"decided: call_1 \S+ approved by cli at \d{4}-\S+Z", shown), shown


APP_MODULE = """
from agent_jobs import AgentApp, ScriptedModel

app = AgentApp(roles={'cli': ['lead']})

@app.tool(kind='action', approvers=['lead'])
def ship(box: str) -> str:
    return 'shipped ' + box

@app.tool(kind='read')
def schedule(what: str, ctx) -> str:
    if ctx.answers is None:
        ctx.ask(['Which day suits you?'])
    return what + ' on ' + ctx.answers['q1']

app.agent('a', model=ScriptedModel([
    {'tool_calls': [{'name': 'ship', 'args': {'box': 'b1'}}]},
    {'text': 'all done'}]), tools=['ship'])
app.agent('planner', model=ScriptedModel([
    {'tool_calls': [{'name': 'schedule', 'args': {'what': 'a call'}}]},
    {'text': 'planned'}]), tools=['schedule'])
"""


def _app_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    return {"AGENT_JOBS_APP": "cliapp:app", "PYTHONPATH": str(tmp_path)}


def test_run_answers_a_tools_questions_at_the_prompt(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    done = agent_jobs("run", "plan", "--agent", "planner", cwd=tmp_path, input="Friday\n", env=env)
    assert done.returncode == 0, done.stderr
    assert "Which day suits you?" in done.stderr
    assert "planned" in done.stdout
    [run] = json.loads(agent_jobs("runs", "--json", cwd=tmp_path, env=env).stdout)
    log = agent_jobs("events", run["run_id"], cwd=tmp_path, env=env)
    assert "turn/start" in log.stdout and "turn/end" in log.stdout
    assert "agent idle; inbox: 0 for the next step, 0 for the next turn" in log.stdout


def _start_waiting(tmp_path: Path, env: dict[str, str], agent: str, run_id: str) -> Any:
    environment = test_encryption.bare_environ() | env
    proc = subprocess.Popen(
        [*CLI, "run", "go", "--agent", agent, "--run-id", run_id],
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


def _status(tmp_path: Path, env: dict[str, str], run_id: str) -> dict[str, Any]:
    done = agent_jobs("status", run_id, "--json", cwd=tmp_path, env=env)
    return json.loads(done.stdout) if done.returncode == 0 else {"status": None}


def status_in_db(tmp_path: Path, run_id: str) -> str | None:
    """The run's status as the embedded database in `tmp_path` has it, read-only (no
    subprocess a look: a wait polls this, then asks the command line once)."""
    try:
        with closing(sqlite3.connect(f"file:{tmp_path / 'agent_jobs.db'}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    except sqlite3.Error:  # not made yet, or being made
        return None
    return None if row is None else str(row[0])


def _until(tmp_path: Path, env: dict[str, str], run_id: str, status: str) -> dict[str, Any]:
    eventually(
        lambda: status_in_db(tmp_path, run_id) == status,
        what=f"{run_id} to be {status}",
        every=0.05,
        context=lambda: status_in_db(tmp_path, run_id),
    )
    doc = _status(tmp_path, env, run_id)
    assert doc["status"] == status, doc
    return doc


def test_answer_cancel_and_say_from_another_process(tmp_path: Path) -> None:
    env = _app_env(tmp_path)
    asking = _start_waiting(tmp_path, env, "planner", "q1run")
    waiting = _start_waiting(tmp_path, env, "a", "c1run")
    try:
        doc = _until(tmp_path, env, "q1run", "awaiting_answers")
        request_id = doc["waiting_on"].split()[-1]
        answered = agent_jobs(
            "answer", "q1run", request_id, '{"q1": "Monday"}', cwd=tmp_path, env=env
        )
        assert answered.returncode == 0 and "answered" in answered.stdout, answered.stderr
        assert _until(tmp_path, env, "q1run", "completed")["output"] == "planned"
        late = agent_jobs("answer", "q1run", request_id, '{"q1": "Tuesday"}', cwd=tmp_path, env=env)
        assert late.returncode == 6 and "already answered" in late.stderr, late

        _until(tmp_path, env, "c1run", "awaiting_approval")
        waits = agent_jobs("events", "c1run", cwd=tmp_path, env=env).stdout.splitlines()
        assert waits[-1].startswith("agent awaiting_approval (run c1run); inbox:"), waits
        # One way to write a moment, everywhere: ISO 8601 in UTC, to the millisecond.
        assert re.search(r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", waits[0]), waits[0]
        said = agent_jobs(
            "say", "c1run", "after this, ship b2", "--target", "next-turn", cwd=tmp_path, env=env
        )
        assert "queued for the next turn" in said.stdout, said.stderr
        cancelled = agent_jobs("cancel", "c1run", "--keep-inbox", cwd=tmp_path, env=env)
        assert "cancelling c1run (user)" in cancelled.stdout, cancelled.stderr
        assert _until(tmp_path, env, "c1run", "cancelled")["error"] == "cancelled (user)"
        log = agent_jobs("events", "c1run", cwd=tmp_path, env=env).stdout
        assert "turn/stopping" in log and '"reason": "aborted"' in log
        assert "inbox: 0 for the next step, 1 for the next turn" in log
        again = agent_jobs("cancel", "c1run", cwd=tmp_path, env=env)
        assert "already ended" in again.stdout
        bad = agent_jobs("answer", "q1run", request_id, "not json", cwd=tmp_path, env=env)
        assert bad.returncode == 2 and "not JSON" in bad.stderr
    finally:
        for proc in (asking, waiting):
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("AGENT_JOBS_RATE_LIMITS", '{"openai:*": {"requests_per_minut": 5}, "k": "s3cr3t"}', ""),
        ("AGENT_JOBS_PRUNE_BATCH", "0", "greater than or equal to 1"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, setting: str, value: str, said: str
) -> None:
    done = agent_jobs("runs", cwd=tmp_path, env={setting: value})
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: invalid settings: {setting}: ") and said in line
    assert "Traceback" not in done.stderr and "s3cr3t" not in done.stderr
    assert not (tmp_path / "agent_jobs.db").exists()  # nothing was done


def test_without_agent_the_apps_only_agent_runs_and_several_must_be_named(
    tmp_path: Path,
) -> None:
    """`--agent` defaulted to `support` whatever the app defined."""
    (tmp_path / "soloapp.py").write_text(
        "from agent_jobs import AgentApp, ScriptedModel\n"
        "app = AgentApp()\n"
        'app.agent("solo", model=ScriptedModel([{"text": "solo here"}]))\n'
        "two = AgentApp()\n"
        'two.agent("a", model=ScriptedModel([{"text": "a"}]))\n'
        'two.agent("b", model=ScriptedModel([{"text": "b"}]))\n'
    )
    done = agent_jobs("run", "hi", "--json", cwd=tmp_path, env={"AGENT_JOBS_APP": "soloapp:app"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["agent"] == "solo"
    several = agent_jobs("run", "hi", cwd=tmp_path, env={"AGENT_JOBS_APP": "soloapp:two"})
    assert several.returncode == 2
    assert several.stderr.strip() == (
        "error: this app defines several agents (a, b): name one with --agent"
    )


def test_on_an_app_whose_runner_cannot_decide_nobody_is_asked_and_the_hint_works(
    tmp_path: Path,
) -> None:
    """The demo hid it (`cli` holds every role): with `dev-1` asking and only `boss` able
    to decide, every hint named an actor who was refused, and `dev-1` was asked."""
    (tmp_path / "opsapp.py").write_text(
        "from agent_jobs import AgentApp, ScriptedModel\n"
        "app = AgentApp(roles={'dev-1': ['ops'], 'boss': ['approver']})\n"
        "@app.tool(kind='action', roles=['ops'], approvers=['approver'])\n"
        "def restart(service: str) -> str:\n"
        "    return 'restarted ' + service\n"
        "app.agent('ops', model=ScriptedModel([\n"
        "    {'tool_calls': [{'name': 'restart', 'args': {'service': 'api'}}]},\n"
        "    {'text': 'restarted it'}]), tools=['restart'])\n"
    )
    env = {"AGENT_JOBS_APP": "opsapp:app"}
    args = ["run", "go", "--actor", "dev-1", "--run-id", "ops1"]
    with running(args, tmp_path, env) as (proc, said):
        assert proc.stdin is not None
        proc.stdin.write("y\n")  # a terminal that would answer y, if it were asked
        proc.stdin.flush()
        eventually(lambda: "reject it:" in said(), what="the hint", context=said)
        assert "who may decide: an actor with the role approver (boss)" in said()
        assert "approve?" not in said()  # dev-1 may not decide: not asked
        [hint] = [line for line in said().splitlines() if "approve it:" in line]
        words = shlex.split(hint.split("approve it:", 1)[1])
        assert words == ["agent-jobs", "approve", "ops1", "call_1", "--actor", "boss"]
        done = agent_jobs(*words[1:], cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert proc.wait(timeout=TIMEOUT) == 0, said()
        assert status_in_db(tmp_path, "ops1") == "completed"
