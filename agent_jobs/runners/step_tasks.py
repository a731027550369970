"""What a step task is made of, apart from the runner: the step's outcome as the pass it
wakes writes it, when a delivery must leave a row alone, the heartbeat of a running step,
and how a step run in a chain is reported."""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Literal

import redis
from sqlalchemy import Connection

from .. import observe
from ..app import AgentApp
from ..dispatch import own_queue, tool_of
from ..errors import Deferred, ModelError, RetryLater
from ..executor import StepEnv
from ..leases import Holder, Leases
from ..settings import Settings
from ..steps import parse_intent
from ..store import RunView, Store, outcomes
from ..store import events as event_rows
from ..store import journal as journal_rows
from ..store import runs as run_rows
from ..store.db import utcnow
from .replay import DurableHooks, task_for
from .turn import ask_waterfall

log = logging.getLogger(__name__)

IN_FLIGHT = frozenset({"scheduled", "started"})


@dataclass(frozen=True)
class Kept:
    """A step a pass kept back to run at once, with its row as the pass wrote it: the
    pass held the run's lock and nothing else knows of the step yet, so the task that
    runs it need not read the row again."""

    task: str
    step: str
    row: Any
    holder: Holder  # the claim the pass wrote on the row

    @property
    def send(self) -> tuple[str, str]:
        """The step as the broker takes it."""
        return self.task, self.step

    @property
    def tool(self) -> str | None:
        """The tool the step calls, if it calls one (Flower shows it)."""
        return tool_of(self.row.intent)


# (task, task id, run id, step, tool) -> a context that reports the step's outcome (a
# `StepOutcome` says whether the step failed), or the exception that ended it.
EagerEvents = Callable[
    [str, str, str, str, str | None], AbstractContextManager[Callable[[str], None]]
]


@contextmanager
def quiet_events(
    task: str, task_id: str, run_id: str, step: str, tool: str | None = None
) -> Iterator[Callable[[str], None]]:
    yield lambda outcome: None


class StepOutcome(str):
    """What a step task did with its step, as the runner says it (`model:1 done; waiting
    tool:call_1 tool:call_2`), with what the task reports: whether the step failed, and
    `summary`, the few words Flower shows. The runner's other answers (a delivery that
    left the row alone) are plain strings."""

    step: str
    state: Literal["done", "failed"]
    error: str | None
    run: str  # where the run stands after the pass the step's outcome woke

    def __new__(cls, completion: Completion, run: str) -> StepOutcome:
        self = super().__new__(cls, f"{completion.step} {completion.state}; {run}")
        self.step, self.state, self.error, self.run = (
            completion.step,
            completion.state,
            completion.error,
            run,
        )
        return self

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def summary(self) -> str:
        """`done → waiting tool:call_3, tool:call_4`, `failed: <why> → run failed`."""
        run = self.run.removeprefix(f"{self.step} recorded; ")  # a fan-out's member
        if self.state == "done":
            return f"done → {where(run)}"
        # The run fails with this step's error: said once.
        return (
            f"failed: {self.error} → {'run failed' if run.startswith('failed: ') else where(run)}"
        )


def where(outcome: str) -> str:
    """A pass's outcome as a task's result says it: the steps a run waits on listed
    (`waiting tool:call_3, tool:call_4`), anything else as it is."""
    if outcome.startswith("waiting ") and not outcome.startswith("waiting for "):
        return "waiting " + ", ".join(outcome.removeprefix("waiting ").split())
    return outcome


def summary(outcome: str) -> str:
    """What a step task's result says: a `StepOutcome`'s summary, or the runner's word."""
    return outcome.summary if isinstance(outcome, StepOutcome) else where(outcome)


def claim(run: RunView, hooks: DurableHooks, lease: float) -> Kept | None:
    """Keep the first remote step the pass schedules for this process to run at once:
    its row is written claimed (started, leased to this process), so the claim costs
    nothing beyond the pass's own insert; the other steps are sent."""
    # A step with a queue of its own (a CPU-bound tool's) is always sent there.
    mine = [i for i, (task, _) in enumerate(hooks.to_dispatch) if own_queue(task)[1] is None]
    if not mine:
        return None
    task, step = hooks.to_dispatch.pop(mine[0])
    [written] = [r for r in hooks.new_rows if r["step"] == step]
    holder = Holder.me()
    journal_rows.claim(written, str(holder), lease)
    # The row as a step task reads it (`journal.get_with_run`), its intent whole.
    snapshot = SimpleNamespace(
        **{**written, "intent": hooks.whole_intent(step)},
        run_status="running",
        root_run_id=run.root_run_id,
        thread_id=run.thread_id,
    )
    return Kept(task, step, snapshot, holder)


def on_own_queue(row: Any) -> bool:
    """Whether the step went to a queue of its own (a tool's): the step after it is
    sent, not run on that queue's worker."""
    return isinstance(row.intent, dict) and bool(row.intent.get("queue"))


