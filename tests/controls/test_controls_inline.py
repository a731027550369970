"""Operator controls on the inline runner (Postgres): a run it drives pauses at its next
step boundary and resumes, in this process or from another (`Client`, as `agent-jobs
resume` records it); a run that failed on a step is retried here; any run is forked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs import InlineRunner, checkpoints
from agent_jobs.client import Client
from agent_jobs.controls import Again
from agent_jobs.documents import run_document
from agent_jobs.errors import ControlRefusedError, InvalidRequestError
from agent_jobs.settings import Settings
from agent_jobs.store import RunView, Store
from tests.support.apps import controls as controls_apps
from tests.support.apps import executed
from tests.support.services import dispose, finish_inline, truncate_all
from tests.support.waiting import TIMEOUT, eventually, wait_status


class Inline:
    def __init__(self, store: Store, gates: Path) -> None:
        self.store = store
        self.gates = gates
        self.runner = InlineRunner(
            controls_apps.app, store, settings=Settings(), poll_interval=0.05
        )
        # Another process's doors: they record in the database alone.
        self.elsewhere = Client(store, controls_apps.app, Settings())

    def wait_for(self, check: Any, what: str) -> Any:
        return eventually(check, what=what)

    def wait_status(self, run_id: str, status: str) -> RunView:
        return wait_status(self.store, run_id, status, strict=True)

    def controls(self, run_id: str) -> list[tuple[str, str]]:
        doc = run_document(self.store, self.store.get_run(run_id))
        return [(c["event"], c["by"]) for c in doc["controls"]]


@pytest.fixture
def inline(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Inline]:
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", pg_url)  # where the executions are counted
    monkeypatch.setenv("TEST_GATE_DIR", str(tmp_path))
    store = Store.from_url(pg_url)
    truncate_all(store)
    made = Inline(store, tmp_path)
    try:
        yield made
    finally:
        finish_inline(made.runner)
        dispose(store)


def ran(run_id: str) -> list[str]:
    return [what for what, _ in executed(run_id)]


@pytest.mark.parametrize("resumer", ["here", "elsewhere"])
def test_a_run_driven_here_pauses_at_its_next_boundary_and_resumes(
    inline: Inline, resumer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = inline.runner
    looks: list[str] = []  # each look of the run's thread at a boundary, or while held
    look = runner.stops.look

    def counted(run_id: str) -> RunView | None:
        found = look(run_id)
        looks.append(run_id)
        return found

    monkeypatch.setattr(runner.stops, "look", counted)
    run_id = runner.start("pausable", "go", actor="user-7")
    inline.wait_for(lambda: "crawl:start" in ran(run_id), "the slow read to start")
    pauser = runner if resumer == "here" else inline.elsewhere
    assert pauser.pause(run_id, actor="alice") == [run_id]
    assert inline.store.get_run(run_id).status == "running"  # the read is still running

    run = inline.wait_status(run_id, "paused")
    assert run.waiting_on == "paused by alice"
    # The thread that drives it (here, whoever paused) holds it at the boundary, looking
    # again and again: two looks more and it had its chance to run on, and did not.
    seen = looks.count(run_id)
    eventually(lambda: looks.count(run_id) >= seen + 2, what="the held thread to look twice")
    assert ran(run_id) == ["model", "crawl:start", "crawl"]  # nothing more ran
    assert [row["step"] for row in inline.store.journal(run_id)][-1] == "tool:call_1"

    assert pauser.resume(run_id, actor="backend") == [run_id]
    run = runner.wait(run_id, timeout=TIMEOUT)
    assert run.status == "completed" and run.output == "all crawled"
    assert run.waiting_on is None
    assert ran(run_id).count("model") == 3
    assert inline.controls(run_id) == [
        ("run/pause", "alice"),
        ("run/paused", "alice"),
        ("run/resume", "backend"),
    ]
    statuses = [f for f in runner.frames(run_id) if f["type"] == "status"]
    assert {"type": "status", "run_id": run_id, "status": "paused", "by": "alice"} in statuses
    assert {"type": "status", "run_id": run_id, "status": "running", "resumed_by": "backend"} in (
        statuses
    )


def test_a_paused_run_that_is_cancelled_stops_there(inline: Inline) -> None:
    runner = inline.runner
    run_id = runner.start("pausable", "go", actor="user-7")
    inline.wait_for(lambda: "crawl:start" in ran(run_id), "the slow read to start")
    runner.pause(run_id, actor="alice")
    inline.wait_status(run_id, "paused")
    runner.cancel(run_id)
    run = runner.wait(run_id, timeout=TIMEOUT)
    assert run.status == "cancelled" and ran(run_id).count("model") == 1


def test_a_run_that_failed_on_a_step_is_retried_here_from_that_step(inline: Inline) -> None:
    runner = inline.runner
    run_id = runner.start("flaky", "go", actor="user-7")
    run = runner.wait(run_id, timeout=TIMEOUT)
    assert run.status == "failed" and run.error_type == "ModelError"
    before = inline.store.journal(run_id)

    (inline.gates / run_id).touch()
    assert runner.retry(run_id, actor="alice").steps == ["model:2"]
    run = runner.wait(run_id, timeout=TIMEOUT)
    assert run.status == "completed" and run.output == "answered after all"
    assert ran(run_id) == ["model", "peek", "model", "model"]  # model:2 ran once more
    after = inline.store.journal(run_id)
    assert after[: len(before)] == before  # the rows it had: read back, unchanged
    assert [row["step"] for row in after[len(before) :]] == [
        "model:2",
        "usage:2",
        "persist:assistant:2",
        "persist:title",
    ]
    assert inline.controls(run_id) == [("run/retry", "alice")]
    with pytest.raises(ControlRefusedError, match="only a run that failed"):
        runner.retry(run_id, actor="alice")


def test_a_retried_run_whose_code_spells_a_step_otherwise_fails_with_non_determinism(
    inline: Inline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry is driven by code that renamed a checkpoint the run recorded: its replay
    stops there, as a durable one does, instead of running the step again under its new
    name and going on."""
    runner = inline.runner
    run_id = runner.start("flaky", "go", actor="user-7")
    assert runner.wait(run_id, timeout=TIMEOUT).error_type == "ModelError"
    before = inline.store.journal(run_id)
    [seq] = [row["seq"] for row in before if row["step"] == "persist:toolexec:call_1"]

    monkeypatch.setattr(checkpoints, "toolexec", lambda call_id: f"persist:outcome:{call_id}")
    (inline.gates / run_id).touch()  # the model would answer now
    runner.retry(run_id, actor="alice")
    run = runner.wait(run_id, timeout=TIMEOUT)

    assert (run.status, run.error_type) == ("failed", "NonDeterminismError")
    assert (
        run.error is not None
        and (
            f"step 'persist:outcome:call_1' at position {seq}, where the journal recorded "
            "'persist:toolexec:call_1'"
        )
        in run.error
    )
    assert ran(run_id) == ["model", "peek", "model"]  # nothing ran again
    assert inline.store.journal(run_id) == before
    with pytest.raises(ControlRefusedError, match="would fail the same way again"):
        runner.retry(run_id, actor="alice")


