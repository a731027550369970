"""The inline runner's operator controls (docs/operating.md, "Operator controls"): pause and
resume a run it drives, retry one of its runs that failed on a step, fork any run.

A paused run waits at its step boundary on its own thread (it holds no worker: there
are none), looking at the database between waits, so a resume or a cancel recorded by
another process (`agent-jobs resume`) reaches it too. A retried or forked run is driven
from its start with the steps its journal holds read back instead of run, each step's last
attempt as a durable retry left it, checked by name and position as a durable replay
checks them (runners/cursor.py); what the journal lacks runs, numbered after its last row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from ... import controls
from ...app import AgentApp
from ...executor import StepEnv
from ...settings import Settings
from ...store import RunView, Store
from ...store import runs as run_rows
from ...streams.base import MemoryStreams, RunStream
from .. import boundary
from .signals import Signals

if TYPE_CHECKING:
    from ...commands import Commands


class InlineControls:
    """Pause, resume, retry and fork, for `InlineRunner`."""

    app: AgentApp
    store: Store
    settings: Settings
    streams: MemoryStreams
    poll_interval: float
    _check_cancel: Callable[[str], RunView | None]  # InlineRunner's
    commands: Commands
    _stop: Callable[[str, boundary.Stop], NoReturn]
    signals: Signals

    def pause(self, run_id: str, *, actor: str) -> list[str]:
        """Ask the run (and its delegated runs) to pause at its next step boundary;
        returns the ids asked (`ControlRefusedError` for a run that cannot pause)."""
        return self.commands.pause(run_id, actor=actor)

    def resume(self, run_id: str, *, actor: str) -> list[str]:
        """Let the paused run (and its delegated runs) go on; returns the ids resumed."""
        return self.commands.resume(run_id, actor=actor)

    def retry(self, run_id: str, *, actor: str) -> controls.Retried:
        """Run a run of this runner that failed on a step again, in this process, from its
        failed step on."""
        return self.commands.retry(run_id, actor=actor)

    def fork(
        self, run_id: str, at: str, *, actor: str, keep_decisions: bool = False
    ) -> controls.Forked:
        """Fork any run at step `at` into a new run on a new thread, driven in this
        process (`agent_jobs.controls.fork` says what it copies, asks again and
        refuses)."""
        return self.commands.fork(run_id, at, actor=actor, keep_decisions=keep_decisions)

    # --- the step boundary -------------------------------------------------------------

    def _boundary(self, run_id: str) -> None:
        """A step boundary (runners/boundary.py): stop here if the run is cancelled or past
        its deadline, wait here while it is paused (`Cancelled` ends the wait too)."""
        while isinstance(self._verdict(run_id), boundary.Hold):
            self._held(run_id)

    def _verdict(self, run_id: str) -> boundary.Verdict:
        """The boundary's verdict on the run as it stands (a `Stop` raises `Cancelled`); a
        run with nothing asked of it is only read."""
        run = self._check_cancel(run_id)
        if run is None or boundary.quiet(run):
            return boundary.Go()
        env = StepEnv(app=self.app, stream=RunStream(self.streams, run.root_run_id, run.run_id))
        with self.store.begin() as conn:
            verdict = boundary.decide(conn, env, self.app, run, ())
            if isinstance(verdict, boundary.Go) and verdict.resumed:
                run_rows.set_status(conn, run.run_id, "running")  # said so: it runs on
            env.flush_events(conn)
        env.flush()
        if isinstance(verdict, boundary.Stop):
            self._stop(run.run_id, verdict)
        return verdict

    def _held(self, run_id: str) -> None:
        """Wait while the run is paused; a resume here sets its flag, one recorded by
        another process is seen at the next look."""
        flag = self.signals.resume_flag(run_id)
        while True:
            flag.wait(self.poll_interval)
            flag.clear()
            current = self._check_cancel(run_id)
            if current is None or current.pause_requested_by is None:
                break
        self.signals.forget_resume(run_id)
