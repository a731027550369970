"""The app of the outcome-unknown tests (workers load it with
AGENT_JOBS_APP=tests.support.apps.reconcile:app): actions that count each start of their handler in
the side table of tests/apps.py, then block until the test opens the run's gate (a file
`$TEST_GATE_DIR/<run_id>`), so a test can kill the worker in the middle of one."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agent_jobs import AgentApp
from agent_jobs.tools import ReconcileContext, ToolContext
from tests.support.apps import CountingModel, executed, record

app = AgentApp(
    roles={
        "user-7": ["support"],
        "alice": ["lead"],
        "carol": ["lead"],
        "backend": ["service"],
        "eve": [],
    }
)


def _held(ctx: ToolContext, what: str, *, stubborn: bool = False) -> None:
    """Count the start (with the process that runs it), then wait for the run's gate;
    `stubborn`: through its soft time limit too."""
    from celery.exceptions import SoftTimeLimitExceeded

    record(ctx.run_id, f"{what}:start:{os.getpid()}", ctx.idempotency_key)
    gate = Path(os.environ["TEST_GATE_DIR"]) / ctx.run_id
    deadline = time.monotonic() + 60
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never opened {gate}")
        try:
            time.sleep(0.02)
        except SoftTimeLimitExceeded:
            if not stubborn:
                raise
            record(ctx.run_id, f"{what}:soft", ctx.idempotency_key)
    record(ctx.run_id, what, ctx.idempotency_key)


@app.tool(kind="action", approvers=["lead"])
def pay(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Pay an order out: not idempotent (an action's default)."""
    _held(ctx, "pay")
    return {"paid": order_id}


@app.tool(kind="action", approvers=["lead"], idempotent=True)
def pay_again(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Pay an order out, de-duplicated by the provider: safe to run again."""
    _held(ctx, "pay_again")
    return {"paid": order_id}


@app.tool(kind="action", approvers=["lead"])
def pay_slowly(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Pay an order out, past its soft time limit: not idempotent."""
    _held(ctx, "pay_slowly", stubborn=True)
    return {"paid": order_id}


@app.tool(kind="action", approvers=["lead"])
def pay_asking(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Pay an order out from the account the person names: not idempotent, and its
    handler runs twice (asking, then with the answer)."""
    record(ctx.run_id, f"pay_asking:start:{os.getpid()}", ctx.idempotency_key)
    if ctx.answers is None:
        ctx.ask(["From which account?"])
    return {"paid": order_id, "from": ctx.answers["q1"]}


def find_charge(ctx: ReconcileContext) -> dict[str, Any] | None:
    """Look the charge up by the call's idempotency key, as a payment provider lets one."""
    keys = [key for what, key in executed(ctx.run_id) if what.startswith("charge:start:")]
    if ctx.idempotency_key not in keys:
        return None
    return {"charged": ctx.args["order_id"], "found_by": ctx.idempotency_key}


@app.tool(kind="action", approvers=["lead"], reconcile=find_charge)
def charge(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Charge an order: not idempotent, but it can be looked up."""
    _held(ctx, "charge")
    return {"charged": order_id}


for _agent, _tool in (
    ("payer", "pay"),
    ("payer_again", "pay_again"),
    ("charger", "charge"),
    ("slow_payer", "pay_slowly"),
    ("asking_payer", "pay_asking"),
):
    app.agent(
        _agent,
        model=CountingModel(
            [{"tool_calls": [{"name": _tool, "args": {"order_id": "A1"}}]}, {"text": "all done"}]
        ),
        tools=[_tool],
    )
