"""What a step task is made of, apart from the runner: the step's outcome as the pass it
wakes writes it, when a delivery must leave a row alone (or, come late, must call
nothing), and how a step run in a chain is reported. The heartbeat of a running step is
in runners/durable/running.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Literal

from sqlalchemy import Connection

from ... import observe
from ...app import AgentApp
from ...dispatch import own_queue, tool_of
from ...errors import Deferred, ModelError, RetryLater
from ...executor import StepEnv
from ...leases import Holder
from ...settings import Settings
from ...steps import parse_intent
from ...store import RunView, Store, outcomes
from ...store import events as event_rows
from ...store import holds as hold_rows
from ...store import journal as journal_rows
from ...store import runs as run_rows
from ...store.db import utcnow
from ..turn import ask_waterfall
from .liveness import QUICK_SHARE
from .replay import DurableHooks, task_for

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
    hold_rows.claim(written, str(holder), lease)
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
    # once this is written (runners/durable/reconcile.py).
    call_id: str | None = None
    # The step's epoch as the delivery that ran it read it: the outcome is written only
    # while it is still that one (journal.fence; None: whatever it is).
    fence: int | None = None

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
            "fence": self.fence,
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


def _claimed(row: Any) -> bool:
    """Whether the step's row is claimed by a process that may still be running it (the
    pass that scheduled it claimed it, and the claim has neither lapsed nor lost its
    holder)."""
    if row.holder is None or row.lease_until is None or row.lease_until <= utcnow():
        return False
    holder = Holder.parse(row.holder)
    return holder is None or not holder.gone()


def late_delivery(
    store: Store, settings: Settings, run_id: str, step: str, fence: int | None, taken: float
) -> str | None:
    """Why a delivery that took long to get here since it took the step's lease at
    `taken` (its row read, its attempt counted: calls that may have hung through a
    network cut and come back with what was true before it) must not call anything after
    all: the step finished meanwhile, or was let go of and sent again (its epoch moved on
    from `fence`). None to go on. A quick delivery needs no second look: nobody takes a
    step from a process that beats."""
    if time.monotonic() - taken < settings.process_timeout * QUICK_SHARE:
        return None
    with store.connect() as conn:
        row = journal_rows.get(conn, run_id, step)
    if row is None or row.state not in IN_FLIGHT:
        state = "gone" if row is None else row.state
        log.warning("step %s of run %s was delivered late: already %s", step, run_id, state)
        return f"{step} already {state}"
    if fence is not None and row.fence != fence:
        log.warning("step %s of run %s was delivered late: sent again since", step, run_id)
        return f"{step} sent again since this delivery took it"
    return None


def give_back(store: Store, run_id: str, kept: Kept) -> bool:
    """Give a kept step back to the broker; False when its claim is no longer this
    process's (recovery let go of it and sent the step again)."""
    try:
        with store.begin() as conn:
            return hold_rows.unclaim(conn, run_id, kept.step, str(kept.holder))
    except Exception as exc:  # the claim lapses; then the sweep sends the step
        log.warning("could not give back %s of run %s: %s", kept.step, run_id, exc)
        return True


def hold_back(
    store: Store,
    later: RetryLater,
    lease: float,
    run_id: str,
    step: str,
    kept: Kept | None,
    fence: int | None = None,
) -> bool:
    """The step goes back to the broker for `later.delay` seconds: recovery and the sweep
    leave it alone until then (`journal.not_before`), with the event saying why. A step
    deferred for capacity made no attempt: the claim of a step a pass `kept`, which
    counted one, is given back first. False, and nothing written, when the step is no
    longer this delivery's (its epoch moved on from `fence`): it must not be sent again."""
    try:
        with store.begin() as conn:
            if kept is not None and isinstance(later, Deferred):
                hold_rows.unclaim(conn, run_id, step, str(kept.holder))
            not_before = utcnow() + timedelta(seconds=later.delay)
            if not hold_rows.hold(
                conn, run_id, step, not_before=not_before, lease=lease, fence=fence
            ):
                raise _NotOurs  # rolls back what this transaction wrote
            if later.event is not None:
                event_rows.append(conn, [later.event])
    except _NotOurs:
        return False
    return True


class _NotOurs(Exception):
    """The step's epoch moved on: this delivery writes nothing."""


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
