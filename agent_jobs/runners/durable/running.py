"""The steps a process is carrying out: the one thread that beats for all of them (each
step's lease kept alive, in Postgres and in Redis), and which thread runs which step, so
that one over its hard time limit can be given up on and fenced (tasks/watchdog.py)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import redis

from ...leases import Holder, Leases
from ...store import Store
from ...store import holds as hold_rows
from ...store.db import wait_for_locks_at_most

log = logging.getLogger(__name__)

# How long a heartbeat's write waits for its row's lock before it lets this beat go.
HEARTBEAT_LOCK_WAIT = 0.5


class Beats:
    """One thread a process beats for every step of the process that runs (a thread a
    step cost more than a short step's own work)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a pool process starts afresh

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, float, Callable[[], bool]]] = {}
        self._ids = itertools.count()
        self._beating: int | None = None
        self._thread: threading.Thread | None = None
        self._wakes_at = 0.0  # when the beating thread wakes by itself (inf: never)

    def add(self, interval: float, beat: Callable[[], bool]) -> int:
        """Call `beat` every `interval` seconds, first after one, until it returns False
        or `remove` is called."""
        with self._cond:
            key = next(self._ids)
            due = time.monotonic() + interval
            self._due[key] = (due, interval, beat)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-beats", daemon=True)
                self._thread.start()
            if due < self._wakes_at:  # the beating thread sleeps past it: wake it
                self._cond.notify()
            return key

    def remove(self, key: int) -> None:
        """Stop beating; returns once a beat in progress has finished."""
        with self._cond:
            self._due.pop(key, None)
            while self._beating == key:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            key, beat = self._next()
            try:
                keep = beat()
            except Exception:  # pragma: no cover - a beat logs its own failures
                log.exception("a lease heartbeat failed")
                keep = True
            with self._cond:
                if not keep:
                    self._due.pop(key, None)
                self._beating = None
                self._cond.notify_all()

    def _next(self) -> tuple[int, Callable[[], bool]]:
        """Wait for the beat due first; mark it in progress."""
        with self._cond:
            while True:
                if not self._due:
                    self._wakes_at = math.inf
                    self._cond.wait()
                    continue
                key, (due, interval, beat) = min(self._due.items(), key=lambda kv: kv[1][0])
                wait = due - time.monotonic()
                if wait > 0:
                    self._wakes_at = due
                    self._cond.wait(wait)
                    continue
                self._wakes_at = 0.0  # awake: it looks at the beats due before sleeping
                self._due[key] = (time.monotonic() + interval, interval, beat)
                self._beating = key
                return key, beat


BEATS = Beats()


@dataclass(frozen=True)
class Running:
    """A step this process is carrying out, on the thread that runs it."""

    run_id: str
    step: str
    task: str  # the step task that carries it out
    holder: Holder
    claimed: bool  # its lease is its row's claim, not a Redis lease
    fence: int | None = None  # the step's epoch as read when it was taken (journal.fence)


class RunningSteps:
    """The steps this process's threads are carrying out, and the ones given up on: a
    step whose thread overran the hard time limit is sent again, and whatever that
    thread writes later is refused (its holder is fenced)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a pool process starts afresh

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[int, tuple[Running, int | None]] = {}
        self._fenced: set[str] = set()

    @contextmanager
    def track(self, running: Running, beat: int | None = None) -> Iterator[None]:
        """The calling thread carries out `running`, its lease kept by the heartbeat
        `beat` (a key of `BEATS`)."""
        thread = threading.get_ident()
        with self._lock:
            self._by_thread[thread] = (running, beat)
        try:
            yield
        finally:
            with self._lock:
                self._by_thread.pop(thread, None)

    def on(self, thread: int) -> bool:
        """Whether `thread` is carrying out a step now."""
        with self._lock:
            return thread in self._by_thread

    def give_up(self, thread: int) -> Running | None:
        """Fence the step `thread` runs, if any, and stop its heartbeat (which would
        otherwise take its lease back once it is let go of); returns the step."""
        with self._lock:
            tracked = self._by_thread.pop(thread, None)
            if tracked is None:
                return None
            running, beat = tracked
            self._fenced.add(str(running.holder))
        if beat is not None:
            BEATS.remove(beat)  # returns once a beat in progress has finished
        return running

    def fenced(self, holder: Holder) -> bool:
        """Whether the step run under `holder` was given up on (and forget it)."""
        with self._lock:
            if str(holder) in self._fenced:
                self._fenced.discard(str(holder))
                return True
            return False


RUNNING = RunningSteps()


@contextmanager
def heartbeat(
    leases: Leases, store: Store, lease: float, running: Running, attempt: int, started: datetime
) -> Iterator[int]:
    """While the step runs: keep its lease alive, and show it `started` once it
    has run for a moment (a short delivered step goes from scheduled to done in one commit).

    A `claimed` step's lease is its journal row's (the pass that scheduled it claimed
    it); any other's is in Redis, and the row's lease only keeps the sweep off it.
    """
    run_id, step, holder, claimed = running.run_id, running.step, running.holder, running.claimed

    def keep() -> bool:
        # Postgres first: a holder let go of meanwhile (taken for dead, its epoch moved
        # on) renews nothing, in Postgres or in Redis. While Postgres is away, the Redis
        # lease alone keeps a duplicate delivery off the step.
        try:
            with store.begin() as conn:
                # One thread beats for every step here: a row another transaction holds
                # must not hold up the others' leases.
                wait_for_locks_at_most(conn, HEARTBEAT_LOCK_WAIT)
                renewed = hold_rows.mark_started(
                    conn,
                    run_id,
                    step,
                    attempt=attempt,
                    started_at=started,
                    lease=lease,
                    holder=str(holder) if claimed else None,
                    fence=running.fence,
                )
            if not renewed:  # let go, for the delivery that holds the step now
                log.warning("%s/%s is no longer this delivery's: its lease is let go", run_id, step)
                if not claimed:
                    with contextlib.suppress(redis.RedisError):
                        leases.release(run_id, step, holder)
                return False
        except Exception as exc:  # the step goes on; the sweep is the backstop
            log.warning("heartbeat of %s/%s failed: %s", run_id, step, exc)
        if not claimed:
            try:
                if not leases.refresh(run_id, step, holder, lease):
                    return False  # another delivery holds it now
            except redis.RedisError as exc:
                log.warning("could not renew the lease of %s/%s: %s", run_id, step, exc)
        return True

    key = BEATS.add(min(lease / 3, 1.0), keep)
    try:
        yield key
    finally:
        BEATS.remove(key)
