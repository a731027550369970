"""The inline runner: the loop in-process, each step executed at once.

`start` returns a run id immediately and drives the turn on a background thread.
Approvals are futures keyed by run and call, resolved by `signal` (or by a decision
another process recorded in the database, which the waiting turn polls for). Reads
overlap on a thread pool. A cancel, a steering message or a model switch posted by
another process reaches the turn through the database at its next boundary. Single
process, no broker: the embedded default.

The runner holds its parts, each given the others it calls: its signals (signals.py: what
a turn waits on that another thread sets), its queued runs (queue.py), its stops
(stops.py), its step boundary (boundary.py), its turns (turns.py: a thread each, the loop
with the hooks of hooks.py) and its wake (wake.py: what a command committed here wakes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from ... import controls, session
from ...admission import IfBusy
from ...app import AgentApp
from ...approvals.reconcile import Reconciliation
from ...commands import Commands
from ...notify.webhook import check as check_webhook
from ...ratelimits.gate import ModelGate
from ...runs import RunRequest
from ...settings import Settings, get_settings
from ...store import RunView, Store
from ...streams.base import Frame, MemoryStreams
from .boundary import Boundary
from .queue import QueuedRuns
from .signals import Signals
from .stops import Stops
from .turns import Turns
from .wake import InlineWake


class InlineRunner:
    """Drives turns in this process. `start` returns at once; `wait` blocks for the end."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        *,
        settings: Settings | None = None,
        streams: MemoryStreams | None = None,
        poll_interval: float = 0.5,
        runs_per_actor: int | None = None,
    ) -> None:
        """`runs_per_actor`: how many runs one actor may have going here at once (a
        server's limit: each holds a thread until it ends); None, no limit."""
        self.app = app
        self.store = store
        self.settings = settings or get_settings()
        self.streams = streams or MemoryStreams()
        self.poll_interval = poll_interval
        # Provider rate limits: in Redis with a Redis URL set, else in this process.
        self.limits = ModelGate.inline(app, self.settings)
        self.signals = Signals()  # what its turns wait on, set from other threads
        self.queued = QueuedRuns(app, store, self.streams)  # runs waiting for a place
        self.stops = Stops(
            app,
            store,
            self.streams,
            signals=self.signals,
            queued=self.queued,
            poll_interval=poll_interval,
        )
        self.boundary = Boundary(
            app,
            store,
            self.streams,
            signals=self.signals,
            stops=self.stops,
            poll_interval=poll_interval,
        )
        self.turns = Turns(
            app,
            store,
            self.settings,
            self.streams,
            limits=self.limits,
            signals=self.signals,
            queued=self.queued,
            stops=self.stops,
            boundary=self.boundary,
            poll_interval=poll_interval,
        )
        self.wake = InlineWake(
            store,
            signals=self.signals,
            queued=self.queued,
            stops=self.stops,
            turns=self.turns,
            runs_per_actor=runs_per_actor,
        )
        self.commands = Commands(store, app, self.wake)
        check_webhook(self.settings)  # a webhook without a secret: refused before a run

    # --- starting and waiting ----------------------------------------------------------

    def start(
        self,
        agent: str,
        input: str,
        *,
        actor: str = "anonymous",
        thread_id: str | None = None,
        run_id: str | None = None,
        persona: str | None = None,
        metadata: dict[str, Any] | None = None,
        if_busy: IfBusy | None = None,
    ) -> str:
        """Create the run and drive it in the background; returns its id at once. On a
        thread whose turn has not ended it waits for that turn (`if_busy="enqueue"`), is
        refused (`"reject"`: `ThreadBusyError`), or cancels it and runs next
        (`"interrupt"`)."""
        request = RunRequest.of(
            agent,
            input,
            actor=actor,
            thread_id=thread_id,
            run_id=run_id,
            persona=persona,
            metadata=metadata,
            if_busy=if_busy,
        )
        return self.commands.admit(request)[0]

    def run(
        self, agent: str, input: str, *, timeout: float | None = None, **kwargs: Any
    ) -> RunView:
        """Start a run and wait for it to end."""
        return self.wait(self.start(agent, input, **kwargs), timeout=timeout)

    def wait(self, run_id: str, timeout: float | None = None) -> RunView:
        """Block until the run ends (or `timeout` passes); returns its current view."""
        self.turns.wait(run_id, timeout)
        return self.store.get_run(run_id)

    def frames(self, run_id: str, after: str | None = None) -> Iterator[Frame]:
        """The run's live frames from the start (or after entry `after`) to its end."""
        for _entry, frame in self.streams.read(run_id, after):
            yield frame

    # --- decisions, steering, cancellation ---------------------------------------------

    def signal(
        self,
        run_id: str,
        call_id: str,
        decision: Literal["approve", "reject"],
        *,
        actor: str,
        reason: str | None = None,
        args_sha256: str | None = None,
    ) -> bool:
        """Record a decision and release the waiting turn; False if one was already made."""
        return self.commands.decide(
            run_id, call_id, decision, actor=actor, reason=reason, args_sha256=args_sha256
        )

    def answer(self, run_id: str, request_id: str, answers: dict[str, Any], *, actor: str) -> bool:
        """Record a person's answers and release the waiting turn; False if answered."""
        return self.commands.answer(run_id, request_id, answers, actor=actor)

    def reconcile(self, run_id: str, call_id: str, decision: Reconciliation) -> bool:
        """Record how a call whose outcome is unknown ended. An inline run dies with its
        process and never waits on one: this refuses, unless the call is a durable run's
        (which the sweep then wakes)."""
        return self.commands.reconcile(run_id, call_id, decision)

    def post_message(self, run_or_thread: str, text: str, *, target: str = "next-step") -> str:
        """Queue a message on the thread's inbox; returns the thread id.

        A `next-turn` message to an idle thread starts its turn at once.
        """
        return self.commands.post_message(run_or_thread, text, target=target)

    def select_model(self, run_or_thread: str, selection: session.ModelSelection) -> str:
        """Switch a thread's model from its next prompt; returns the thread id."""
        return self.commands.select_model(run_or_thread, selection)

    def cancel(self, run_id: str, cause: str = "user", *, keep_inbox: bool = False) -> list[str]:
        """Ask the run (and its children) to stop at the next boundary."""
        return self.commands.cancel(run_id, cause, keep_inbox=keep_inbox)

    # --- operator controls (docs/operating.md, "Operator controls") ----------------------

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
