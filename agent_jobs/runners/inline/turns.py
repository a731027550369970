"""The turns the inline runner drives, each on a thread of its own: a queued run waits
there for its place (runners/inline/queue.py), its loop runs with the inline hooks, its
end is recorded, and the thread's next turn, when one follows, is driven the same way.
"""

from __future__ import annotations

import logging
import threading
from functools import partial

from ...app import AgentApp
from ...encryption.keyring import owner_scope
from ...errors import AgentJobsError, Cancelled, Sleeping
from ...executor import StepEnv
from ...loop import run_agent_loop
from ...processes import this_process
from ...ratelimits.gate import ModelGate
from ...settings import Settings
from ...store import RunView, Store
from ...store import runs as run_rows
from ...streams.base import MemoryStreams, RunStream
from ..turn import Ending, announce_end, finish_turn, start_turn, turn_for
from .boundary import Boundary
from .hooks import InlineHooks
from .queue import QueuedRuns
from .signals import Signals
from .sleepers import Sleepers
from .stops import Stops

log = logging.getLogger(__name__)


class Turns:
    """Drives the turns of one runner, and tells when each has ended."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        settings: Settings,
        streams: MemoryStreams,
        *,
        limits: ModelGate | None,
        signals: Signals,
        queued: QueuedRuns,
        stops: Stops,
        boundary: Boundary,
        poll_interval: float,
    ) -> None:
        self.app = app
        self.store = store
        self.settings = settings
        self.streams = streams
        self.limits = limits
        self.signals = signals
        self.queued = queued
        self.stops = stops
        self.boundary = boundary
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._finished: dict[str, threading.Event] = {}
        # The runs that sleep, with no thread: one waiter drives them again.
        self.sleepers = Sleepers(store, partial(self.drive, woken=True), poll_interval)

    def drive(self, run_id: str, *, woken: bool = False) -> None:
        """Drive the run on a thread of its own, from its start (a retried run's journal
        read back). `woken`: a sleeping run driven again, whose turn began before (a
        `wait` for it goes on waiting for the same end)."""
        with self._lock:
            done = self._finished.get(run_id) if woken else None
            if done is None:
                done = self._finished[run_id] = threading.Event()
        threading.Thread(
            target=self._background,
            args=(run_id, done, woken),
            name=f"run-{run_id[:8]}",
            daemon=True,
        ).start()

    def wait(self, run_id: str, timeout: float | None = None) -> None:
        """Block until the run driven here ends (or `timeout` passes); at once for a run
        this runner does not drive."""
        with self._lock:
            done = self._finished.get(run_id)
        if done is not None:
            done.wait(timeout)

    def driving(self) -> set[str]:
        """The runs whose turn this runner drives now."""
        with self._lock:
            return set(self._finished)

    def _forget(self, run_id: str, done: threading.Event) -> None:
        """The turn ended: a `wait` for it returns at once (the run's row has ended), and
        nothing of it is kept (unless it is being driven again: a retry)."""
        with self._lock:
            if self._finished.get(run_id) is not done:
                return  # driven again meanwhile (a retry): that turn's signals stand
            del self._finished[run_id]
        self.signals.forget_run(run_id)

    def nested(self, child: RunView) -> None:
        """A delegated run's turn, on its parent's thread; its frames in its root's stream."""
        self.turn(child, RunStream(self.streams, child.root_run_id, child.run_id))

    def turn(self, run: RunView, stream: RunStream, *, woken: bool = False) -> str | None:
        """The run's turn, from its start to its recorded end; returns the thread's next
        run, if one follows. `woken`: a sleeping run's turn, driven again (it began
        before); `Sleeping` when it sleeps (its thread ends, the run does not)."""
        with owner_scope(self.store.engine, run.actor):  # what the turn writes is theirs
            return self._turn(run, stream, woken=woken)

    def _turn(self, run: RunView, stream: RunStream, *, woken: bool) -> str | None:
        hooks = self._hooks(run, stream)
        env = StepEnv(app=self.app, stream=stream)
        with self.store.begin() as conn:
            run_rows.set_driver(conn, [run.run_id], this_process())  # retried, forked, delegated
            if not woken:
                start_turn(env, run, conn)
            env.flush_events(conn)
        env.flush()
        try:
            turn, deps = turn_for(self.app, run, self.settings)
            result = run_agent_loop(turn, deps, hooks)
        except Cancelled as signal:
            current = self.store.get_run(run.run_id)
            ending = Ending.cancelled(signal.cause, current.cancel_keep_inbox)
        except Exception as exc:
            if not isinstance(exc, AgentJobsError):
                log.exception("run %s failed", run.run_id)
            ending = Ending.failed(exc)
        else:
            ending = Ending.completed(result.output)
        with self.store.begin() as conn:
            next_run = finish_turn(conn, env, self.app, run, ending).next_run
        env.flush()  # committed: what the end reports (metrics)
        announce_end(stream, ending)
        return next_run

    def _hooks(self, run: RunView, stream: RunStream) -> InlineHooks:
        return InlineHooks(
            run,
            stream,
            app=self.app,
            store=self.store,
            settings=self.settings,
            limits=self.limits,
            signals=self.signals,
            stops=self.stops,
            boundary=self.boundary,
            poll_interval=self.poll_interval,
            nested=self.nested,
        )

    def _background(self, run_id: str, done: threading.Event, woken: bool = False) -> None:
        next_run: str | None = None
        asleep: Sleeping | None = None
        try:
            run = self.store.get_run(run_id)
            stream = RunStream(self.streams, run.root_run_id, run_id)
            try:  # a queued run waits for its thread's turn, or a place of its key
                began = self.queued.admitted(run, stream) if run.status == "queued" else run
                next_run = self.turn(began, stream, woken=woken) if began is not None else None
            except Sleeping as signal:  # no thread while it sleeps: the waiter wakes it
                asleep = signal
            finally:
                if run.root_run_id == run_id and asleep is None:
                    stream.end()
        finally:
            if asleep is None:
                done.set()
                self._forget(run_id, done)
                self.queued.nudge()  # this one ended: a run waiting here may begin
        if asleep is not None:
            self.sleepers.add(asleep.run_id, run_id, asleep.wake_at)
        if next_run is not None:
            self.drive(next_run)
