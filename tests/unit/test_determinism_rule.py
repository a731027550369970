"""The loop stays deterministic: ruff's banned-api rule refuses clocks, randomness, I/O."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOP = (ROOT / "agent_jobs" / "loop.py").read_text()


def ruff(source: str, filename: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--select",
            "TID251",
            "--stdin-filename",
            filename,
            "-",
        ],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_loop_as_written_passes() -> None:
    assert ruff(LOOP, "agent_jobs/loop.py").returncode == 0


@pytest.mark.parametrize(
    "line",
    [
        "import time",
        "from datetime import datetime",
        "import random",
        "import uuid",
        "import os",
        "from sqlalchemy import select",
        "import celery",
        "import redis",
        "import threading",
    ],
)
def test_a_clock_random_id_or_io_in_the_loop_is_refused(line: str) -> None:
    done = ruff(f"{line}\n{LOOP}", "agent_jobs/loop.py")
    assert done.returncode == 1
    assert "TID251" in done.stdout


def test_the_rule_guards_the_loop_alone() -> None:
    assert ruff("import time\nimport uuid\n", "agent_jobs/executor.py").returncode == 0
