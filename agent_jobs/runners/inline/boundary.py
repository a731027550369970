"""The step boundary as a turn here meets it (runners/boundary.py decides it): stop if the
run is cancelled or past its deadline, wait while it is paused, else run the step.

A paused run waits at its step boundary on its own thread (it holds no worker: there
are none), looking at the database between waits, so a resume or a cancel recorded by
another process (`agent-jobs resume`) reaches it too.
"""

from __future__ import annotations

from ...app import AgentApp
from ...executor import StepEnv
from ...store import Store
from ...store import runs as run_rows
from ...streams.base import MemoryStreams, RunStream
from ..boundary import Go, Hold, Stop, Verdict, decide, quiet
from .signals import Signals
from .stops import Stops


class Boundary:
    """Where each step of a turn here stops, waits or goes on."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        streams: MemoryStreams,
        *,
        signals: Signals,
        stops: Stops,
        poll_interval: float,
    ) -> None:
        self.app = app
        self.store = store
        self.streams = streams
        self.signals = signals
        self.stops = stops
        self.poll_interval = poll_interval

    def check(self, run_id: str) -> None:
        """A step boundary: stop here if the run is cancelled or past its deadline, wait
        here while it is paused (`Cancelled` ends the wait too)."""
        while isinstance(self._verdict(run_id), Hold):
            self._held(run_id)

    def _verdict(self, run_id: str) -> Verdict:
        """The boundary's verdict on the run as it stands (a `Stop` raises `Cancelled`); a
        run with nothing asked of it is only read."""
        run = self.stops.look(run_id)
        if run is None or quiet(run):
            return Go()
        env = StepEnv(app=self.app, stream=RunStream(self.streams, run.root_run_id, run.run_id))
        with self.store.begin() as conn:
            verdict = decide(conn, env, self.app, run, ())
            if isinstance(verdict, Go) and verdict.resumed:
                run_rows.set_status(conn, run.run_id, "running")  # said so: it runs on
            env.flush_events(conn)
        env.flush()
        if isinstance(verdict, Stop):
            self.stops.stop(run.run_id, verdict)
        return verdict

    def _held(self, run_id: str) -> None:
        """Wait while the run is paused; a resume here sets its flag, one recorded by
        another process is seen at the next look."""
        flag = self.signals.resume_flag(run_id)
        while True:
            flag.wait(self.poll_interval)
            flag.clear()
            current = self.stops.look(run_id)
            if current is None or current.pause_requested_by is None:
                break
        self.signals.forget_resume(run_id)
