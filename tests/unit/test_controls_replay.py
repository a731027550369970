"""Operator controls at the replay's seam, offline: a retry row read in its failed step's
place (the durable replay, and the journal cursor both runners replay with), and where a
fork may start. Recorded journals (`journals/`), no database, no Redis."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent_jobs.controls.fork import fork_point
from agent_jobs.controls.retry import unretried_failures
from agent_jobs.errors import InvalidRequestError, StepFailedError, Suspend
from agent_jobs.runners.cursor import JournalCursor, Slot

from .test_replay import Row, fixture, hooks_for, replay, rows_of


def retried(rows: list[Row], step: str, *attempts: tuple[str, Any]) -> list[Row]:
    """`rows` with `step` failed, and its retry rows after the last (state, result)."""
    out = [
        replace(r, state="failed", result=None, error="kaput") if r.step == step else r
        for r in rows
    ]
    seq = max(r.seq for r in rows)
    original = next(r for r in rows if r.step == step)
    for k, (state, result) in enumerate(attempts, start=1):
        seq += 1
        out.append(Row(f"retry:{k}:{step}", seq, state, result if state == "done" else None))
    assert original.result is not None
    return out


@pytest.mark.parametrize("step", ["model:3", "tool:call_1", "tool:call_3", "model:1"])
def test_a_retry_row_stands_in_for_its_failed_step(step: str) -> None:
    data = fixture("support")
    rows = rows_of(data)
    result = next(r.result for r in rows if r.step == step)
    hooks = hooks_for(data, retried(rows, step, ("failed", None), ("done", result)))
    assert replay(hooks).output == data["run"]["output"]
    assert hooks.new_rows == [] and hooks.to_dispatch == []


def test_a_retry_row_in_flight_suspends_the_replay_and_schedules_nothing() -> None:
    data = fixture("support")
    hooks = hooks_for(data, retried(rows_of(data), "model:2", ("scheduled", None)))
    with pytest.raises(Suspend):
        replay(hooks)
    assert hooks.new_rows == [] and hooks.to_dispatch == []


def test_a_failed_step_with_no_retry_fails_the_replay() -> None:
    data = fixture("support")
    hooks = hooks_for(data, retried(rows_of(data), "model:2", ("failed", None)))
    with pytest.raises(StepFailedError):
        replay(hooks)


def test_steps_after_a_retried_step_take_positions_after_its_retry_row() -> None:
    """The run failed at model:3, was retried, and goes on: its next rows follow the
    retry row, and the replay reads them at their positions."""
    data = fixture("support")
    rows = rows_of(data)
    cut = next(r.seq for r in rows if r.step == "model:3")
    model3 = next(r for r in rows if r.step == "model:3")
    head = [r for r in rows if r.seq < cut]
    tail = [replace(r, seq=r.seq + 1) for r in rows if r.seq > cut]
    again = [
        replace(model3, state="failed", result=None),
        Row("retry:1:model:3", cut + 1, "done", model3.result),
    ]
    hooks = hooks_for(data, [*head, *again, *tail])
    assert replay(hooks).output == data["run"]["output"]
    assert hooks.new_rows == []


def test_the_cursor_reads_each_step_in_its_place_by_its_last_attempt() -> None:
    rows = retried(
        rows_of(fixture("support")), "tool:call_1", ("failed", None), ("done", {"ok": True})
    )
    cursor = JournalCursor(rows)
    read = {
        row.step: cursor.done(row.step, cursor.take(row.step).row)
        for row in rows
        if not row.step.startswith("retry:")
    }
    assert read["tool:call_1"] == rows[-1] and rows[-1].result == {"ok": True}
    assert None not in read.values()
    assert cursor.take("tool:call_9") == Slot(max(r.seq for r in rows) + 1, None)
    failed = retried(rows_of(fixture("support")), "model:2")
    assert (
        JournalCursor(failed).done("model:2", next(r for r in failed if r.step == "model:2"))
        is None
    )


def test_the_failures_a_retry_runs_again_are_the_last_attempts_that_failed() -> None:
    rows = rows_of(fixture("support"))
    assert unretried_failures(rows) == []
    once = retried(rows, "model:2", ("failed", None))
    assert [(s, k) for s, k, _ in unretried_failures(once)] == [("model:2", 1)]
    done = retried(rows, "model:2", ("done", {"x": 1}))
    assert unretried_failures(done) == []


def with_intents(rows: list[Row]) -> list[Row]:
    """The fixture's rows, each tool row with the intent that names its call."""
    out = []
    for row in rows:
        if row.step.startswith("tool:"):
            call = row.step.removeprefix("tool:")
            row = replace(row, intent={"type": "invoke_tool", "call": {"id": call, "name": "x"}})
        out.append(row)
    return out


def test_a_fork_may_start_before_or_at_a_fan_out_but_not_inside_it() -> None:
    rows = with_intents(rows_of(fixture("support")))
    for step in ("tool:call_1", "persist:toolexec:call_1", "model:2", "tool:call_3", "quota:check"):
        assert fork_point("r", rows, step).step == step
    with pytest.raises(InvalidRequestError, match="inside a fan-out"):
        fork_point("r", rows, "tool:call_2")
    with pytest.raises(InvalidRequestError, match="no step"):
        fork_point("r", rows, "tool:call_7")
    with pytest.raises(InvalidRequestError, match="tokens"):
        fork_point("r", rows, "usage:2")
    again = retried(rows, "model:3", ("done", {"x": 1}))
    with pytest.raises(InvalidRequestError, match="fork at model:3"):
        fork_point("r", again, "retry:1:model:3")
