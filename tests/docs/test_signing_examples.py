"""The README's signing examples, run as written: their signatures verify."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import redis

from agent_jobs.approvals.messages import ApprovalMessage, parse_message
from tests.support.doors import claim_db

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "docs" / "humans.md").read_text()
SECRET = "readme-secret-ünïcode"


def block_after(heading: str, language: str) -> str:
    """The first fenced `language` block after the line that starts with `heading`."""
    start = README.index(heading)
    match = re.compile(rf"```{language}\n(.*?)```", re.DOTALL).search(README, start)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def test_the_shell_example_signs_what_the_listener_verifies(tmp_path: Path) -> None:
    calls = tmp_path / "redis-cli-calls"
    fake = tmp_path / "redis-cli"  # records what the example would send
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "RUN_ID": "run-1",
        "CALL_ID": "call_3",
        "AGENT_JOBS_APPROVAL_SECRET": SECRET,
        "REDIS_URL": "redis://unused",
    }
    script = block_after("Signing in the shell", "sh")
    done = subprocess.run(["bash", "-euc", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv = calls.read_text().splitlines()
    assert argv[:4] == ["-u", "redis://unused", "PUBLISH", "agent_jobs:approvals"]
    message = parse_message(argv[4], secret=SECRET)
    assert isinstance(message, ApprovalMessage)
    assert (message.run_id, message.call_id, message.decision) == ("run-1", "call_3", "approve")


def test_the_python_example_signs_what_the_listener_verifies(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_JOBS_APPROVAL_SECRET", SECRET)
    with claim_db(redis_url, 8) as url:
        code = block_after("Signing in Python", "python").replace("redis://redis:6379/0", url)
        exec(compile(code, "README.md", "exec"), {"run_id": "run-2"})
        client = redis.Redis.from_url(url)
        try:
            [(_, fields)] = client.xrange("agent_jobs:approvals")
            message = parse_message(fields[b"message"], secret=SECRET)
            assert isinstance(message, ApprovalMessage) and message.run_id == "run-2"
            assert json.loads(fields[b"message"])["actor"] == "alice"
        finally:
            client.close()