def test_a_run_that_failed_otherwise_is_not_retried(inline: Inline) -> None:
    runner = inline.runner
    run_id = runner.start("pausable", "go", actor="user-7")
    runner.cancel(run_id)
    assert runner.wait(run_id, timeout=TIMEOUT).status == "cancelled"
    with pytest.raises(ControlRefusedError, match="cancelled"):
        runner.retry(run_id, actor="alice")


@pytest.mark.parametrize(
    ("at", "reran"),
    [("model:2", ["model", "charge", "model"]), ("tool:call_2", ["charge", "model"])],
)
def test_a_run_is_forked_here_at_a_model_or_a_tool_step(
    inline: Inline, at: str, reran: list[str]
) -> None:
    runner = inline.runner
    source = runner.start("forkable", "go", actor="user-7")
    inline.wait_status(source, "awaiting_approval")
    assert runner.signal(source, "call_2", "approve", actor="alice")
    assert runner.wait(source, timeout=TIMEOUT).status == "completed"

    forked = runner.fork(source, at, actor="alice")
    assert forked.runs_again == [Again("tool:call_2", "charge", "call_2")]
    # The charge is asked for again: at a tool step too (a fork inherits no decision).
    assert forked.asked_again == [Again("approval:call_2", "charge", "call_2")]
    inline.wait_status(forked.run_id, "awaiting_approval")
    assert ran(forked.run_id) == reran[:-2]
    assert runner.signal(forked.run_id, "call_2", "approve", actor="alice")
    run = runner.wait(forked.run_id, timeout=TIMEOUT)
    assert run.status == "completed" and run.output == "Order 42 charged."
    assert run.thread_id != inline.store.get_run(source).thread_id
    assert ran(forked.run_id) == reran
    source_thread = inline.store.get_run(source).thread_id
    assert inline.store.thread_messages(run.thread_id) == inline.store.thread_messages(
        source_thread
    )
    with pytest.raises(InvalidRequestError, match="no step"):
        runner.fork(source, "model:9", actor="alice")