def refusal(row: Any, step: str, task: str) -> str | None:
    """Why a delivered step task must leave this journal row alone, or None to run it."""
    if row is None:
        return f"unknown step {step}"
    if row.run_status in run_rows.TERMINAL:
        return f"run already {row.run_status}"
    if row.run_status == "paused":  # no step runs while it is; a resume sends it again
        return "run paused"
    if row.state in ("done", "failed"):
        return f"{step} already {row.state}"
    if row.state not in IN_FLIGHT:
        return f"{step} is {row.state}, not a remote step"
    try:
        kind = task_for(parse_intent(row.intent))
    except (TypeError, ValueError):
        return f"{step} is not a remote step"
    if kind != task:
        return f"{step} is carried out by {kind}, not {task}"
    if _claimed(row):
        return f"{step} already running"  # in the chain of the task that kept it
    return None


@dataclass(frozen=True)
class Completion:
    """A remote step's outcome, written under the run's lock by the pass it wakes."""

    step: str
    state: Literal["done", "failed"]
    result: Any = None
    error: str | None = None
    attempt: int | None = None
    started_at: datetime | None = None
    events: tuple[event_rows.PendingEvent, ...] = ()
    # When the step's work ended (the outcome is made then), and whether the step was
    # given up after too many attempts: for its metrics and its span.
    finished_at: datetime = field(default_factory=utcnow)
    dead_letter: bool = False
    # The non-idempotent action's call whose handler this step ran: its outcome is known
    # once this is written (runners/reconcile.py).
    call_id: str | None = None

    def into(self, env: StepEnv, run: RunView, conn: Connection) -> None:
        """Hand what the pass writing this outcome reports to its `env`: the step's
        events, and its metrics and span once the pass has committed."""
        env.events.extend(self.events)
        observe.completed(env, run, self)
        if self.call_id is not None:
            outcomes.clear_handler(conn, run.run_id, self.call_id)

    def reported(self, run: str) -> StepOutcome:
        """The step's outcome as its task reports it, the run standing at `run`."""
        return StepOutcome(self, run)

    @property
    def outcome(self) -> dict[str, Any]:
        """The journal's `complete` arguments, after the run and the step."""
        return {
            "state": self.state,
            "result": self.result,
            "error": self.error,
            "attempts": self.attempt,
            "started_at": self.started_at,
        }


def dead_letter(step: str, attempt: int) -> Completion:
    """The step is given up on: delivered `attempt` times, it never finished (it kept
    failing, or killing its worker); the run fails with it."""
    return Completion(
        step,
        "failed",
        error=f"gave up after {attempt - 1} attempts: the step kept failing or killing its worker",
        attempt=attempt - 1,
        dead_letter=True,
    )


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
        if not claimed:
            try:
                if not leases.refresh(run_id, step, holder, lease):
                    return False  # another delivery holds it now
            except redis.RedisError as exc:
                log.warning("could not renew the lease of %s/%s: %s", run_id, step, exc)
        # Postgres too: while Redis is away, this keeps the sweep off the step.
        try:
            with store.begin() as conn:
                journal_rows.mark_started(
                    conn,
                    run_id,
                    step,
                    attempt=attempt,
                    started_at=started,
                    lease=lease,
                    holder=str(holder) if claimed else None,
                )
        except Exception as exc:  # the step goes on; the sweep is the backstop
            log.warning("heartbeat of %s/%s failed: %s", run_id, step, exc)
        return True

    key = BEATS.add(min(lease / 3, 1.0), keep)
    try:
        yield key
    finally:
        BEATS.remove(key)


def _claimed(row: Any) -> bool:
    """Whether the step's row is claimed by a process that may still be running it (the
    pass that scheduled it claimed it, and the claim has neither lapsed nor lost its
    holder)."""
    if row.holder is None or row.lease_until is None or row.lease_until <= utcnow():
        return False
    holder = Holder.parse(row.holder)
    return holder is None or not holder.gone()


def hold_back(
    store: Store, later: RetryLater, lease: float, run_id: str, step: str, kept: Kept | None
) -> None:
    """The step goes back to the broker for `later.delay` seconds: recovery and the sweep
    leave it alone until then (`journal.not_before`), with the event saying why. A step
    deferred for capacity made no attempt: the claim of a step a pass `kept`, which
    counted one, is given back first."""
    with store.begin() as conn:
        if kept is not None and isinstance(later, Deferred):
            journal_rows.unclaim(conn, run_id, step, str(kept.holder))
        not_before = utcnow() + timedelta(seconds=later.delay)
        journal_rows.hold(conn, run_id, step, not_before=not_before, lease=lease)
        if later.event is not None:
            event_rows.append(conn, [later.event])


def model_failed(
    app: AgentApp,
    settings: Settings,
    row: Any,
    step: str,
    error: ModelError,
    attempt: int,
    retries: int,
    started: datetime,
) -> Completion:
    """A model step's call failed: ask the request-error waterfall whether to retry it
    later (raises `RetryLater`) or fail the step for good."""
    action, event = ask_waterfall(
        app,
        settings,
        error,
        run_id=row.run_id,
        thread_id=row.thread_id,
        step=step,
        retry_count=retries,
        attempt=attempt,
    )
    log.info("model step %s of run %s: %s", step, row.run_id, action.reason)
    if action.kind == "retry":
        raise RetryLater(action.delay, event)
    return Completion(
        step, "failed", error=action.reason, attempt=attempt, started_at=started, events=(event,)
    )
