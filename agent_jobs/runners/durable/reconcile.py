"""Outcome unknown, never a blind retry: a non-idempotent action on the durable path.

Before its handler runs, the step's worker marks on the call's row that it began, in a
transaction of its own (`store/outcomes.py`); the mark goes with the call's result. A
worker that dies in between leaves the mark and no result, whatever way the step then
comes back (a task message handed back, a dead worker's steps sent again, the sweep, a
hard time limit given up on). The delivery that finds it does not run the handler again:
it asks the tool's `reconcile(ctx)` for the result, and failing that parks the run,
`awaiting_reconcile`, its `tool:<call_id>` row `waiting` (so no recovery path sends it
again), until a person records how it ended (`agent_jobs/approvals/reconcile.py`).

The pass that finds the row waiting parks the run and streams the wait's frames
(`waits.outcome_unknown`); the pass that finds it settled says the run goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from ... import checkpoints as names
from ...app import AgentApp
from ...checkpoints import ToolOutcome
from ...executor import StepEnv
from ...hooks import StepCall
from ...leases import Leases
from ...steps import InvokeTool, parse_intent
from ...store import RunView, Store, outcomes
from ...store.journal import JournalRow, ReplayRow
from ...store.runs import RunStatus
from ...tools import ReconcileContext, Tool
from .. import waits

log = logging.getLogger(__name__)

STATUS = "awaiting_reconcile"


@dataclass(frozen=True)
class Guarded:
    """A tool step that calls a non-idempotent action: its handler runs at most once
    unless a person says otherwise."""

    run_id: str
    step: str
    tool: Tool
    intent: InvokeTool

    @property
    def call_id(self) -> str:
        return self.intent.call.id


class HandlerBegan(Exception):
    """The call's handler began on an earlier delivery that recorded no result."""


def guarded(app: AgentApp, row: JournalRow) -> Guarded | None:
    """The step of `row` (a journal row, its intent as journaled) if it runs a
    non-idempotent action's handler; None for any other step."""
    journaled = row.intent
    if not (isinstance(journaled, dict) and journaled.get("type") == "invoke_tool"):
        return None
    call = journaled.get("call")
    name = call.get("name") if isinstance(call, dict) else None
    if not isinstance(name, str) or name not in app.registry:
        return None
    tool = app.registry.get(name)
    kind = journaled.get("kind") or tool.kind  # an MCP tool's, as the run's list gave it
    if kind != "action" or tool.idempotent:
        return None  # decided before the intent is parsed: most steps are not guarded
    intent = parse_intent(journaled)
    if not isinstance(intent, InvokeTool):
        return None
    return Guarded(row.run_id, row.step, tool, intent)


def begin(store: Store, guard: Guarded | None) -> None:
    """Mark the handler as begun, committed before it runs; `HandlerBegan` if an earlier
    delivery had begun it (its outcome is unknown)."""
    if guard is None:
        return
    with store.begin() as conn:
        began_now = outcomes.begin_handler(conn, guard.run_id, guard.call_id)
    if not began_now:
        raise HandlerBegan(guard.step)


def check(store: Store, guard: Guarded | None) -> None:
    """`HandlerBegan` if the handler began on an earlier delivery: a step given up on
    after too many deliveries fails the run, unless its outcome is unknown."""
    if guard is None:
        return
    with store.connect() as conn:
        started = outcomes.handler_started(conn, guard.run_id, guard.call_id)
    if started is not None:
        raise HandlerBegan(guard.step)


def settle(store: Store, leases: Leases, guard: Guarded) -> Any | None:
    """The handler began and nobody knows how it ended: the call's result as the tool's
    `reconcile` finds it (a `ToolOutcome`, JSON), to be recorded as the step's; else
    None, and the step waits for a person."""
    found = ask(guard)
    if found is not None:
        log.info("run %s: %s found by %s's reconcile", guard.run_id, guard.step, guard.tool.name)
        outcome = ToolOutcome(ok=True, result=found).model_dump(mode="json")
        return outcome | {"reconciled": {"outcome": "succeeded", "by": "reconcile"}}
    with store.begin() as conn:
        parked = outcomes.park(conn, guard.run_id, guard.step)
    if parked:
        log.warning(
            "run %s: %s (%s) began on a worker that died; its outcome is unknown, so it waits "
            "for `agent-jobs reconcile`",
            guard.run_id,
            guard.step,
            guard.tool.name,
        )
        try:  # a person's `retry` is counted afresh, whatever this step went through
            leases.reset_attempts(guard.run_id, guard.step)
        except redis.RedisError as exc:
            log.warning("could not reset the attempts of %s/%s: %s", guard.run_id, guard.step, exc)
    return None


def ask(guard: Guarded) -> Any | None:
    """The tool's `reconcile` asked; its failure is logged and leaves it to a person."""
    if guard.tool.reconciler is None:
        return None
    intent = guard.intent
    ctx = ReconcileContext(
        run_id=guard.run_id,
        step=guard.step,
        call_id=guard.call_id,
        actor=intent.actor,
        idempotency_key=f"{guard.run_id}:{guard.step}",
        answers=intent.answers,
        tool=intent.call.name,
        args=dict(intent.call.args),
    )
    try:
        return guard.tool.reconciled(ctx)
    except Exception:
        log.exception("run %s: %s's reconcile failed; a person decides", guard.run_id, guard.step)
        return None


# --- the pass ----------------------------------------------------------------------------


def waiting_on(run: RunView, env: StepEnv, call: StepCall, row: ReplayRow) -> tuple[str, RunStatus]:
    """What a pass that stops at a remote step not yet done waits on, and the run's status
    meanwhile: the step in flight; or, its row `waiting`, a person's word on the call's
    outcome (its frames streamed by the pass that parks the run on it)."""
    wait = _described(run, call) if row.state == "waiting" else None
    if wait is None:
        return call.name, "running"
    if run.status != wait.status or run.waiting_on != wait.label:
        for kind, fields in wait.frames:
            env.emit_after_commit(kind, **fields)
    return wait.label, wait.status


def settled(run: RunView, call: StepCall) -> waits.HumanWait | None:
    """The wait the run was parked on, if it was this step's outcome (now recorded)."""
    wait = _described(run, call)
    return wait if wait is not None and run.waiting_on == wait.label else None


def _described(run: RunView, call: StepCall) -> waits.HumanWait | None:
    parsed = names.parse(call.name)
    if parsed is None or parsed.kind != "tool":
        return None
    intent = call.intent
    if not isinstance(intent, InvokeTool):
        return None
    return waits.outcome_unknown(run.run_id, call.name, intent.call)
