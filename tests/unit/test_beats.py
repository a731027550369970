"""The heartbeat of running steps: one thread a process beats for all of them."""

from __future__ import annotations

import os
import threading
import time

from agent_jobs.runners.step_tasks import Beats


def test_each_step_beats_at_its_interval_until_removed() -> None:
    beats = Beats()
    fast: list[float] = []
    slow: list[float] = []
    a = beats.add(0.02, lambda: fast.append(time.monotonic()) is None)
    b = beats.add(0.1, lambda: slow.append(time.monotonic()) is None)
    time.sleep(0.25)
    beats.remove(a)
    beats.remove(b)
    counted = len(fast), len(slow)
    time.sleep(0.1)
    assert (len(fast), len(slow)) == counted  # nothing beats once removed
    assert counted[0] >= 5 and 1 <= counted[1] <= 3, counted


def test_a_beat_that_returns_false_stops_beating() -> None:
    beats = Beats()
    calls: list[int] = []
    beats.add(0.01, lambda: calls.append(1) is not None)  # False: stop after the first
    time.sleep(0.1)
    assert calls == [1]


def test_removing_waits_for_a_beat_in_progress() -> None:
    """Once `remove` returns, no beat of that step runs (a late renewal would re-create a
    lease the step already released)."""
    beats = Beats()
    inside = threading.Event()
    finished: list[float] = []

    def slow_beat() -> bool:
        inside.set()
        time.sleep(0.2)
        finished.append(time.monotonic())
        return True

    key = beats.add(0.01, slow_beat)
    assert inside.wait(2)
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
            time.sleep(0.1)
            os.write(write, b"ok" if seen and len(beats._due) == 1 else b"no")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 2) == b"ok"
