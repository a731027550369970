"""Runs whose loop stays suspended in this process between passes (sticky execution).

A pass replays a run's loop from its start: every recorded step returns its result
again, which costs more as the run grows. Here the loop runs in a greenlet instead (a
stack of its own, switched to and from in the pass's thread: no thread, no lock, no
wake-up of another thread). Where a pass would suspend (a remote step in flight, a
human wait, a delegated run, a fan-out whose members wait) the loop parks: it switches
back to the pass, which commits, and the loop waits where it stopped. The next pass of
the run in this thread hands it that pass's connection, its run row and its journal,
and switches to it: the loop goes on from there, replaying nothing. A prefork pool
process runs every pass in one thread; a threads pool runs a chain of steps (the fast
path) in the thread of its task, so the passes of a chain resume the loop there.

The journal stays the truth. A parked loop is resumed only in its own thread and only
if the journal holds the rows it knows and no others (the steps it waits on may have
finished): any other process's pass adds rows, so a run that moved on elsewhere is
replayed as before, and the parked loop is let go of (unwound). So is a loop whose
pass did not commit, the loop of a run that ended, the least recently used beyond
`capacity`, and one parked for `idle` seconds (the run went on in another process, or
waits for a person: its next pass replays it). A process that dies loses nothing but
the time a replay takes.
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

import greenlet

from ...errors import Suspend
from ...store.journal import ReplayRow
from .journal_cache import Read


class LetGo(BaseException):
    """Unwinds a parked loop that is let go of (no `settle` catches it)."""


class ParkedLoop:
    """A run's loop, in a greenlet of the thread that started it, and the turns it
    takes with the passes."""

    def __init__(self, run_id: str, created_at: datetime, hooks: Any) -> None:
        self.run_id = run_id
        self.created_at = created_at
        self.hooks = hooks
        self.thread = threading.get_ident()
        self._state: Literal["new", "running", "parked", "done", "abandoned"] = "new"
        self._loop: greenlet.greenlet | None = None
        self.parked_at = 0.0  # monotonic

    # --- the pass's side ---------------------------------------------------------------

    def start(self, body: Callable[[], Any]) -> Any:
        """Run `body` (the loop) in a greenlet of its own until it parks or ends; as
        `resume`."""
        self.thread = threading.get_ident()
        self._loop = greenlet.greenlet(self._main)
        return self._switch(body)

    def resume(self) -> Any:
        """Let the parked loop go on (its hooks rebound to this pass); returns its result
        when it ends, raises what it raised, or the `Suspend` it parked on."""
        if not self.resumable:
            raise RuntimeError(f"the loop of {self.run_id} is not parked in this thread")
        return self._switch()

    @property
    def parked(self) -> bool:
        return self._state == "parked"

    @property
    def resumable(self) -> bool:
        """Parked, and in the calling thread (a greenlet runs in its own thread only)."""
        return self.parked and self.thread == threading.get_ident()

    def abandon(self) -> None:
        """Let go of the loop: unwound at once if it is parked in this thread; in another
        thread, greenlet unwinds it there once nothing refers to it."""
        loop, self._loop = self._loop, None
        if self._state == "parked" and loop is not None and self.thread == threading.get_ident():
            loop.parent = greenlet.getcurrent()
            loop.throw(LetGo)
        self._state = "abandoned"

    def _switch(self, *args: Any) -> Any:
        loop = self._loop
        assert loop is not None
        loop.parent = greenlet.getcurrent()  # where it comes back to, parked or ended
        loop.gr_context = contextvars.copy_context()  # the pass's log context
        self._state = "running"
        kind, value = loop.switch(*args)
        if kind == "result":
            return value
        if kind == "abandoned":
            raise RuntimeError(f"the loop of {self.run_id} was let go of")
        raise value  # the Suspend it parked on, or what the loop raised

    # --- the loop's side ---------------------------------------------------------------

    def park(self, signal: Suspend) -> None:
        """Called by the loop where a pass suspends: back to the pass, until the next
        pass switches here again (or `LetGo` is thrown in)."""
        back = greenlet.getcurrent().parent
        assert back is not None  # the pass that switched to it
        self._state = "parked"
        self.parked_at = time.monotonic()
        back.switch(("parked", signal))

    def _main(self, body: Callable[[], Any]) -> tuple[str, Any]:
        try:
            outcome: tuple[str, Any] = ("result", body())
        except (LetGo, greenlet.GreenletExit):
            self._state = "abandoned"
            return ("abandoned", None)
        except BaseException as exc:  # handed to the pass, which raises it
            outcome = ("error", exc)
        self._state = "done"
        return outcome


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

    def take(self, run_id: str, created_at: datetime, read: Read) -> ParkedLoop | None:
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
            and loop.resumable
            and len(read.known) + len(read.loaded) == len(loop.hooks.by_seq)
            and all(row.step in known for row in self.changed(loop.hooks, read))
        ):
            return loop
        loop.abandon()
        return None

    @staticmethod
    def changed(hooks: Any, read: Read) -> list[ReplayRow]:
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
            stale = []
            for loop in self._loops.values():  # in the order they were kept: oldest first
                if loop.parked_at >= cutoff:
                    break  # the rest were kept later
                stale.append(loop)
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
