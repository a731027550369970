"""The inline runner's queued runs: a run that may not begin yet (its thread's turn has
not ended, its key's places are taken: agent_jobs/admission.py) waits on its own thread,
in this process, until a run of this runner ends, and then looks again.

The look is the durable runner's (runners/boundary.py: a stop first, then admission, under
the same locks; a pause waits for the turn's first step), so runs of other processes on
the same database count too; one of those ending is seen at the next look, within
`OTHERS_POLL` seconds, as this process is told of no end but its own.
"""

from __future__ import annotations

import threading

from ...app import AgentApp
from ...executor import StepEnv
from ...store import RunView, Store
from ...store import runs as run_rows
from ...streams.base import MemoryStreams, RunStream
from .. import boundary
from ..turn import Ending, announce_end, finish_turn
from . import abandoned

OTHERS_POLL = 1.0  # seconds between looks while nothing here ends


class QueuedRuns:
    """The runs of one runner that wait for their turn here, and what lets them look
    again: a run of this runner that ends, a stop asked for, an abandoned run ended."""

    def __init__(self, app: AgentApp, store: Store, streams: MemoryStreams) -> None:
        self.app = app
        self.store = store
        self.streams = streams
        self._ended = threading.Condition()
        self._ends = 0  # how many times something that may free a place happened here

    def nudge(self) -> None:
        """A run here ended (or was asked to stop): the waiting ones look again."""
        with self._ended:
            self._ends += 1
            self._ended.notify_all()

    def clear_way(
        self,
        *,
        thread_id: str | None,
        agent: str | None = None,
        key: str | None = None,
        but: str | None = None,
    ) -> None:
        """End the runs in a run's way whose process is gone (runners/inline/abandoned.py);
        a place they free is looked for again at once."""
        ended = abandoned.end_in_the_way(
            self.store,
            self.app,
            thread_id=thread_id,
            agent=agent,
            key=key,
            but=but,
            streams=self.streams,
        )
        if ended:
            self.nudge()

    def admitted(self, run: RunView, stream: RunStream) -> RunView | None:
        """Wait until the queued run may begin; returns it `running`, or None when it was
        cancelled (or ran past its deadline) while it waited, and has ended so."""
        while True:
            with self._ended:
                seen = self._ends
            env = StepEnv(app=self.app, stream=stream)
            self.clear_way(
                thread_id=run.thread_id, agent=run.agent, key=run.concurrency_key, but=run.run_id
            )
            with self.store.begin() as conn:
                row = run_rows.lock_run(conn, run.run_id)
                current = RunView.from_row(row)
                if current.finished:
                    return None
                verdict = boundary.decide(conn, env, self.app, current, (), queued_pause=False)
                if isinstance(verdict, boundary.Go):
                    run_rows.set_status(conn, current.run_id, "running")
                    return current.model_copy(update={"status": "running", "waiting_on": None})
                if isinstance(verdict, boundary.Stop):
                    ending = Ending.cancelled(verdict.cause, current.cancel_keep_inbox)
                    finish_turn(conn, env, self.app, current, ending)
            if isinstance(verdict, boundary.Stop):
                env.flush()
                announce_end(stream, ending)
                return None
            with self._ended:
                if self._ends == seen:  # nothing ended since the look began
                    self._ended.wait(OTHERS_POLL)
