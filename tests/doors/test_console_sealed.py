"""The runs console in a real browser (headless chromium) over a store that seals what it
keeps: `agent-jobs serve` on the embedded default (SQLite, the inline runner in the
server) with encryption on. The pages show a sealed run's input, output and tool
arguments clear, and the list shows a forgotten actor's run as "(forgotten)"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_jobs.encryption.codec import FORGOTTEN
from tests.support import encryption as test_encryption
from tests.support.apps.http import ANSWER
from tests.support.browser import browser_page
from tests.support.serve import TOKENS, Api, ApiServer, api_env
from tests.support.waiting import eventually
from tests.support.workers import ROOT

KEYS = {
    "AGENT_JOBS_ENCRYPTION_KEYS": test_encryption.KEYS_JSON,
    "AGENT_JOBS_ENCRYPTION_KEY_ID": test_encryption.KEY_ID,
}
INPUT = "refund it WOMBAT-INPUT"


def status(api: Api, actor: str, run_id: str) -> str:
    reply = api.call(actor, "GET", f"/v1/runs/{run_id}")
    assert reply.status_code == 200, reply.text
    found: str = reply.json()["status"]
    return found


def refunded(api: Api, actor: str) -> str:
    """A support run of `actor`'s whose refund alice approved, completed."""
    run_id = api.start(actor, text=INPUT)
    eventually(lambda: status(api, actor, run_id) == "awaiting_approval", what="the approval")
    reply = api.call(
        "alice", "POST", f"/v1/runs/{run_id}/approvals/call_1", json={"decision": "approve"}
    )
    assert reply.status_code == 200, reply.text
    eventually(lambda: status(api, actor, run_id) == "completed", what=f"run {run_id} to end")
    return run_id


def sign_in(page: Any, url: str, actor: str) -> None:
    page.goto(url)
    page.wait_for_selector("#sign-in:not([hidden])")
    page.fill("#token", TOKENS[actor])
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#who:not([hidden])")


def test_a_sealed_runs_pages_show_it_clear_and_a_forgotten_actors_run_as_forgotten(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agent_jobs.db"
    base = test_encryption.bare_environ()
    env = api_env(
        {**base, "PYTHONPATH": str(ROOT), "AGENT_JOBS_DATABASE_URL": f"sqlite:///{db}", **KEYS}
    )
    server = ApiServer(env, "serve-sealed-console").start()
    try:
        api = Api(server)
        kept = refunded(api, "user-7")
        doomed = refunded(api, "bob")
    finally:
        server.stop()
    assert b"WOMBAT" not in db.read_bytes()
    forgot = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "forget", "bob"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert forgot.returncode == 0, forgot.stderr
    # A server started afterwards: none of bob's data keys is open in it.
    server = ApiServer(env, "serve-sealed-console-after").start()
    try:
        with browser_page() as page:
            sign_in(page, server.url + f"/runs/{kept}", "user-7")
            page.wait_for_selector("#run[data-status='completed']")
            assert page.text_content("#run-input") == INPUT
            assert page.text_content("#result .output") == ANSWER
            refund = page.locator("li.step[data-step='tool:call_1']")
            refund.locator(".step-head").click()
            intent = refund.locator("pre.intent").text_content() or ""
            assert '"order_id": "42"' in intent and "$enc" not in intent
            result = json.loads(refund.locator("pre.result").text_content() or "null")
            assert result["result"] == {"order_id": "42", "refunded": 5}

            # The list, as the operator who sees every run: bob's run is still listed,
            # its input forgotten; user-7's shows clear.
            sign_out = page.locator("#sign-out")
            sign_out.click()
            sign_in(page, server.url + "/runs", "olga")
            for run_id in (kept, doomed):
                page.locator(f"li.run-row[data-run='{run_id}']").wait_for()
            shown = page.locator(f"li.run-row[data-run='{kept}'] .input").text_content()
            assert shown == INPUT
            gone = page.locator(f"li.run-row[data-run='{doomed}'] .input").text_content()
            assert gone == FORGOTTEN
            assert "$enc" not in page.content()
    finally:
        server.stop()
