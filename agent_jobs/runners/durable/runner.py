"""The durable runner: the same loop, replayed against a Postgres journal.

`coordinate(run_id)` takes the run's row lock (re-drives of one run are serialised;
a wake-up that arrives meanwhile blocks and then sees everything the holder missed),
loads the journal in one query and replays the loop. Finished steps return their
recorded result with no I/O. A new local step runs inside this transaction with its
journal row. A new remote step is inserted `scheduled`; after the commit it is
enqueued with `(run_id, step)` alone, and the pass suspends. `execute_step` is what a
step task does: claim the row, run the intent, write the result (first writer wins),
and re-drive the run in-process instead of through the broker.

A pass's stages are in runners/durable/passes.py, a step task's in
runners/durable/delivery.py; the runner holds what they share and the chain between them.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ...app import AgentApp
from ...dispatch import Dispatcher, ResendingDispatcher
from ...errors import AgentJobsError, EncryptionError, ModelError, RetryLater
from ...executor import StepEnv, execute_remote
from ...leases import Holder, Leases
from ...logs import log_context
from ...observability import observe
from ...ratelimits.gate import ModelGate
from ...runs import RunRequest, admit
from ...settings import Settings
from ...steps import ModelTurn, dump, parse_intent
from ...store import Store
from ...store import events as event_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ...store.journal import JournalRowWithRun
from ...streams.base import RunStream, StreamBackend
from . import journal_cache, recovery, sleepers
from .completion import Completion, model_failed
from .delivery import Delivery
from .kept import Kept, give_back
from .liveness import Liveness, working_on
from .passes import Pass
from .replay import sent_as
from .report import EagerEvents, quiet_events
from .running import RUNNING, Running, heartbeat
from .sticky import StickyLoops

log = logging.getLogger(__name__)


class DurableRunner:
    """Coordinates runs from their journal and carries out their remote steps."""

    def __init__(
        self,
        app: AgentApp,
        store: Store,
        dispatcher: Dispatcher,
        streams: StreamBackend,
        settings: Settings,
        leases: Leases,
    ) -> None:
        self.app = app
        self.store = store
        # Every send here follows a commit: a broker outage must delay the run, never
        # fail it (the run's step is safely `scheduled` in Postgres).
        self.dispatcher = (
            dispatcher
            if isinstance(dispatcher, ResendingDispatcher)
            else ResendingDispatcher(dispatcher)
        )
        self.streams = streams
        self.settings = settings
        self.leases = leases
        self.limits = ModelGate.of(app, settings, leases.client)  # provider rate limits
        # Test seams: after the journal is loaded, the run's lock held; and before a
        # step task takes the step's lease.
        self.before_replay: Callable[[str], None] | None = None
        self.before_lease: Callable[[str, str], None] | None = None
        # How a step run in a chain is reported (the worker sends it to Flower as the
        # task it is); by default, not at all.
        self.eager_events: EagerEvents = quiet_events
        self.journal_cache = journal_cache.JournalCache()
        # Runs whose loop waits in this process between passes (runners/durable/sticky.py).
        self.loops = StickyLoops(256 if settings.sticky_loops else 0, settings.sticky_idle)
        # A worker's: this process's beat, so another recovers its runs if it dies.
        self.liveness: Liveness | None = None

    # --- starting ----------------------------------------------------------------------

    def create(self, request: RunRequest, run_id: str) -> bool:
        """Validate the request and write the run row (queued); False if it exists. The
        runs an `if_busy="interrupt"` asked to stop are woken to stop."""
        made = admit(
            self.store, self.app, request, runner="durable", status="queued", run_id=run_id
        )
        for interrupted in made.interrupted:
            self.dispatcher.coordinate(interrupted)
        return made.created

    # --- the coordinator ---------------------------------------------------------------

    def coordinate(self, run_id: str, completion: Completion | None = None) -> str:
        """Replay the run's loop against its journal; returns where the run stands.

        With a `completion`, the step's outcome is written first, in the same
        transaction: a step task pays one commit for its result and the re-drive.
        Every step the pass schedules is sent.
        """
        return self._drive(run_id, completion, keep=False)[0]

    def continue_run(self, run_id: str) -> str:
        """`coordinate`, in a worker's task: the step the pass schedules runs here at once
        (of a fan-out, the first member; the others are sent)."""
        with working_on(self.liveness, run_id):
            outcome, kept = self._drive(run_id, None, keep=self._eager)
            if kept is not None:
                self._chain(run_id, kept)
            else:
                self._adopt_orphans(run_id)  # this may be the message of a task that died
        return outcome

    @property
    def _eager(self) -> bool:
        """Whether a task's own pass may keep the step it schedules (see `_chain`)."""
        return self.settings.eager_steps and self.settings.eager_max_steps > 0

    def _drive(
        self, run_id: str, completion: Completion | None, *, keep: bool
    ) -> tuple[str, Kept | None]:
        """A pass, and the remote step it kept back from the broker (with `keep`)."""
        try:
            return self._coordinate(run_id, completion, keep)
        except (DBAPIError, PoolTimeout):
            raise  # transient: the task is retried, or the sweep re-drives the run
        except Exception as exc:  # a bug must end the run visibly, not loop in the sweep
            log.exception("coordinating run %s failed", run_id)
            return self._fail(run_id, exc), None

    def _coordinate(
        self, run_id: str, completion: Completion | None, keep: bool
    ) -> tuple[str, Kept | None]:
        """One pass (runners/durable/passes.py)."""
        return Pass(self, run_id, completion, keep).carry_out()

    def _fail(self, run_id: str, exc: Exception) -> str:
        message, error_type = f"internal error: {exc}", type(exc).__name__
        sealed = isinstance(exc, EncryptionError)  # its payloads cannot be read here
        with self.store.begin() as conn:
            get = run_rows.get_run_unsealed if sealed else run_rows.get_run
            row = get(conn, run_id)
            finished = run_rows.finish_run(
                conn, run_id, "failed", error=message, error_type=error_type, run=row
            )
        if finished and row is not None:
            observe.run_finished(None, row, "failed")
            stream = RunStream(self.streams, row.root_run_id, run_id)
            stream.emit("error", error=message, error_type=error_type)
            stream.end()
        return f"failed: {message}"

    # --- step tasks --------------------------------------------------------------------

    def execute_step(self, run_id: str, step: str, *, task: str, retries: int = 0) -> str:
        """Carry out one remote step, then write its result and re-drive the run at once;
        the step that pass schedules runs next in this task (see `_chain`).

        `task` is the Celery task that delivered it: a step task acts only on a remote
        step in flight whose intent is of its kind, so a forged or stray task changes
        nothing and counts no attempt. `retries` is how often the step was deliberately
        retried (Celery's count). A model error the waterfall wants retried raises
        `RetryLater`: the task adapter hands it to Celery's retry countdown, so no
        worker sleeps.
        """
        with working_on(self.liveness, run_id):
            outcome, kept = self._step(run_id, step, task=task, retries=retries, keep=self._eager)
            if kept is not None:
                self._chain(run_id, kept)
        return outcome

    def _chain(self, run_id: str, kept: Kept) -> None:
        """Run the steps passes keep back, one after another, in this task: the next step
        runs where the last one ended, with no broker round trip.

        The pass that keeps a step writes its row claimed by this process (`claim`): its
        first attempt, leased in the row itself, which the heartbeat extends while it
        runs. A delivery of the step meanwhile leaves it alone; if this process dies, the
        message of the task that began the chain comes back and sends the steps whose
        claimant is gone (`_adopt_orphans`), or the sweep sends them once the claim
        lapses. A pass keeps no step after `eager_budget` seconds or `eager_max_steps`
        steps of a chain (the task's time limit allows one more step after the budget),
        and any failure on the way gives the step back and sends it.
        """
        settings = self.settings
        deadline = time.monotonic() + settings.eager_budget
        for ran in itertools.count(1):
            task, step = kept.send
            more = ran < settings.eager_max_steps and time.monotonic() < deadline
            task_id = str(uuid.uuid4())  # the step's own, as if it had been delivered
            try:
                with (
                    log_context(task=task, task_id=task_id, run_id=run_id, step=step),
                    self.eager_events(task, task_id, run_id, step, kept.tool) as report,
                ):
                    started = time.monotonic()
                    outcome, following = self._step(
                        run_id, step, task=task, retries=0, keep=more, kept=kept
                    )
                    report(outcome)
                    log.info(
                        "Step %s of run %s ran where the last one ended, in %.3fs: %s",
                        step,
                        run_id,
                        time.monotonic() - started,
                        outcome,
                    )
            except RetryLater as later:  # the waterfall wants the model asked again later
                self.dispatcher.steps(run_id, [kept.send], countdown=later.delay)
                return
            except Exception:
                log.warning("step %s of run %s goes to the broker", step, run_id, exc_info=True)
                if give_back(self.store, run_id, kept):  # not if it is no longer this process's
                    self.dispatcher.steps(run_id, [kept.send])
                return
            if following is None:
                return
            kept = following

    def _step(
        self,
        run_id: str,
        step: str,
        *,
        task: str,
        retries: int,
        keep: bool,
        kept: Kept | None = None,
    ) -> tuple[str, Kept | None]:
        """One step, by a delivered task or (`kept` by the pass before) in a chain
        (runners/durable/delivery.py)."""
        delivery = Delivery(self, run_id, step, task=task, retries=retries, kept=kept)
        return delivery.carry_out(keep)

    def _adopt_orphans(self, run_id: str) -> None:
        recovery.adopt_orphans(self.store, self.leases, self.dispatcher, run_id)

    def _run_step(
        self,
        row: JournalRowWithRun,
        step: str,
        holder: Holder,
        attempt: int,
        retries: int,
        *,
        claimed: bool,
    ) -> Completion:
        run_id = row.run_id
        stream = RunStream(self.streams, row.root_run_id, run_id)
        # Tag the step's frames, so a reader can tell attempts apart even if they overlap.
        stream.extra = {"step": step, "attempt": attempt}
        if attempt > 1:
            # A reader drops what an earlier, failed attempt of this step streamed.
            stream.emit("status", status="retrying", step=step, attempt=attempt)
        env = StepEnv(app=self.app, stream=stream, limits=self.limits)
        intent = parse_intent(row.intent)
        started = utcnow()
        running = Running(run_id, step, sent_as(intent), holder, claimed, row.fence)
        lease = self.settings.step_lease
        with (
            heartbeat(self.leases, self.store, lease, running, attempt, started) as beat,
            RUNNING.track(running, beat),
        ):
            try:
                result = dump(execute_remote(intent, env, step))
            except ModelError as failure:
                return model_failed(
                    self.app, self.settings, row, step, failure, attempt, retries, started
                )
            except Exception as exc:
                log.info("step %s of run %s failed: %s", step, run_id, exc)
                message = (
                    str(exc) if isinstance(exc, AgentJobsError) else f"{type(exc).__name__}: {exc}"
                )
                return Completion(
                    step, "failed", error=message, attempt=attempt, started_at=started
                )
        events: tuple[event_rows.PendingEvent, ...] = ()
        if isinstance(intent, ModelTurn):
            request = {"step": step, "attempt": attempt, "outcome": "ok"}
            events = ((row.thread_id, run_id, "agent/request", request),)
        return Completion(
            step, "done", result=result, attempt=attempt, started_at=started, events=events
        )

    # --- recovery ----------------------------------------------------------------------

    def wake_sleepers(self) -> int:
        """Beat's timers tick: send a pass, due at its time, to each sleeping run whose
        time comes before the next tick (runners/durable/sleepers.py); returns how many."""
        ahead = self.settings.timer_interval * 1.2  # a tick a little late finds them still
        return sleepers.wake_due(self.store, self.dispatcher, ahead)

    def sweep(self) -> int:
        """Decide the approvals past their deadline, re-drive the runs that made no
        progress for a while (runners/durable/recovery.py); returns how many runs it re-drove."""
        return recovery.sweep(self)
