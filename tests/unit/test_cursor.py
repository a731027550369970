"""The journal cursor both runners replay with (agent_jobs/runners/cursor.py), offline:
which recorded row answers the step the loop asks for now, and when the loop's request
contradicts the journal. Rows as `journal.load_for_replay` reads them; no database."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from agent_jobs.errors import NonDeterminismError
from agent_jobs.runners.cursor import JournalCursor, Marker, Slot

PATCH = "patch:agent:parallel-tools"


@dataclass(frozen=True)
class Row:
    step: str
    seq: int
    state: str = "done"
    result: Any = None
    error: str | None = None


def journal(*steps: str) -> list[Row]:
    """Rows of done steps at positions 1, 2, …, each with its name as its result."""
    return [Row(step, seq, result=step) for seq, step in enumerate(steps, start=1)]


def taken(cursor: JournalCursor, *steps: str) -> list[tuple[int, str | None]]:
    """(position, recorded step) of each step asked for in turn."""
    found = [cursor.take(step) for step in steps]
    return [(slot.seq, None if slot.row is None else slot.row.step) for slot in found]


# --- order ---------------------------------------------------------------------------------


def test_each_step_is_the_row_at_its_position_and_a_new_one_follows_the_last() -> None:
    cursor = JournalCursor(journal("quota:check", "persist:user", "load:thread"))
    assert taken(cursor, "quota:check", "persist:user", "load:thread") == [
        (1, "quota:check"),
        (2, "persist:user"),
        (3, "load:thread"),
    ]
    assert cursor.take("prepare:1") == Slot(4, None)
    cursor.put(Marker("prepare:1", 4, "done"))
    assert cursor.take("model:1") == Slot(5, None)


def test_another_step_at_a_recorded_position_raises_naming_both() -> None:
    cursor = JournalCursor(journal("quota:check", "persist:user", "load:thread"))
    cursor.take("quota:check")
    with pytest.raises(NonDeterminismError) as caught:
        cursor.take("load:thread")
    error = caught.value
    assert (error.seq, error.expected, error.got) == (2, "persist:user", "load:thread")
    assert "'load:thread' at position 2, where the journal recorded 'persist:user'" in str(error)


def test_a_step_recorded_at_another_position_raises() -> None:
    """A hole in the journal (a fork's decision asked again) is where a new row goes, but
    not a step the journal holds further on."""
    rows = [r for r in journal("a", "approval:c", "b", "tool:c") if r.step != "approval:c"]
    cursor = JournalCursor(rows)
    cursor.take("a")
    with pytest.raises(NonDeterminismError) as caught:
        cursor.take("b")
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (2, None, "b")
    assert "elsewhere" in str(caught.value)

    cursor = JournalCursor(rows)
    assert taken(cursor, "a", "approval:c", "b") == [(1, "a"), (2, None), (3, "b")]


def test_a_done_row_is_read_back_and_any_other_is_not() -> None:
    cursor = JournalCursor([Row("a", 1), Row("approval:c", 2, "waiting")])
    assert cursor.done("a", cursor.take("a").row) == Row("a", 1)
    assert cursor.done("approval:c", cursor.take("approval:c").row) is None
    assert cursor.done("b", cursor.take("b").row) is None


# --- retries -------------------------------------------------------------------------------


def test_a_failed_step_is_read_by_its_last_retry_and_positions_step_over_retry_rows() -> None:
    rows = [
        Row("a", 1),
        Row("model:2", 2, "failed", error="kaput"),
        Row("retry:1:model:2", 3, "failed", error="kaput again"),
        Row("retry:2:model:2", 4, result="answered"),
        Row("usage:2", 5),
    ]
    cursor = JournalCursor(rows)
    assert taken(cursor, "a", "model:2", "usage:2") == [(1, "a"), (2, "model:2"), (5, "usage:2")]
    assert cursor.attempt("model:2", rows[1]) == rows[3]
    assert cursor.done("model:2", rows[1]) == rows[3]
    assert cursor.take("persist:assistant:2") == Slot(6, None)


def test_a_failed_step_with_no_retry_that_worked_is_not_done() -> None:
    rows = [Row("a", 1), Row("tool:c", 2, "failed"), Row("retry:1:tool:c", 3, "scheduled")]
    cursor = JournalCursor(rows)
    assert cursor.attempt("tool:c", rows[1]) == rows[2]
    assert cursor.done("tool:c", rows[1]) is None
    assert taken(cursor, "a", "tool:c", "persist:toolexec:c") == [
        (1, "a"),
        (2, "tool:c"),
        (4, None),
    ]


# --- fan-outs ------------------------------------------------------------------------------


def test_a_fan_outs_rows_are_found_by_name_and_the_steps_after_it_follow_its_last() -> None:
    rows = journal("persist:toolcall:c1", "persist:toolcall:c2", "tool:c2", "tool:c1", "x")
    cursor = JournalCursor(rows)
    taken(cursor, "persist:toolcall:c1", "persist:toolcall:c2")
    with cursor.fan_out():
        assert taken(cursor, "tool:c1", "tool:c2") == [(4, "tool:c1"), (3, "tool:c2")]
    assert taken(cursor, "x", "y") == [(5, "x"), (6, None)]


def test_a_fan_outs_new_members_take_the_free_positions_one_each() -> None:
    """The inline runner's members ask from threads of their own."""
    cursor = JournalCursor(journal("persist:toolcall:c1", "tool:c1"))
    cursor.take("persist:toolcall:c1")
    names = [f"tool:c{i}" for i in range(1, 9)]
    start = threading.Barrier(len(names))

    def member(name: str) -> Slot:
        start.wait()
        return cursor.take(name)

    with cursor.fan_out(), ThreadPoolExecutor(len(names)) as pool:
        slots = dict(zip(names, pool.map(member, names), strict=True))
    assert slots["tool:c1"] == Slot(2, Row("tool:c1", 2, result="tool:c1"))
    assert sorted(slots[name].seq for name in names[1:]) == list(range(3, 10))
    assert all(slots[name].row is None for name in names[1:])
    assert cursor.take("persist:toolexec:c1") == Slot(10, None)


# --- patches and a change of shape ---------------------------------------------------------


def test_a_patch_question_is_answered_by_the_next_position() -> None:
    cursor = JournalCursor(journal("a", PATCH, "b"))
    cursor.take("a")
    assert cursor.patched(PATCH) is True
    assert cursor.patched(PATCH) is True  # asked again, further on: no position
    assert taken(cursor, "b") == [(3, "b")]

    old = JournalCursor(journal("a", "b"))
    old.take("a")
    assert old.patched(PATCH) is False  # recorded before the patch existed
    assert taken(old, "b") == [(2, "b")]

    assert old.patched(PATCH) is None  # the frontier: the caller records its row at pos
    assert old.pos == 3


def test_a_change_of_shape_raises_at_the_first_position_it_contradicts() -> None:
    """A journal of the concurrent shape, asked for by code that runs the calls one by one
    and asks no patch question (what a rollback past the patch looks like)."""
    recorded = journal(
        "persist:assistant:1",
        PATCH,
        "persist:toolcall:c1",
        "persist:toolcall:c2",
        "tool:c1",
        "tool:c2",
    )
    cursor = JournalCursor(recorded)
    cursor.take("persist:assistant:1")
    with pytest.raises(NonDeterminismError) as caught:
        cursor.take("persist:toolcall:c1")
    assert (caught.value.seq, caught.value.expected, caught.value.got) == (
        2,
        PATCH,
        "persist:toolcall:c1",
    )

    # The code that asks the question but answers it the old way, past the patch's row.
    cursor = JournalCursor(recorded)
    taken(cursor, "persist:assistant:1")
    assert cursor.patched(PATCH) is True
    taken(cursor, "persist:toolcall:c1")
    with pytest.raises(NonDeterminismError, match="where the journal recorded 'persist:toolcall"):
        cursor.take("tool:c1")
