"""Runs whose loop stays suspended in this process between passes (sticky execution).

A pass replays a run's loop from its start: every recorded step returns its result
again, which costs more as the run grows. Here the loop runs in a thread of its own
instead, and where a pass would suspend (a remote step in flight, a human wait, a
delegated run, a fan-out whose members wait) the thread parks: the pass that drove it
commits, and the loop waits where it stopped. The next pass of the run in this process
hands it that pass's connection, its run row and its journal, and the loop goes on from
there, replaying nothing.

The journal stays the truth. A parked loop is resumed only if the journal holds the
rows it knows and no others (the steps it waits on may have finished): any other
process's pass adds rows, so a run that moved on elsewhere is replayed as before, and
the parked loop is let go of (its thread unwinds). So is a loop whose pass did not
commit, the loop of a run that ended, the least recently used beyond `capacity`, and
one parked for `idle` seconds (the run went on in another process, or waits for a
person: its next pass replays it). A process that dies loses nothing but the time a
replay takes.

The loop and the pass take turns: one of them runs at any time, so the hooks they share
need no lock.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from ..errors import Suspend

Outcome = tuple[Literal["parked", "result", "error"], Any]


class Abandoned(BaseException):
    """Unwinds a parked loop that is let go of (no `settle` catches it)."""


class ParkedLoop:
    """A run's loop, in its thread, and the turns it takes with the passes."""

    def __init__(self, run_id: str, created_at: datetime, hooks: Any) -> None:
        self.run_id = run_id
        self.created_at = created_at
        self.hooks = hooks
        self._cond = threading.Condition()
        self._state: Literal["running", "parked", "done", "abandoned"] = "running"
        self._outcome: Outcome = ("error", RuntimeError("the loop never ran"))
        self._context: contextvars.Context | None = None
        self._doomed = False  # let go of while running: it unwinds where it would park
        self.parked_at = 0.0  # monotonic

    # --- the pass's side ---------------------------------------------------------------

    def start(self, body: Callable[[], Any]) -> Any:
        """Run `body` (the loop) in a thread of its own until it parks or ends; as
        `resume`."""
        self._context = contextvars.copy_context()
        thread = threading.Thread(
            target=self._main, args=(body,), name=f"loop-{self.run_id[:8]}", daemon=True
        )
        with self._cond:
            thread.start()
            return self._until_parked()

    def resume(self) -> Any:
        """Let the parked loop go on (its hooks rebound to this pass); returns its result
        when it ends, raises what it raised, or the `Suspend` it parked on."""
        self._context = contextvars.copy_context()
        with self._cond:
            if self._state != "parked":
                raise RuntimeError(f"the loop of {self.run_id} is {self._state}, not parked")
            self._state = "running"
            self._cond.notify_all()
            return self._until_parked()

    @property
    def parked(self) -> bool:
        return self._state == "parked"

    def abandon(self) -> None:
        """Let go of the loop: its thread unwinds, at once if parked, else where it would
        park next (a pass that gave up waiting for it)."""
        with self._cond:
            self._doomed = True
            if self._state == "parked":
                self._state = "abandoned"
                self._cond.notify_all()

    def _until_parked(self) -> Any:
        while self._state == "running":
            self._cond.wait()
        kind, value = self._outcome
        if kind == "result":
            return value
        raise value  # the Suspend it parked on, or what the loop raised

    # --- the loop's side ---------------------------------------------------------------

    def park(self, signal: Suspend) -> None:
        """Called by the loop where a pass suspends: wait for the next pass (or raise
        `Abandoned`)."""
        with self._cond:
            if self._doomed:
                self._outcome = ("error", RuntimeError(f"the loop of {self.run_id} was let go of"))
                self._state = "abandoned"
                self._cond.notify_all()
                raise Abandoned
            self._outcome = ("parked", signal)
            self._state = "parked"
            self.parked_at = time.monotonic()
            self._cond.notify_all()
            while self._state == "parked":
                self._cond.wait()
            if self._state == "abandoned":
                raise Abandoned
        self._enter_context()

    def _main(self, body: Callable[[], Any]) -> None:
        self._enter_context()
        outcome: Outcome
        try:
            outcome = ("result", body())
        except Abandoned:
            return
        except BaseException as exc:  # handed to the pass, which raises it
            outcome = ("error", exc)
        with self._cond:
            self._outcome = outcome
            self._state = "done"
            self._cond.notify_all()

    def _enter_context(self) -> None:
        """The log context of the pass now driving the loop."""
        if self._context is not None:
            for var, value in self._context.items():
                var.set(value)


class StickyLoops:
    """This process's parked loops, by run."""

    def __init__(self, capacity: int = 256, idle: float = 60.0) -> None:
        self.capacity = capacity
        self.idle = idle
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a pool process starts afresh

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._loops: OrderedDict[str, ParkedLoop] = OrderedDict()

    def take(self, run_id: str, created_at: datetime, read: Any) -> ParkedLoop | None:
        """The run's parked loop if the journal a pass read (a `journal_cache.Read`) holds
        the rows it knows and no others, taken out (the taker keeps or abandons it); else
        None, and any parked loop of the run is let go of. Only the rows that may have
        changed since the loop's last pass are looked at (`changed`): a final row never
        changes."""
        if not self.capacity:  # loops do not outlive their passes here
            return None
        with self._lock:
            loop = self._loops.pop(run_id, None)
        if loop is None:
            return None
        known = loop.hooks.by_name
        if (
            loop.created_at == created_at
            and loop.parked
            and len(read.known) + len(read.loaded) == len(loop.hooks.by_seq)
            and all(row.step in known for row in self.changed(loop.hooks, read))
        ):
            return loop
        loop.abandon()
        return None

    @staticmethod
    def changed(hooks: Any, read: Any) -> list[Any]:
        """The rows of `read` that may differ from what the loop saw: those after the
        final prefix its last pass read."""
        return [*read.known[hooks.seen_final :], *read.loaded]

    def keep(self, loop: ParkedLoop) -> None:
        """Keep a loop that parked in a pass that committed."""
        if not loop.parked:
            return
        with self._lock:
            old = self._loops.pop(loop.run_id, None)
            self._loops[loop.run_id] = loop
            evicted = []
            while len(self._loops) > self.capacity:
                evicted.append(self._loops.popitem(last=False)[1])
        for other in (old, *evicted, *self.purge()):
            if other is not None and other is not loop:
                other.abandon()

    def purge(self, idle: float | None = None) -> list[ParkedLoop]:
        """Let go of the loops parked for longer than `idle` seconds (the setting by
        default); returns them."""
        cutoff = time.monotonic() - (self.idle if idle is None else idle)
        with self._lock:
            stale = [loop for loop in self._loops.values() if loop.parked_at < cutoff]
            for loop in stale:
                del self._loops[loop.run_id]
        for loop in stale:
            loop.abandon()
        return stale

    def drop(self, run_id: str) -> None:
        with self._lock:
            loop = self._loops.pop(run_id, None)
        if loop is not None:
            loop.abandon()

    def __len__(self) -> int:
        with self._lock:
            return len(self._loops)
