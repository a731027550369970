"""The heartbeat of running steps: one thread a process beats for all of them."""

from __future__ import annotations

import itertools
import os
import threading
import time

from agent_jobs.runners.durable.running import Beats
from tests.support.waiting import TIMEOUT, eventually


def beat_thread_ran(beats: Beats, times: int = 3) -> None:
    """Wait until the beating thread has gone round `times` more times: a beat of its own
    (every 0.01 s) beat that often, so anything else due meanwhile had its chance."""
    seen: list[int] = []
    key = beats.add(0.01, lambda: seen.append(1) is None)
    eventually(lambda: len(seen) >= times, what=f"the beating thread to go round {times} times")
    beats.remove(key)


def test_each_step_beats_at_its_interval_until_removed() -> None:
    beats = Beats()
    order: list[str] = []
    a = beats.add(0.02, lambda: order.append("fast") is None)
    b = beats.add(0.1, lambda: order.append("slow") is None)
    eventually(lambda: order.count("slow") >= 3, what="the slow step to beat three times")
    beats.remove(a)
    beats.remove(b)
    counted = list(order)
    # Each at its own interval: between two beats of the slow step the fast one beats
    # (its next beat is always due sooner), so it beats more often.
    slow_at = [i for i, kind in enumerate(counted) if kind == "slow"]
    for before, after in itertools.pairwise(slow_at):
        assert "fast" in counted[before + 1 : after], counted
    assert counted.count("fast") > counted.count("slow"), counted
    beat_thread_ran(beats)
    assert order == counted  # nothing beats once removed


def test_a_beat_that_returns_false_stops_beating() -> None:
    beats = Beats()
    calls: list[int] = []
    beats.add(0.01, lambda: calls.append(1) is not None)  # False: stop after the first
    eventually(lambda: calls, what="the first beat")
    beat_thread_ran(beats)
    assert calls == [1]


def test_removing_waits_for_a_beat_in_progress() -> None:
    """Once `remove` returns, no beat of that step runs (a late renewal would re-create a
    lease the step already released)."""
    beats = Beats()
    inside = threading.Event()
    finished: list[float] = []

    def slow_beat() -> bool:
        inside.set()
        time.sleep(0.2)  # a beat in progress while the test removes it
        finished.append(time.monotonic())
        return True

    key = beats.add(0.01, slow_beat)
    assert inside.wait(TIMEOUT)
    beats.remove(key)
    removed = time.monotonic()
    assert finished and finished[0] <= removed


def test_a_forked_process_beats_with_a_thread_of_its_own() -> None:
    beats = Beats()
    beats.add(0.01, lambda: True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's steps are not its own; its own beat
        try:
            seen: list[int] = []
            beats.add(0.01, lambda: seen.append(1) is None)
            eventually(lambda: seen, what="the child's own beat")
            os.write(write, b"ok" if seen and len(beats._due) == 1 else b"no")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 2) == b"ok"
