"""Parked loops take turns with their passes, and are let go of when stale."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from agent_jobs.errors import Suspend
from agent_jobs.runners.durable.journal_cache import Read
from agent_jobs.runners.durable.sticky import ParkedLoop, StickyLoops

BORN = datetime(2026, 12, 1, tzinfo=UTC)


def _row(seq: int, state: str = "done") -> SimpleNamespace:
    return SimpleNamespace(step=f"s{seq}", seq=seq, state=state)


def _hooks(rows: list[SimpleNamespace]) -> SimpleNamespace:
    return SimpleNamespace(
        by_seq={r.seq: r for r in rows}, by_name={r.step: r for r in rows}, seen_final=0
    )


def _parked(run_id: str, hooks: Any) -> tuple[ParkedLoop, list[str]]:
    """A loop that parks twice, then returns; what it did, in order."""
    loop = ParkedLoop(run_id, BORN, hooks)
    did: list[str] = []

    def body() -> str:
        did.append("first")
        loop.park(Suspend("a"))
        did.append("second")
        loop.park(Suspend("b"))
        return "done"

    with pytest.raises(Suspend, match="a"):
        loop.start(body)
    return loop, did


def test_the_loop_and_its_passes_take_turns() -> None:
    loop, did = _parked("r", _hooks([]))
    assert loop.parked and did == ["first"]
    with pytest.raises(Suspend, match="b"):
        loop.resume()
    assert did == ["first", "second"]
    assert loop.resume() == "done" and not loop.parked
    with pytest.raises(RuntimeError, match="not parked in this thread"):
        loop.resume()


def test_what_the_loop_raises_is_raised_in_the_pass() -> None:
    loop = ParkedLoop("r", BORN, _hooks([]))

    def body() -> None:
        raise ValueError("in the loop")

    with pytest.raises(ValueError, match="in the loop"):
        loop.start(body)


def test_a_loop_let_go_of_unwinds() -> None:
    loop = ParkedLoop("gone-run", BORN, _hooks([]))
    unwound: list[bool] = []

    def body() -> None:
        try:
            loop.park(Suspend("a"))
        finally:
            unwound.append(True)

    with pytest.raises(Suspend):
        loop.start(body)
    loop.abandon()
    assert unwound == [True] and not loop.parked


def test_a_loop_parked_in_another_thread_is_not_resumed_here() -> None:
    """A greenlet runs in the thread that made it: a pass of another thread replays."""
    loops = StickyLoops()
    parked: list[ParkedLoop] = []

    def other() -> None:
        loop, _ = _parked("r", _hooks([]))
        loops.keep(loop)
        parked.append(loop)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    [loop] = parked
    assert loop.parked and not loop.resumable
    with pytest.raises(RuntimeError, match="not parked in this thread"):
        loop.resume()
    assert loops.take("r", BORN, Read(None, [], [])) is None and len(loops) == 0


def test_a_parked_loop_is_taken_only_for_the_journal_it_knows() -> None:
    rows = [_row(1), _row(2), _row(3, "scheduled")]
    loops = StickyLoops()
    loop, _ = _parked("r", _hooks(rows))
    loops.keep(loop)
    # Another creation time: another run of that id.
    assert loops.take("r", datetime(2026, 12, 2, tzinfo=UTC), Read(None, rows, [])) is None
    assert not loop.parked or len(loops) == 0
    loop, _ = _parked("r", _hooks(rows))
    loops.keep(loop)
    more = Read(None, rows[:2], [_row(3), _row(4, "scheduled")])  # a row it never saw
    assert loops.take("r", BORN, more) is None and len(loops) == 0
    loop, _ = _parked("r", _hooks(rows))
    loops.keep(loop)
    finished = Read(None, rows[:2], [_row(3)])  # the step it waits on is done
    assert loops.take("r", BORN, finished) is loop and len(loops) == 0


def test_loops_beyond_capacity_or_idle_too_long_are_let_go_of() -> None:
    loops = StickyLoops(capacity=2, idle=60)
    kept = []
    for run in ("a", "b", "c"):
        loop, _ = _parked(run, _hooks([]))
        loops.keep(loop)
        kept.append(loop)
    assert len(loops) == 2 and not kept[0].parked  # the oldest, evicted
    assert [loop.run_id for loop in loops.purge(0)] == ["b", "c"] and len(loops) == 0
    off = StickyLoops(capacity=0)
    assert off.take("a", BORN, Read(None, [], [])) is None


def test_the_look_for_idle_loops_ends_at_the_first_that_is_not() -> None:
    """Loops are kept oldest first, so the look for idle ones (at every keep) reads only
    the idle ones and the first that is not, however many are kept."""
    loops = StickyLoops(capacity=8, idle=60)
    kept = []
    for run in ("a", "b", "c", "d"):
        loop, _ = _parked(run, _hooks([]))
        loops.keep(loop)
        kept.append(loop)
    now = kept[-1].parked_at
    kept[0].parked_at = kept[1].parked_at = now - 100  # idle for longer than 60 s
    kept[3].parked_at = now - 100  # idle too, but kept after one that is not
    assert [loop.run_id for loop in loops.purge()] == ["a", "b"]
    assert len(loops) == 2 and kept[2].parked and kept[3].parked
    assert [loop.run_id for loop in loops.purge(0)] == ["c", "d"]
