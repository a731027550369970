"""The HTTP API of a server that seals what it stores: `agent-jobs serve` on the embedded
default (SQLite, the inline runner in the server) with encryption on. A run started,
asked a question, answered and finished over HTTP reads back clear at every route that
shows it, while the database file holds none of its words."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import encryption as test_encryption
from tests.support.serve import Api, ApiServer, api_env
from tests.support.waiting import eventually
from tests.support.workers import ROOT

KEYS = {
    "AGENT_JOBS_ENCRYPTION_KEYS": test_encryption.KEYS_JSON,
    "AGENT_JOBS_ENCRYPTION_KEY_ID": test_encryption.KEY_ID,
}
INPUT, ANSWER = "book me QUOKKA-INPUT", "Tuesday QUOKKA-ANSWER"


@pytest.fixture
def sealed_api(tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    db = tmp_path / "agent_jobs.db"
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")}
    env = api_env(
        {**base, "PYTHONPATH": str(ROOT), "AGENT_JOBS_DATABASE_URL": f"sqlite:///{db}", **KEYS}
    )
    server = ApiServer(env, "serve-sealed").start()
    try:
        yield Api(server), db
    finally:
        server.stop()


def status(api: Api, run_id: str) -> dict[str, Any]:
    reply = api.call("user-7", "GET", f"/v1/runs/{run_id}")
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    return found


def stored_bytes(db: Path) -> bytes:
    """The database as it is on disk: the file and its write-ahead log."""
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def test_a_sealed_run_reads_back_clear_at_every_route(sealed_api: tuple[Api, Path]) -> None:
    api, db = sealed_api
    run_id = api.start("user-7", agent="planner", text=INPUT)
    eventually(
        lambda: status(api, run_id)["status"] == "awaiting_answers",
        what=f"run {run_id} to ask its question",
    )
    [asked] = [
        q
        for q in api.call("user-7", "GET", "/v1/approvals").json()["questions"]
        if q["run_id"] == run_id
    ]
    assert asked["questions"][0]["question"] == "Which day suits you?"
    answered = api.call(
        "user-7",
        "POST",
        f"/v1/runs/{run_id}/answers/{asked['request_id']}",
        json={"answers": {"q1": ANSWER, "q2": "Morning"}},
    )
    assert answered.status_code == 200, answered.text
    eventually(
        lambda: status(api, run_id)["status"] == "completed",
        what=f"run {run_id} to complete",
    )

    run = status(api, run_id)
    assert run["input"] == INPUT and run["output"] == "planned"
    listed = api.call("user-7", "GET", "/v1/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]
    steps = api.call("user-7", "GET", f"/v1/runs/{run_id}/steps").text
    assert "QUOKKA-ANSWER" in steps and "a call booked for Tuesday" in steps

    on_disk = stored_bytes(db)
    assert run_id.encode() in on_disk and b"$enc" in on_disk
    for word in (b"QUOKKA", b"Which day suits you", b"a call booked", b"planned"):
        assert word not in on_disk, f"{word!r} is on disk in the clear"
