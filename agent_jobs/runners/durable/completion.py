"""A remote step's completion: its outcome as a step task hands it to the pass it wakes,
which writes it under the run's lock (done, failed, given up on after too many
attempts, or failed by the model's request-error waterfall)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection

from ...app import AgentApp
from ...errors import ModelError, RetryLater
from ...executor import StepEnv
from ...observability import observe
from ...settings import Settings
from ...store import RunView, outcomes
from ...store import events as event_rows
from ...store.db import utcnow
from ...store.journal import JournalRowWithRun
from ..turn import ask_waterfall
from .report import StepOutcome

log = logging.getLogger(__name__)


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
    # The GenAI semantic conventions for the step's span (observability/genai.py): worked
    # out where the step ran, reported by the pass that commits it.
    genai: dict[str, str | int | float] = field(default_factory=dict)

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


def model_failed(
    app: AgentApp,
    settings: Settings,
    row: JournalRowWithRun,
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
