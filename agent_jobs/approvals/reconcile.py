"""A person's word on a call whose outcome is unknown (docs/humans.md, "Outcome unknown: no blind
retry"): it succeeded (this is its result), it failed (the model is told why), or run it
again.

A non-idempotent action whose worker died while its handler ran is not run again: its
`tool:<call_id>` journal row waits (`waiting`) and the run is `awaiting_reconcile`
(runners/durable/reconcile.py). The decision is checked and recorded here, in the caller's
transaction under the run's lock: the first decision wins, and anything refused changes
nothing. Then the caller wakes the run (and, for `retry`, sends the step again).

Who may decide: an actor holding one of the tool's approver roles (anyone, for a tool
that names none, as for approvals), or the role `service`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection

from ..app import AgentApp
from ..checkpoints import ToolOutcome
from ..dispatch import INVOKE_TOOL
from ..errors import (
    InvalidRequestError,
    NotAReconcilerError,
    ReconcileRefusedError,
)
from ..store import outcomes, runs
from ..store.db import contains_nul, utcnow
from ..tools import OPERATOR_ROLE, SERVICE_ROLE
from .record import locked_call

Outcome = Literal["succeeded", "failed", "retry"]
OUTCOMES: tuple[Outcome, ...] = ("succeeded", "failed", "retry")
MAX_ERROR = 10_000  # characters of a `failed` message (the model reads it)


@dataclass(frozen=True)
class Reconciliation:
    """How a call whose outcome is unknown ended, as `actor` says: `result` is the call's
    result when it `succeeded`; `error` what the model is told when it `failed`; `retry`
    runs its handler again."""

    outcome: Outcome
    actor: str
    result: Any = None
    error: str | None = None

    def __post_init__(self) -> None:
        """A malformed decision is refused (`InvalidRequestError`) before anything is read."""
        if self.outcome not in OUTCOMES:
            raise InvalidRequestError(
                f"invalid reconciliation: outcome must be one of {', '.join(OUTCOMES)}, "
                f"not {self.outcome!r}"
            )
        if not isinstance(self.actor, str) or not self.actor.strip():
            raise InvalidRequestError("invalid reconciliation: an actor is needed")
        if self.outcome == "failed":
            if not isinstance(self.error, str) or not self.error.strip():
                raise InvalidRequestError(
                    "invalid reconciliation: a failed call needs the error the model is told"
                )
            if len(self.error) > MAX_ERROR:
                raise InvalidRequestError(
                    f"invalid reconciliation: the error is over {MAX_ERROR} characters"
                )
        elif self.error is not None:
            raise InvalidRequestError(
                f"invalid reconciliation: an error goes with `failed`, not `{self.outcome}`"
            )
        if self.outcome != "succeeded" and self.result is not None:
            raise InvalidRequestError(
                f"invalid reconciliation: a result goes with `succeeded`, not `{self.outcome}`"
            )
        try:
            json.dumps(self.result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(
                f"invalid reconciliation: the result must be JSON: {exc}"
            ) from None
        if contains_nul([self.actor, self.error, self.result]):
            raise InvalidRequestError("invalid reconciliation: NUL characters are not allowed")

    def outcome_of_call(self) -> dict[str, Any]:
        """The tool step's result, as the loop reads it (a `ToolOutcome`), and who said so."""
        if self.outcome == "succeeded":
            told = ToolOutcome(ok=True, result=self.result)
        else:
            told = ToolOutcome(ok=False, error=self.error)
        said = {"outcome": self.outcome, "by": self.actor, "at": utcnow().isoformat()}
        return told.model_dump(mode="json") | {"reconciled": said}


@dataclass(frozen=True)
class Recorded:
    """A decision recorded: the step it settled, and the step to send again (`retry`) as
    the broker takes it (task name, step)."""

    step: str
    resend: tuple[str, str] | None = None


def may_reconcile(app: AgentApp, tool: str, actor: str) -> bool:
    """Whether `actor` may say how a call of `tool` ended: a `service` or `operator` actor,
    or one whose decision on the call would count (a tool the app no longer defines names
    no one)."""
    if app.roles.roles_of(actor) & {SERVICE_ROLE, OPERATOR_ROLE}:
        return True
    return tool not in app.registry or app.roles.may_approve(app.registry.get(tool), actor)


def record_reconciliation(
    conn: Connection, app: AgentApp, run_id: str, call_id: str, decision: Reconciliation
) -> Recorded:
    """Check and record `decision` in the caller's transaction.

    Raises `UnknownRunError`, `UnknownCallError`, `NotAReconcilerError` (the actor may
    not decide), or `ReconcileRefusedError` (the run has ended, the call is not waiting
    for a decision: never began, its outcome is known, or another decision came first);
    nothing is written then.
    """
    # The run's lock: a pass that parks or resumes the run goes before or after, never
    # between the checks and the write.
    run, call = locked_call(conn, run_id, call_id)
    if not may_reconcile(app, call.name, decision.actor):
        tool = app.registry.get(call.name)
        roles = ", ".join(sorted({*(tool.approvers or ()), SERVICE_ROLE, OPERATOR_ROLE}))
        raise NotAReconcilerError(
            f"actor {decision.actor!r} may not say how call {call_id} ({call.name}) ended: "
            f"it needs one of the roles {roles}"
        )
    if run.status in runs.TERMINAL:
        raise ReconcileRefusedError(
            f"run {run_id} has ended ({run.status}): call {call_id} can no longer be reconciled"
        )
    waiting = outcomes.waiting_step(conn, run_id, call_id)
    if waiting is None:
        raise ReconcileRefusedError(
            f"call {call_id} of run {run_id} is not awaiting reconciliation: its outcome is "
            "known (or was decided already), or its handler never began"
        )
    step = waiting.step
    if decision.outcome == "retry":
        settled = outcomes.reschedule(conn, run_id, step)
    else:
        settled = outcomes.settle(conn, run_id, step, decision.outcome_of_call())
    if not settled:
        raise ReconcileRefusedError(f"call {call_id} of run {run_id} was reconciled already")
    outcomes.forget_handler(conn, run_id, call_id)
    if decision.outcome != "retry":
        return Recorded(step)
    queue = waiting.intent.get("queue") if isinstance(waiting.intent, dict) else None
    return Recorded(step, (f"{INVOKE_TOOL}@{queue}" if queue else INVOKE_TOOL, step))
